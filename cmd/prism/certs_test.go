package main

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

func runCerts(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := certsCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestCertsIssueLoads: what `prism certs` issues is what the servers load,
// with the identity asked for, and init never replaces a CA.
func TestCertsIssueLoads(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := runCerts(t, "init", "--dir", dir, "--trust-domain", "example.org"); err != nil {
		t.Fatal(err)
	}
	if _, err := runCerts(t, "init", "--dir", dir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second init: %v; want a refusal to replace the CA", err)
	}
	out, err := runCerts(t, "issue", "proxy", "proxy-01", "--dir", dir, "--host", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "--tls-cert "+filepath.Join(dir, "proxy-proxy-01.pem")) {
		t.Fatalf("issue printed %q", out)
	}
	src, err := pki.Load(pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "proxy-proxy-01.pem"), Key: filepath.Join(dir, "proxy-proxy-01-key.pem")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Identity(); got != (identity.Identity{TrustDomain: "example.org", Role: identity.Proxy, Name: "proxy-01"}) {
		t.Fatalf("identity %v", got)
	}
	for _, bad := range [][]string{{"issue", "root", "x"}, {"issue", "proxy", "a@b"}} {
		if _, err := runCerts(t, append(bad, "--dir", dir)...); err == nil {
			t.Errorf("prism certs %v issued", bad)
		}
	}
	if _, err := runCerts(t, "issue", "proxy", "p", "--dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "certs init") {
		t.Fatalf("issue without a CA: %v", err)
	}
}

// TestTLSFlagsSecureByDefault: a server without TLS files refuses to start
// unless --insecure says so, and the two do not mix.
func TestTLSFlagsSecureByDefault(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		name    string
		f       tlsFlags
		wantErr string
	}{
		{"nothing", tlsFlags{}, "TLS is required"},
		{"insecure", tlsFlags{insecure: true}, ""},
		{"insecure and files", tlsFlags{insecure: true, files: pki.Files{CA: "x"}}, "exclude"},
		{"missing key", tlsFlags{files: pki.Files{CA: "a", Cert: "b"}}, "all required"},
	}
	for _, tc := range cases {
		src, err := tc.f.load(log)
		if tc.wantErr == "" {
			if err != nil || src != nil {
				t.Errorf("%s: %v, %v; want plaintext", tc.name, src, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.wantErr)
		}
	}
}
