package e2e

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// TrustDomain is the trust domain of the harness's CAs.
const TrustDomain = identity.DefaultTrustDomain

// Operator is the name of the identities the harness's own calls use: operator/e2e for admin writes,
// reader/e2e for runners' query APIs.
const Operator = "e2e"

// PKI is a CA and the certificates it issued, one per identity, issued on first use into its directory.
// The processes of a test run over mutual TLS with certificates from Shared unless their options name
// another PKI (a test that rotates certificates has its own, so the files it replaces are its alone).
type PKI = pki.Directory

// NewPKI makes a CA valid for a day in dir, issuing certificates for loopback and localhost.
func NewPKI(dir string) (*PKI, error) {
	return pki.NewDirectory(dir, TrustDomain, 24*time.Hour, "127.0.0.1", "::1", "localhost")
}

var shared struct {
	once sync.Once
	pki  *PKI
	err  error
}

// Shared is the PKI of the test process: one CA in a directory of its own under the user's cache
// directory, where the PKIs of test processes more than a day old are removed (a test process has no hook
// to remove its own at exit, and `go test ./...` runs one per package).
func Shared() (*PKI, error) {
	shared.once.Do(func() {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		base = filepath.Join(base, "prism-e2e-pki")
		if err := os.MkdirAll(base, 0o700); err != nil {
			shared.err = err
			return
		}
		pruneOlder(base, 24*time.Hour)
		dir, err := os.MkdirTemp(base, "pki-")
		if err != nil {
			shared.err = err
			return
		}
		shared.pki, shared.err = NewPKI(dir)
	})
	return shared.pki, shared.err
}

// pruneOlder removes the entries of dir last changed more than age ago.
func pruneOlder(dir string, age time.Duration) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > age {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

func orShared(t testing.TB, p *PKI) *PKI {
	t.Helper()
	if p != nil {
		return p
	}
	s, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Certs are role/name's files from p (the shared PKI when nil).
func Certs(t testing.TB, p *PKI, role identity.Role, name string) pki.Files {
	t.Helper()
	f, err := orShared(t, p).Files(role, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TLSArgs are the flags that start a process with role/name's identity from p (nil: shared).
func TLSArgs(t testing.TB, p *PKI, role identity.Role, name string) []string {
	t.Helper()
	f := Certs(t, p, role, name)
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// CtlArgs are the prismctl flags that call as role/name from p (nil: shared): operator for writes, reader
// for reads.
func CtlArgs(t testing.TB, p *PKI, role identity.Role, name string) []string {
	t.Helper()
	f := Certs(t, p, role, name)
	return []string{"--cacert", f.CA, "--cert", f.Cert, "--key", f.Key}
}

// ClientTLS is a client configuration with role/name's identity from p (nil: shared) that accepts any
// server of p's CA.
func ClientTLS(t testing.TB, p *PKI, role identity.Role, name string) *tls.Config {
	t.Helper()
	src, err := pki.Load(Certs(t, p, role, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	return src.ClientConfig(pki.Any)
}

// Dial is a gRPC connection to addr as role/name from p (nil: shared), closed when the test ends.
func Dial(t testing.TB, p *PKI, addr string, role identity.Role, name string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ClientTLS(t, p, role, name))))
	if err != nil {
		t.Fatalf("dial %s as %s/%s: %v", addr, role, name, err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// readerTLS is the identity of the harness's HTTP clients: they read runners' query APIs and probe.
func readerTLS() (*tls.Config, error) {
	p, err := Shared()
	if err != nil {
		return nil, err
	}
	f, err := p.Files(identity.Reader, Operator)
	if err != nil {
		return nil, err
	}
	src, err := pki.Load(f, nil)
	if err != nil {
		return nil, err
	}
	return src.ClientConfig(pki.Any), nil
}
