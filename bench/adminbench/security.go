package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// Security modes of a run (-security).
const (
	modePlaintext = "plaintext"
	modeMTLS      = "mtls"
	modeBoth      = "both"
)

// benchOperator names the operator identity the bench creates namespaces
// and reads cluster state as.
const benchOperator = "adminbench"

// certs is one throwaway CA and the files of every identity the run uses,
// issued on first use, as `prism certs` would for a small install, and the
// client credentials made of them.
type certs struct {
	*pki.Directory
	mu    sync.Mutex
	creds map[identity.Identity]credentials.TransportCredentials
}

func newCerts(dir string) (*certs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d, err := pki.NewDirectory(dir, identity.DefaultTrustDomain, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	return &certs{Directory: d, creds: map[identity.Identity]credentials.TransportCredentials{}}, nil
}

// serverArgs are the TLS flags of a prism process with role/name's identity.
func (c *certs) serverArgs(role identity.Role, name string) ([]string, error) {
	f, err := c.Files(role, name)
	if err != nil {
		return nil, err
	}
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}, nil
}

// client is the transport credentials of role/name dialing admin nodes:
// mutual TLS 1.3 that accepts only admin identities of the CA, as
// admin/client does.
func (c *certs) client(role identity.Role, name string) (credentials.TransportCredentials, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := identity.Identity{TrustDomain: c.CA().TrustDomain, Role: role, Name: name}
	if cr, ok := c.creds[id]; ok {
		return cr, nil
	}
	f, err := c.Files(role, name)
	if err != nil {
		return nil, err
	}
	src, err := pki.Load(f, nil)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", id, err)
	}
	cr := credentials.NewTLS(src.ClientConfig(pki.RoleIs(identity.Admin)))
	c.creds[id] = cr
	return cr, nil
}

// connKey is one client connection: a node and the identity calling it.
type connKey struct {
	node int
	role identity.Role
	name string
}

// conns caches one connection per node and identity. Plaintext runs use
// the same layout (a connection per proxy, as each sidecar has its own),
// so the mTLS and plaintext figures differ by TLS alone.
type conns struct {
	addrs []string
	certs *certs // nil: plaintext
	mu    sync.Mutex
	m     map[connKey]*grpc.ClientConn
}

func newConns(addrs []string, certs *certs) *conns {
	return &conns{addrs: addrs, certs: certs, m: map[connKey]*grpc.ClientConn{}}
}

// as is node i's connection for role/name, dialed on first use (lazily:
// the handshake happens on the first call, before the timed phases, which
// reuse it).
func (cs *conns) as(i int, role identity.Role, name string) *grpc.ClientConn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	k := connKey{i, role, name}
	if cc, ok := cs.m[k]; ok {
		return cc
	}
	cc, err := cs.dial(cs.addrs[i], role, name)
	if err != nil {
		// Only a bad address or a CA that cannot issue gets here: both are
		// bugs of the bench, not results.
		panic(err)
	}
	cs.m[k] = cc
	return cc
}

func (cs *conns) dial(addr string, role identity.Role, name string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if cs.certs != nil {
		var err error
		if creds, err = cs.certs.client(role, name); err != nil {
			return nil, err
		}
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dial %s as %s/%s: %w", addr, role, name, err)
	}
	return cc, nil
}

// operator is node i's connection as the bench's operator: namespaces and
// cluster reads.
func (cs *conns) operator(i int) *grpc.ClientConn { return cs.as(i, identity.Operator, benchOperator) }

// proxy is node i's connection as proxy p: its registration and the leases
// of mailboxes *@p.
func (cs *conns) proxy(i int, p string) *grpc.ClientConn { return cs.as(i, identity.Proxy, p) }

func (cs *conns) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for k, cc := range cs.m {
		cc.Close()
		delete(cs.m, k)
	}
}

// modes are the security modes one part runs in, in order.
func modes(security string) ([]bool, error) {
	switch security {
	case modePlaintext:
		return []bool{false}, nil
	case modeMTLS:
		return []bool{true}, nil
	case modeBoth:
		return []bool{false, true}, nil
	}
	return nil, fmt.Errorf("-security %q: want %s, %s or %s", security, modePlaintext, modeMTLS, modeBoth)
}

// tlsSuffix is what names a figure measured over mutual TLS.
func tlsSuffix(mtls bool) string {
	if mtls {
		return "_mtls"
	}
	return ""
}

// ratio prints name = mtls/plain when both were measured.
func ratio(name string, plain, mtls time.Duration) {
	if plain > 0 && mtls > 0 {
		bench(name, float64(mtls)/float64(plain), "x")
	}
}
