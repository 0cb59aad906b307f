package pki_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// serve accepts connections with cfg and answers each handshake's peer
// identity, one line per connection.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				cs := tc.ConnectionState()
				id, _ := identity.FromTLS(&cs)
				_, _ = io.WriteString(c, id.String()+"\n")
			}()
		}
	}()
	return ln.Addr().String()
}

// dial connects with cfg and returns what the server said, or the error of
// the handshake or the read (TLS 1.3 reports a refused client certificate
// on the first read).
func dial(addr string, cfg *tls.Config) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if len(b) == 0 && err == nil {
		err = errors.New("closed without an answer")
	}
	return string(b), err
}

func TestMutualTLSRefusals(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	other := pkitest.New(t)
	server := p.Source(identity.Admin, "a1")
	addr := serve(t, server.ServerConfig(pki.RoleIs(identity.Proxy, identity.Operator)))

	// pki.Load refuses an expired certificate, so present one by hand.
	ef := p.Expired(identity.Proxy, "p1")
	if _, err := pki.Load(ef, nil); err == nil {
		t.Fatal("pki.Load accepted an expired certificate")
	}
	expired := pkitest.Presented(t, ef)
	roots := x509.NewCertPool()
	roots.AddCert(p.CA.Cert)
	noCert := &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS13}
	tls12 := p.Source(identity.Proxy, "p1").ClientConfig(pki.RoleIs(identity.Admin))
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	cases := []struct {
		name   string
		client *tls.Config
		want   string // the identity the server saw; "" when refused
	}{
		{"valid proxy", p.Source(identity.Proxy, "p1").ClientConfig(pki.RoleIs(identity.Admin)), "spiffe://prism.local/proxy/p1\n"},
		{"valid operator", p.Source(identity.Operator, "ops").ClientConfig(pki.Any), "spiffe://prism.local/operator/ops\n"},
		{"no client certificate", noCert, ""},
		{"certificate of another CA", other.Source(identity.Proxy, "p1").ClientConfig(pki.Any), ""},
		{"expired certificate", expired, ""},
		{"role the server does not accept", p.Source(identity.Gateway, "g").ClientConfig(pki.Any), ""},
		{"client refuses a server of the wrong role", p.Source(identity.Proxy, "p1").ClientConfig(pki.RoleIs(identity.Gateway)), ""},
		{"client refuses a server of the wrong identity", p.Source(identity.Proxy, "p1").ClientConfig(pki.Exactly(pkitest.ID(identity.Admin, "a2"))), ""},
		{"TLS 1.2 only", tls12, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := dial(addr, tc.client)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("connected and the server saw %q; want a refused handshake", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestRotationReloadsFromDisk replaces a server's certificate and then its
// CA on disk: the next connection sees the new certificate without a
// restart, and once the CA is rotated a client of the old CA is refused.
func TestRotationReloadsFromDisk(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	files := p.Files(identity.Admin, "a1")
	server, err := pki.Load(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, server.ServerConfig(pki.Any))
	client := p.Source(identity.Proxy, "p1")
	before := server.Identity()

	// A new certificate of another name, same CA.
	next := p.Files(identity.Admin, "a1-next")
	copyFile(t, next.Cert, files.Cert)
	copyFile(t, next.Key, files.Key)
	var seen string
	cfg := client.ClientConfig(func(id identity.Identity) error { seen = id.String(); return nil })
	if _, err := dial(addr, cfg); err != nil {
		t.Fatal(err)
	}
	if seen != "spiffe://prism.local/admin/a1-next" || server.Identity() == before {
		t.Fatalf("after replacing the files the client saw %q; want the new certificate", seen)
	}

	// A half-written pair (certificate without its key) keeps the previous one.
	copyFile(t, p.Files(identity.Admin, "a1-half").Cert, files.Cert)
	if _, err := dial(addr, client.ClientConfig(pki.Any)); err != nil {
		t.Fatalf("a mismatched certificate and key on disk broke the server: %v", err)
	}

	// CA rotation: the server now trusts only the new CA.
	rotated := pkitest.New(t)
	fresh := rotated.Files(identity.Admin, "a1")
	for _, f := range [][2]string{{fresh.CA, files.CA}, {fresh.Cert, files.Cert}, {fresh.Key, files.Key}} {
		copyFile(t, f[0], f[1])
	}
	if _, err := dial(addr, client.ClientConfig(pki.Any)); err == nil {
		t.Fatal("a client of the old CA connected after the CA was rotated")
	}
	if _, err := dial(addr, rotated.Source(identity.Proxy, "p1").ClientConfig(pki.Any)); err != nil {
		t.Fatalf("a client of the new CA: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadRefusesMismatchedFiles(t *testing.T) {
	t.Parallel()
	p, other := pkitest.New(t), pkitest.New(t)
	good := p.Files(identity.Proxy, "p1")
	foreign := other.Files(identity.Proxy, "p1")
	for name, f := range map[string]pki.Files{
		"missing key":                {CA: good.CA, Cert: good.Cert},
		"certificate of another CA":  {CA: good.CA, Cert: foreign.Cert, Key: foreign.Key},
		"key of another certificate": {CA: good.CA, Cert: good.Cert, Key: foreign.Key},
		"no such file":               {CA: good.CA + ".missing", Cert: good.Cert, Key: good.Key},
	} {
		if _, err := pki.Load(f, nil); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	if _, err := pki.Load(good, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCAFilesRoundTrip(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	dir := t.TempDir()
	if err := p.CA.WriteFiles(dir+"/ca.pem", dir+"/ca-key.pem"); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(pkitest.TrustDomain, dir+"/ca.pem", dir+"/ca-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.IssueFiles(dir, pki.Request{Role: identity.Gateway, Name: "g"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pki.Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Identity(); got != pkitest.ID(identity.Gateway, "g") {
		t.Fatalf("identity %v", got)
	}
	if fi, err := os.Stat(dir + "/ca-key.pem"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode %v, %v; want 0600", fi.Mode(), err)
	}
}

// TestDirectoryIssuesOnce: a directory issues each identity's files once and
// hands the same files out again, with its hosts as SANs.
func TestDirectoryIssuesOnce(t *testing.T) {
	t.Parallel()
	d, err := pki.NewDirectory(t.TempDir(), pkitest.TrustDomain, time.Hour, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Files(identity.Proxy, "p1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Files(identity.Proxy, "p1")
	if err != nil || a != b {
		t.Fatalf("second Files: %+v, %v; want the first %+v", b, err, a)
	}
	src, err := pki.Load(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Identity(); got != pkitest.ID(identity.Proxy, "p1") {
		t.Fatalf("identity %v", got)
	}
	if c, err := d.Files(identity.Gateway, "g"); err != nil || c.Cert == a.Cert {
		t.Fatalf("another identity: %+v, %v", c, err)
	}
}
