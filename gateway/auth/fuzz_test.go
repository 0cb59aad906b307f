package auth_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/prism-mesh/prism/gateway/auth"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/testkit/authtest"
)

func fuzzAuthenticator(f *testing.F, k *authtest.Key) *auth.Authenticator {
	path := filepath.Join(f.TempDir(), "jwks.json")
	authtest.WriteJWKS(f, path, k)
	a, err := auth.New(auth.Config{JWKSFile: path, Issuer: issuer, Audience: audience, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	return a
}

// FuzzVerifyToken: whatever arrives as a bearer token is refused as an
// invalid token (never a panic, never another kind of refusal), unless it
// is one the key really signed.
func FuzzVerifyToken(f *testing.F) {
	k := authtest.NewKey(f, "k", jose.ES256)
	a := fuzzAuthenticator(f, k)
	good := k.Sign(f, authtest.Claims(issuer, audience, "demo"))
	for _, seed := range []string{
		good, good + "x", good[:len(good)/2], "", ".", "..", "a.b.c", "a.b.c.d.e",
		unsigned(authtest.Claims(issuer, audience, "*")),
		authtest.Sign(f, jose.SigningKey{Algorithm: jose.HS256, Key: k.PublicPEM(f)}, "k", authtest.Claims(issuer, audience, "*")),
		`{"payload":"e30","signatures":[]}`,
		"eyJhbGciOiJFUzI1NiIsImtpZCI6ImsifQ.e30.",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		p, err := a.Verify(context.Background(), token)
		if err == nil {
			if token != good {
				t.Fatalf("accepted a token the key did not sign: %q -> %+v", token, p)
			}
			return
		}
		var e *mesh.AuthError
		if !errors.As(err, &e) || e.Kind != mesh.InvalidToken {
			t.Fatalf("Verify(%q) = %v, want an invalid_token refusal", token, err)
		}
	})
}

// FuzzClaims: any payload the key signs is accepted only when its claims
// say so: our issuer and audience, an exp not yet past, and the namespaces
// the principal reports are non-empty names taken from the claim.
func FuzzClaims(f *testing.F) {
	k := authtest.NewKey(f, "k", jose.ES256)
	a := fuzzAuthenticator(f, k)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.Private()}, (&jose.SignerOptions{}).WithHeader("kid", "k"))
	if err != nil {
		f.Fatal(err)
	}
	far := time.Now().Add(100 * 365 * 24 * time.Hour).Unix()
	for _, seed := range []string{
		`{"iss":"` + issuer + `","aud":"` + audience + `","exp":` + jsonInt(far) + `,"prism_namespaces":["demo","*"]}`,
		`{"iss":"` + issuer + `","aud":["x","` + audience + `"],"exp":` + jsonInt(far) + `,"prism_namespaces":"demo"}`,
		`{"iss":"` + issuer + `","aud":"` + audience + `","exp":` + jsonInt(far) + `,"prism_namespaces":[1,null]}`,
		`{"iss":"` + issuer + `","aud":"` + audience + `","exp":1e300}`,
		`{"iss":"` + issuer + `","aud":"` + audience + `","exp":-1}`,
		`{"iss":"` + issuer + `","aud":"` + audience + `","exp":"soon"}`,
		`{"iss":null,"aud":null,"exp":null}`,
		`[]`, `null`, `"x"`, `{}`, `{`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		jws, err := signer.Sign(payload)
		if err != nil {
			t.Skip(err)
		}
		tok, err := jws.CompactSerialize()
		if err != nil {
			t.Skip(err)
		}
		p, err := a.Verify(context.Background(), tok)
		if err != nil {
			var e *mesh.AuthError
			if !errors.As(err, &e) || e.Kind != mesh.InvalidToken {
				t.Fatalf("Verify = %v, want an invalid_token refusal", err)
			}
			return
		}
		var c struct {
			Iss string          `json:"iss"`
			Aud json.RawMessage `json:"aud"`
			Exp *float64        `json:"exp"`
			NS  json.RawMessage `json:"prism_namespaces"`
		}
		if err := json.Unmarshal(payload, &c); err != nil {
			t.Fatalf("accepted claims that are not an object: %q (%v)", payload, err)
		}
		var auds []string
		if json.Unmarshal(c.Aud, &auds) != nil {
			auds = []string{""}
			_ = json.Unmarshal(c.Aud, &auds[0])
		}
		if c.Iss != issuer || !slices.Contains(auds, audience) || c.Exp == nil || time.Unix(int64(*c.Exp), 0).Before(time.Now().Add(-time.Minute)) {
			t.Fatalf("accepted %s", payload)
		}
		for _, ns := range p.Namespaces() {
			if ns == "" || ns == mesh.AllNamespaces || !json.Valid(c.NS) || !containsString(c.NS, ns) {
				t.Fatalf("namespaces %q from claim %s", p.Namespaces(), c.NS)
			}
		}
	})
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// containsString reports whether raw, a string or a list of strings, holds s.
func containsString(raw json.RawMessage, s string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == s
	}
	var list []string
	return json.Unmarshal(raw, &list) == nil && slices.Contains(list, s)
}
