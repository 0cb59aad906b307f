// Package pkitest gives tests a throwaway CA and certificates in a temporary
// directory, for servers and clients that run over mutual TLS as they do in
// production.
package pkitest

import (
	"crypto/tls"
	"os"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// TrustDomain is the trust domain of every CA made here.
const TrustDomain = identity.DefaultTrustDomain

// PKI is a CA and the directory its certificates are written to.
type PKI struct {
	t   testing.TB
	CA  *pki.CA
	Dir string
}

// New makes a CA valid for a day in a new temporary directory.
func New(t testing.TB) *PKI {
	t.Helper()
	ca, err := pki.NewCA(TrustDomain, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &PKI{t: t, CA: ca, Dir: t.TempDir()}
}

// Files issues a certificate for role/name (valid for a day, for loopback
// and localhost) and returns its files.
func (p *PKI) Files(role identity.Role, name string) pki.Files {
	p.t.Helper()
	return p.Issue(pki.Request{Role: role, Name: name})
}

// Issue issues r (Hosts default to loopback and localhost) into its own
// subdirectory, so two certificates of one identity (an expired one, a
// rotated one) do not overwrite each other.
func (p *PKI) Issue(r pki.Request) pki.Files {
	p.t.Helper()
	if r.Hosts == nil {
		r.Hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	dir, err := os.MkdirTemp(p.Dir, "cert-")
	if err != nil {
		p.t.Fatal(err)
	}
	f, err := p.CA.IssueFiles(dir, r)
	if err != nil {
		p.t.Fatal(err)
	}
	return f
}

// Source issues a certificate for role/name and loads it.
func (p *PKI) Source(role identity.Role, name string) *pki.Source {
	p.t.Helper()
	s, err := pki.Load(p.Files(role, name), nil)
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// ID is role/name in this CA's trust domain.
func ID(role identity.Role, name string) identity.Identity {
	return identity.Identity{TrustDomain: TrustDomain, Role: role, Name: name}
}

// Expired issues a certificate for role/name that expired an hour ago (pki.Load refuses it: present it
// with Presented).
func (p *PKI) Expired(role identity.Role, name string) pki.Files {
	p.t.Helper()
	return p.Issue(pki.Request{Role: role, Name: name, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
}

// Presented is a client configuration that shows f's certificate and does not check the server, so a
// refused handshake or call can only be the server's doing.
func Presented(t testing.TB, f pki.Files) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // the tests are about the server's checks
}
