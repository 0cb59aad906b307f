package e2e

import (
	"crypto/tls"
	"fmt"
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

// The processes of one test binary run over mutual TLS, as a deployment does by default: one CA per test
// process (in a temporary directory, like testbin's binaries) and one certificate per identity, issued on
// first use.
var certs struct {
	sync.Mutex
	ca    *pki.CA
	dir   string
	files map[identity.Identity]pki.Files
}

// TrustDomain is the trust domain of the harness's CA.
const TrustDomain = identity.DefaultTrustDomain

// Certs are the files of role/name, issued by the harness's CA on first use.
func Certs(t testing.TB, role identity.Role, name string) pki.Files {
	t.Helper()
	f, err := issue(role, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func issue(role identity.Role, name string) (pki.Files, error) {
	certs.Lock()
	defer certs.Unlock()
	if certs.ca == nil {
		ca, err := pki.NewCA(TrustDomain, 24*time.Hour)
		if err != nil {
			return pki.Files{}, err
		}
		dir, err := os.MkdirTemp("", "prism-e2e-pki-")
		if err != nil {
			return pki.Files{}, err
		}
		certs.ca, certs.dir, certs.files = ca, dir, map[identity.Identity]pki.Files{}
	}
	id := identity.Identity{TrustDomain: TrustDomain, Role: role, Name: name}
	if f, ok := certs.files[id]; ok {
		return f, nil
	}
	f, err := certs.ca.IssueFiles(filepath.Join(certs.dir, string(role)+"-"+name), pki.Request{
		Role: role, Name: name, Hosts: []string{"127.0.0.1", "::1", "localhost"}})
	if err != nil {
		return pki.Files{}, fmt.Errorf("issue %s: %w", id, err)
	}
	certs.files[id] = f
	return f, nil
}

// readerTLS is the identity of the harness's HTTP clients: they read runners' query APIs and probe.
func readerTLS() (*tls.Config, error) {
	f, err := issue(identity.Reader, Operator)
	if err != nil {
		return nil, err
	}
	src, err := pki.Load(f, nil)
	if err != nil {
		return nil, err
	}
	return src.ClientConfig(pki.Any), nil
}

// TLSArgs are the flags that start a process with role/name's identity.
func TLSArgs(t testing.TB, role identity.Role, name string) []string {
	t.Helper()
	f := Certs(t, role, name)
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// ClientTLS is a client configuration with role/name's identity that accepts any server of the harness's CA.
func ClientTLS(t testing.TB, role identity.Role, name string) *tls.Config {
	t.Helper()
	src, err := pki.Load(Certs(t, role, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	return src.ClientConfig(pki.Any)
}

// Dial is a gRPC connection to addr as role/name, closed when the test ends.
func Dial(t testing.TB, addr string, role identity.Role, name string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ClientTLS(t, role, name))))
	if err != nil {
		t.Fatalf("dial %s as %s/%s: %v", addr, role, name, err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Operator is the identity the harness's own admin calls use.
const Operator = "e2e"

// CtlArgs are the prismctl flags that call as role/name (operator for writes, reader for reads).
func CtlArgs(t testing.TB, role identity.Role, name string) []string {
	t.Helper()
	f := Certs(t, role, name)
	return []string{"--cacert", f.CA, "--cert", f.Cert, "--key", f.Key}
}
