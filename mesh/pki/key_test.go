package pki_test

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// must returns a DER encoder's result, failing t on its error.
func must(t *testing.T) func([]byte, error) []byte {
	return func(der []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
}

// loadsAndServes issues p's certificate for key as proxy/name, writes keyPEM
// (key in the encoding under test) as its key file, and checks that pki.Load
// takes it, names the identity, and that a mutual TLS handshake with it as
// the server's key succeeds.
func loadsAndServes(t *testing.T, p *pkitest.PKI, name string, key crypto.Signer, keyPEM []byte) {
	t.Helper()
	f := p.Issue(pki.Request{Role: identity.Proxy, Name: name, Key: key})
	if err := os.WriteFile(f.Key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := pki.Load(f, nil)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, keyPEM)
	}
	if got := src.Identity(); got != pkitest.ID(identity.Proxy, name) {
		t.Fatalf("identity %v", got)
	}
	addr := serve(t, src.ServerConfig(pki.Any))
	got, err := dial(addr, p.Source(identity.Operator, "ops").ClientConfig(pki.Exactly(pkitest.ID(identity.Proxy, name))))
	if err != nil || got != "spiffe://prism.local/operator/ops\n" {
		t.Fatalf("handshake with the loaded key: %q, %v", got, err)
	}
}

// TestLoadKeyEncodingsGo: every key encoding a user's tooling writes, made
// with Go's own encoders, loads and serves mutual TLS.
func TestLoadKeyEncodingsGo(t *testing.T) {
	t.Parallel()
	der := must(t)
	p := pkitest.New(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	for _, tc := range []struct {
		name string
		key  crypto.Signer
		pem  []byte
	}{
		{"rsa-pkcs1", rsaKey, pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey))},
		{"rsa-pkcs8", rsaKey, pemOf("PRIVATE KEY", der(x509.MarshalPKCS8PrivateKey(rsaKey)))},
		{"ecdsa-p256-sec1", p256, pemOf("EC PRIVATE KEY", der(x509.MarshalECPrivateKey(p256)))},
		{"ecdsa-p256-pkcs8", p256, pemOf("PRIVATE KEY", der(x509.MarshalPKCS8PrivateKey(p256)))},
		{"ecdsa-p384-sec1", p384, pemOf("EC PRIVATE KEY", der(x509.MarshalECPrivateKey(p384)))},
		{"ed25519-pkcs8", ed, pemOf("PRIVATE KEY", der(x509.MarshalPKCS8PrivateKey(ed)))},
		// openssl ecparam -genkey writes the curve's parameters first.
		{"ecdsa-sec1-after-parameters", p256, append(pemOf("EC PARAMETERS", []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}),
			pemOf("EC PRIVATE KEY", der(x509.MarshalECPrivateKey(p256)))...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			loadsAndServes(t, p, tc.name, tc.key, tc.pem)
		})
	}
}

// TestLoadKeyEncodingsOpenSSL: keys as openssl writes them (genrsa
// -traditional and ecparam -genkey for PKCS#1 and SEC1, genpkey for PKCS#8)
// load and serve mutual TLS. The certificate is issued for the public key
// openssl itself derives, so a key mis-parsed would not match it.
func TestLoadKeyEncodingsOpenSSL(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not on PATH: the keys openssl writes are not tried (TestLoadKeyEncodingsGo covers the same encodings)")
	}
	p := pkitest.New(t)
	for _, tc := range []struct {
		name, header string
		args         []string
	}{
		{"rsa-pkcs1", "RSA PRIVATE KEY", []string{"genrsa", "-traditional", "2048"}},
		{"rsa-pkcs8", "PRIVATE KEY", []string{"genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"}},
		{"ecdsa-sec1", "EC PRIVATE KEY", []string{"ecparam", "-name", "prime256v1", "-genkey"}},
		{"ecdsa-pkcs8", "PRIVATE KEY", []string{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"}},
		{"ed25519-pkcs8", "PRIVATE KEY", []string{"genpkey", "-algorithm", "ed25519"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			keyPEM := openssl(t, nil, tc.args...)
			if !strings.Contains(string(keyPEM), "-----BEGIN "+tc.header+"-----") {
				t.Fatalf("openssl %v did not write %s:\n%s", tc.args, tc.header, keyPEM)
			}
			block, _ := pem.Decode(openssl(t, keyPEM, "pkey", "-pubout"))
			pub, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			key, err := pki.ParsePrivateKey(keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
				t.Fatal("the parsed key is not the one openssl made")
			}
			loadsAndServes(t, p, tc.name, key, keyPEM)
		})
	}
}

func openssl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl %v: %v: %s", args, err, stderr.String())
	}
	return out
}

// TestParsePrivateKeyRefusals: what cannot be a component's key is refused
// with an error naming what was found.
func TestParsePrivateKeyRefusals(t *testing.T) {
	t.Parallel()
	der := must(t)
	x, _ := ecdh.X25519().GenerateKey(rand.Reader)
	p := pkitest.New(t)
	cases := []struct {
		name string
		pem  []byte
		want string
	}{
		{"empty", nil, "no PEM block"},
		{"certificate only", p.CA.CertPEM(), "have CERTIFICATE"},
		{"openssh", pemOf("OPENSSH PRIVATE KEY", []byte("openssh-key-v1")), `"OPENSSH PRIVATE KEY" is not a supported encoding`},
		{"dsa", pemOf("DSA PRIVATE KEY", []byte{0x30, 0x00}), `"DSA PRIVATE KEY" is not a supported encoding`},
		{"encrypted pkcs8", pemOf("ENCRYPTED PRIVATE KEY", []byte{0x30, 0x00}), "encrypted PKCS#8"},
		{"legacy encrypted", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00"}, Bytes: []byte{1}}), "is encrypted"},
		{"x25519 cannot sign", pemOf("PRIVATE KEY", der(x509.MarshalPKCS8PrivateKey(x))), "cannot sign"},
		{"pkcs1 label on garbage", pemOf("RSA PRIVATE KEY", []byte("junk")), "PKCS#1"},
		{"sec1 label on garbage", pemOf("EC PRIVATE KEY", []byte("junk")), "SEC1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := pki.ParsePrivateKey(tc.pem)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want one saying %q", err, tc.want)
			}
		})
	}
	// pki.Load says which file it could not read.
	f := p.Files(identity.Proxy, "p1")
	if err := os.WriteFile(f.Key, pemOf("OPENSSH PRIVATE KEY", []byte("x")), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Load(f, nil); err == nil || !strings.Contains(err.Error(), f.Key) || !strings.Contains(err.Error(), "OPENSSH") {
		t.Fatalf("load: %v", err)
	}
}

// TestLoadCAKeyEncodings: a CA key in SEC1, as cert-manager writes a CA's
// key without an encoding set, loads; one of another certificate does not.
func TestLoadCAKeyEncodings(t *testing.T) {
	t.Parallel()
	der := must(t)
	ca, err := pki.NewCA(pkitest.TrustDomain, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	sec1 := pemOf("EC PRIVATE KEY", der(x509.MarshalECPrivateKey(ca.Key.(*ecdsa.PrivateKey))))
	if err := os.WriteFile(keyFile, sec1, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadCA(pkitest.TrustDomain, certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err := os.WriteFile(keyFile, pemOf("EC PRIVATE KEY", der(x509.MarshalECPrivateKey(other))), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadCA(pkitest.TrustDomain, certFile, keyFile); err == nil || !strings.Contains(err.Error(), "not the certificate's") {
		t.Fatalf("a CA key of another certificate: %v", err)
	}
}

// FuzzParsePrivateKey: any bytes give a key or an error, never a panic.
func FuzzParsePrivateKey(f *testing.F) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sec1, _ := x509.MarshalECPrivateKey(k)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(k)
	f.Add(pemOf("EC PRIVATE KEY", sec1))
	f.Add(pemOf("PRIVATE KEY", pkcs8))
	f.Add(pemOf("RSA PRIVATE KEY", []byte{0x30, 0x03, 0x02, 0x01, 0x00}))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		key, err := pki.ParsePrivateKey(b)
		if (key == nil) == (err == nil) {
			t.Fatalf("key %v and err %v", key, err)
		}
	})
}
