// Package authtest is an identity provider for tests: signing keys, the
// JWKS that publishes them, and tokens.
package authtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Key is a signing key of the identity provider.
type Key struct {
	ID   string
	Alg  jose.SignatureAlgorithm
	priv crypto.Signer
}

// NewKey makes a key for alg (RS256, ES256 or EdDSA) named id.
func NewKey(t testing.TB, id string, alg jose.SignatureAlgorithm) *Key {
	t.Helper()
	var (
		priv crypto.Signer
		err  error
	)
	switch alg {
	case jose.RS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.EdDSA:
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("authtest: no key for %s", alg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &Key{ID: id, Alg: alg, priv: priv}
}

// Public is the key as its JWKS entry.
func (k *Key) Public() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.ID, Algorithm: string(k.Alg), Use: "sig"}
}

// Private is the signing key.
func (k *Key) Private() crypto.Signer { return k.priv }

// PublicPEM is the public key as PEM, what the classic algorithm
// confusion attack uses as an HMAC secret.
func (k *Key) PublicPEM(t testing.TB) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// JWKS is the key set publishing keys.
func JWKS(t testing.TB, keys ...*Key) []byte {
	t.Helper()
	set := jose.JSONWebKeySet{}
	for _, k := range keys {
		set.Keys = append(set.Keys, k.Public())
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WriteJWKS replaces the file at path with the key set of keys, atomically
// (a rename), as a secret mount or a config management tool does.
func WriteJWKS(t testing.TB, path string, keys ...*Key) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".jwks-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write(JWKS(t, keys...)); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

// Claims are a token's claims: iss, aud, a namespaces claim and an exp an
// hour away; tests change or delete what they need.
func Claims(issuer, audience string, namespaces ...string) map[string]any {
	return map[string]any{
		"iss":              issuer,
		"aud":              audience,
		"sub":              "test-user",
		"exp":              time.Now().Add(time.Hour).Unix(),
		"iat":              time.Now().Unix(),
		"prism_namespaces": namespaces,
	}
}

// Sign makes a token of claims signed by k.
func (k *Key) Sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	return Sign(t, jose.SigningKey{Algorithm: k.Alg, Key: k.priv}, k.ID, claims)
}

// Sign makes a token of claims signed with key, naming kid ("" names none).
func Sign(t testing.TB, key jose.SigningKey, kid string, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	s, err := jose.NewSigner(key, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
