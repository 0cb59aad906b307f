// Package identity names every Prism component with a SPIFFE-style X.509
// identity, spiffe://<trust-domain>/<role>/<name>, and holds the
// authorization rules every server applies to the caller's identity, so the
// admin cluster, the runner and the gateway check the same way.
//
// The roles, and what each may do (docs/security.md):
//   - admin/<node-id>: an admin node; Raft between members, forwarding,
//     the leadership Peer RPC.
//   - proxy/<proxy-id>: a sidecar and its runner; its own proxy's
//     registration, heartbeats and the leases of mailboxes *@<proxy-id>.
//   - gateway/<name>: Envoy or prism gateway; xDS, and queries to runners.
//   - operator/<name>: prismctl for writes (namespaces, membership).
//   - reader/<name>: read-only admin calls.
package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Role is what a component is, the first path segment of its identity.
type Role string

const (
	Admin    Role = "admin"
	Proxy    Role = "proxy"
	Gateway  Role = "gateway"
	Operator Role = "operator"
	Reader   Role = "reader"
)

// Roles lists every role, in the order the docs give them.
var Roles = []Role{Admin, Proxy, Gateway, Operator, Reader}

func (r Role) valid() bool {
	for _, k := range Roles {
		if r == k {
			return true
		}
	}
	return false
}

// DefaultTrustDomain is the trust domain `prism dev` and `prism certs` use
// unless told otherwise.
const DefaultTrustDomain = "prism.local"

// Identity is one component's name: its trust domain, role and name (a node,
// proxy, gateway or operator id).
type Identity struct {
	TrustDomain string
	Role        Role
	Name        string
}

// New builds and checks an identity.
func New(trustDomain string, role Role, name string) (Identity, error) {
	id := Identity{TrustDomain: trustDomain, Role: role, Name: name}
	if _, err := id.SPIFFEID(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// Parse reads "spiffe://<trust-domain>/<role>/<name>". The name is one path
// segment of letters, digits, '.', '-' and '_' (the SPIFFE path rules), so a
// proxy id outside that set cannot have an identity.
func Parse(s string) (Identity, error) {
	sid, err := spiffeid.FromString(s)
	if err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", s, err)
	}
	return fromSPIFFE(sid)
}

func fromSPIFFE(sid spiffeid.ID) (Identity, error) {
	segs := strings.Split(strings.TrimPrefix(sid.Path(), "/"), "/")
	if len(segs) != 2 {
		return Identity{}, fmt.Errorf("identity %q: the path must be /<role>/<name>", sid)
	}
	role := Role(segs[0])
	if !role.valid() {
		return Identity{}, fmt.Errorf("identity %q: unknown role %q (one of %v)", sid, segs[0], Roles)
	}
	return Identity{TrustDomain: sid.TrustDomain().Name(), Role: role, Name: segs[1]}, nil
}

// SPIFFEID is the identity as a SPIFFE ID, checked.
func (i Identity) SPIFFEID() (spiffeid.ID, error) {
	if !i.Role.valid() {
		return spiffeid.ID{}, fmt.Errorf("identity: unknown role %q (one of %v)", i.Role, Roles)
	}
	td, err := spiffeid.TrustDomainFromString(i.TrustDomain)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("identity: trust domain %q: %w", i.TrustDomain, err)
	}
	sid, err := spiffeid.FromSegments(td, string(i.Role), i.Name)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("identity: %s name %q: %w", i.Role, i.Name, err)
	}
	return sid, nil
}

// String is the URI form; the zero Identity is "".
func (i Identity) String() string {
	if i == (Identity{}) {
		return ""
	}
	return "spiffe://" + i.TrustDomain + "/" + string(i.Role) + "/" + i.Name
}

// IsZero reports an identity that names nobody (a plaintext caller).
func (i Identity) IsZero() bool { return i == (Identity{}) }

// FromCert reads the identity of a certificate's single URI SAN.
func FromCert(c *x509.Certificate) (Identity, error) {
	sid, err := x509svid.IDFromCert(c)
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %q: %w", c.Subject, err)
	}
	return fromSPIFFE(sid)
}

// ErrNoIdentity is a connection without a verified client certificate.
var ErrNoIdentity = errors.New("no client certificate")

// FromTLS is the identity of a handshake's peer (the leaf certificate, which
// the handshake verified against the trust bundle).
func FromTLS(cs *tls.ConnectionState) (Identity, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Identity{}, ErrNoIdentity
	}
	return FromCert(cs.PeerCertificates[0])
}

// FromContext is the identity of a gRPC call's peer.
func FromContext(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return Identity{}, ErrNoIdentity
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, ErrNoIdentity
	}
	return FromTLS(&ti.State)
}

// FromRequest is the identity of an HTTP request's peer.
func FromRequest(r *http.Request) (Identity, error) {
	return FromTLS(r.TLS)
}
