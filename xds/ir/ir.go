// Package ir holds the routing state the xDS translator consumes: the
// registered proxies and where their runners answer, the admin nodes, and
// the gateway's listener. It is built from the admin FSM and knows nothing
// about Envoy.
//
// No mailbox, lease or namespace alias is in it: every mailbox id names its
// proxy ("{namespace}@{proxy}"), so the data planes route on the proxy and
// the runner, which serves a mailbox only while it holds its lease, is the
// authority on the rest. A lease acquired, renewed, released or re-granted
// changes nothing here; namespaces resolve through the admin nodes' lookup
// (Lookup, Admins).
package ir

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/prism-mesh/prism/mesh"
)

// IR is one consistent view of routing state.
type IR struct {
	// Version is the Raft index of the last change to the proxies' routing
	// state (fsm.ProxyRoutesIndex); it becomes the xDS version so every
	// admin node labels the same state alike.
	Version uint64 `json:"version"`
	// Gateway describes the Envoy gateway's socket listener.
	Gateway Gateway `json:"gateway"`
	// Admins lists the addresses (IP:port) of the admin nodes' gRPC
	// servers: xds/notfound's MailboxQuery, which answers NotFound for a
	// call no proxy route takes, the namespace lookup (RLS) and Envoy's
	// ext_authz.
	Admins []string `json:"admins,omitempty"`
	// Lookup is the gRPC target grpc-go's RLS dials for namespace lookups,
	// e.g. "dns:///admin.prism.svc:9090"; empty leaves grpc-go without the
	// namespace header route (such calls then answer NotFound).
	Lookup string `json:"lookup,omitempty"`
	// Proxies are the registered proxies, each with the runner serving its
	// mailboxes.
	Proxies []Proxy `json:"proxies,omitempty"`
}

// Proxy is one registered proxy: the mailboxes "{namespace}@{ID}" are
// served by its runner at Address, and by no other.
type Proxy struct {
	// ID is the proxy id; it becomes part of its cluster name and is the
	// identity (proxy/<ID>) its runner presents under UpstreamTLS.
	ID string `json:"id"`
	// RunnerID is the runner registered to serve the proxy's mailboxes
	// (empty in the registration means the proxy id). Routing does not
	// depend on it, the runner's own lease check does; it is kept so the
	// IR says which process the endpoint is.
	RunnerID string `json:"runnerId,omitempty"`
	// Address is the runner's MailboxQuery endpoint as IP:port (Envoy EDS
	// does not resolve host names, so the sidecar registers the pod IP).
	Address string `json:"address"`
	// Healthy is false when the proxy is stale: its endpoint is then sent
	// UNHEALTHY so queries fail fast until it is back or its leases move.
	Healthy bool `json:"healthy"`
}

// Gateway is the Envoy gateway's listener and how the gateways (Envoy and
// prism gateway) reach the mesh.
type Gateway struct {
	// Address is the IP:port Envoy listens on for queries.
	Address string `json:"address"`
	// UpstreamTLS, when set, makes every cluster mutual TLS: runners must
	// present their proxy's identity and the admin endpoints an admin
	// identity. Zero keeps a plaintext mesh's clusters.
	UpstreamTLS UpstreamTLS `json:"upstreamTLS,omitzero"`
	// QueryAuth, when set, makes the Envoy gateway take queries only with a
	// JWT that may read the mailbox's namespace, by the rules prism gateway
	// applies in Go (gateway/auth). Zero leaves Envoy's queries open.
	// grpc-go's resources never change with it: prism gateway checks tokens
	// itself.
	QueryAuth QueryAuth `json:"queryAuth,omitzero"`
}

// QueryAuth is how the Envoy gateway checks query tokens: signed by a key of
// one JWKS (a file on the Envoy host, or an https URL Envoy fetches), with
// iss Issuer, Audience among aud, an exp, and a namespaces claim naming the
// mailbox's namespace or "*".
type QueryAuth struct {
	// Issuer must equal the token's iss.
	Issuer string `json:"issuer"`
	// Audience must be among the token's aud.
	Audience string `json:"audience"`
	// NamespacesClaim names the claim listing the namespaces a token may
	// read; empty is DefaultNamespacesClaim.
	NamespacesClaim string `json:"namespacesClaim,omitempty"`
	// JWKSFile is a JSON Web Key Set file as the Envoy host sees it. Envoy
	// reads it when the listener is (re)built, not when the file changes.
	JWKSFile string `json:"jwksFile,omitempty"`
	// JWKSURL is an https URL of a JSON Web Key Set, fetched by Envoy.
	// Exactly one of JWKSFile and JWKSURL is set.
	JWKSURL string `json:"jwksURL,omitempty"`
	// JWKSCA is the file (on the Envoy host) of the CAs trusted to sign
	// JWKSURL's server certificate; empty is DefaultJWKSCA.
	JWKSCA string `json:"jwksCA,omitempty"`
}

// DefaultNamespacesClaim is the claim prism gateway reads too (mesh).
const DefaultNamespacesClaim = mesh.DefaultNamespacesClaim

// DefaultJWKSCA is the system CA bundle of the Envoy image (Debian and
// Ubuntu's path), which trusts the public identity providers.
const DefaultJWKSCA = "/etc/ssl/certs/ca-certificates.crt"

// Enabled reports whether Envoy checks query tokens.
func (q QueryAuth) Enabled() bool { return q != QueryAuth{} }

// Claim is the namespaces claim's name, defaulted.
func (q QueryAuth) Claim() string { return cmp.Or(q.NamespacesClaim, DefaultNamespacesClaim) }

// CA is the JWKS URL's trust bundle file, defaulted.
func (q QueryAuth) CA() string { return cmp.Or(q.JWKSCA, DefaultJWKSCA) }

// Validate checks a QueryAuth that is Enabled: what prism gateway requires
// (an issuer and an audience with a JWKS), plus Envoy's one JWKS source.
func (q QueryAuth) Validate() error {
	var errs []error
	if q.Issuer == "" {
		errs = append(errs, errors.New("an issuer is required"))
	}
	if q.Audience == "" {
		errs = append(errs, errors.New("an audience is required"))
	}
	switch {
	case q.JWKSFile == "" && q.JWKSURL == "":
		errs = append(errs, errors.New("a JWKS file or URL is required"))
	case q.JWKSFile != "" && q.JWKSURL != "":
		errs = append(errs, errors.New("a JWKS file or a URL, not both (Envoy takes one JWKS per provider)"))
	case q.JWKSURL != "":
		if _, _, err := q.JWKSHost(); err != nil {
			errs = append(errs, err)
		}
	}
	if q.JWKSURL == "" && q.JWKSCA != "" {
		errs = append(errs, errors.New("a JWKS CA file is only for a JWKS URL"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrQueryAuth, err)
	}
	return nil
}

// JWKSHost is the host and port Envoy fetches JWKSURL from.
func (q QueryAuth) JWKSHost() (string, uint32, error) {
	u, err := url.Parse(q.JWKSURL)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil {
		return "", 0, fmt.Errorf("JWKS URL %q: want https://host[:port]/path", q.JWKSURL)
	}
	port := uint64(443)
	if p := u.Port(); p != "" {
		if port, err = strconv.ParseUint(p, 10, 16); err != nil || port == 0 {
			return "", 0, fmt.Errorf("JWKS URL %q: bad port", q.JWKSURL)
		}
	}
	return u.Hostname(), uint32(port), nil
}

// UpstreamTLS is the mesh's trust domain; the peers' identities are
// spiffe://<TrustDomain>/<role>/<name> (mesh/identity).
type UpstreamTLS struct {
	TrustDomain string `json:"trustDomain"`
}

// Enabled reports whether clusters are mutual TLS.
func (u UpstreamTLS) Enabled() bool { return u != UpstreamTLS{} }

// Named validation errors; every error Validate returns wraps one of them.
var (
	ErrVersion         = errors.New("version must be positive")
	ErrAddress         = errors.New("address must be IP:port")
	ErrProxyID         = errors.New("proxy id must be " + mesh.NameRule)
	ErrRunnerID        = errors.New("runner id must be " + mesh.NameRule)
	ErrDuplicate       = errors.New("duplicate")
	ErrLookup          = errors.New("lookup must be a gRPC target (scheme:///authority or host:port)")
	ErrGatewayListener = errors.New("gateway listener")
	ErrTrustDomain     = errors.New("upstream TLS trust domain")
	ErrQueryAuth       = errors.New("gateway query auth")
)

// Validate reports every problem in x, joined.
func (x *IR) Validate() error {
	_, err := x.Valid()
	return err
}

// Valid returns a sorted copy of x holding only the objects that are valid on
// their own and whose references resolve to valid objects, and the joined
// errors for everything it dropped. The translator uses it to keep serving
// good routes when one object is bad.
func (x *IR) Valid() (*IR, error) {
	c := x.Sorted()
	var errs []error
	if c.Version == 0 {
		errs = append(errs, ErrVersion)
	}
	if err := checkAddress(c.Gateway.Address); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrGatewayListener, err))
	}
	if u := c.Gateway.UpstreamTLS; u.Enabled() {
		// Kept even when invalid: the SAN checks then match nobody, so a
		// bad setting fails closed instead of dropping to plaintext.
		if _, err := spiffeid.TrustDomainFromString(u.TrustDomain); err != nil {
			errs = append(errs, fmt.Errorf("%w %q: %w", ErrTrustDomain, u.TrustDomain, err))
		}
	}
	if q := c.Gateway.QueryAuth; q.Enabled() {
		// Kept even when invalid, like UpstreamTLS: the translator then
		// leaves Envoy's listener out, so queries are refused rather than
		// served without a check.
		if err := q.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	out := &IR{Version: c.Version, Gateway: c.Gateway}
	for _, a := range c.Admins {
		if err := checkAddress(a); err != nil {
			errs = append(errs, fmt.Errorf("admin endpoint: %w", err))
			continue
		}
		if len(out.Admins) > 0 && out.Admins[len(out.Admins)-1] == a {
			continue
		}
		out.Admins = append(out.Admins, a)
	}
	if c.Lookup != "" {
		if err := checkTarget(c.Lookup); err != nil {
			errs = append(errs, err)
		} else {
			out.Lookup = c.Lookup
		}
	}
	for _, p := range c.Proxies {
		if err := p.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		// Sorted by id: a duplicate follows the one kept.
		if n := len(out.Proxies); n > 0 && out.Proxies[n-1].ID == p.ID {
			errs = append(errs, fmt.Errorf("proxy %q: %w", p.ID, ErrDuplicate))
			continue
		}
		out.Proxies = append(out.Proxies, p)
	}
	return out, errors.Join(errs...)
}

// Validate checks p on its own.
func (p Proxy) Validate() error {
	var errs []error
	if !mesh.ValidName(p.ID) {
		errs = append(errs, ErrProxyID)
	}
	if p.RunnerID != "" && !mesh.ValidName(p.RunnerID) {
		errs = append(errs, ErrRunnerID)
	}
	if err := checkAddress(p.Address); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("proxy %q: %w", p.ID, err)
	}
	return nil
}

// checkTarget accepts what grpc-go's RLS accepts as its lookup service: a
// URL with a scheme, or a bare authority it prefixes with the default
// scheme; nothing with white space, which no resolver takes.
func checkTarget(t string) error {
	if strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("%q: %w", t, ErrLookup)
	}
	if _, err := url.Parse(t); err != nil {
		if _, err := url.Parse("dns:///" + t); err != nil {
			return fmt.Errorf("%q: %w", t, ErrLookup)
		}
	}
	return nil
}

func checkAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %w", addr, ErrAddress)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q: %w", addr, ErrAddress)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("%q: %w", addr, ErrAddress)
	}
	return nil
}

// Sorted returns a copy of x with every list in a canonical order, so equal
// state always translates to byte-identical resources.
func (x *IR) Sorted() *IR {
	c := &IR{
		Version: x.Version,
		Gateway: x.Gateway,
		Admins:  slices.Sorted(slices.Values(x.Admins)),
		Lookup:  x.Lookup,
		Proxies: slices.Clone(x.Proxies),
	}
	slices.SortStableFunc(c.Proxies, func(a, b Proxy) int { return cmp.Compare(a.ID, b.ID) })
	return c
}

// Equal reports whether x and y describe the same routing state. Version is
// ignored: a state rebuilt under a new index (an admin resolving to the same
// addresses again, a proxy re-registering unchanged) must not cause a push.
func (x *IR) Equal(y *IR) bool {
	if x == nil || y == nil {
		return x == y
	}
	a, b := x.Sorted(), y.Sorted()
	return a.Gateway == b.Gateway &&
		slices.Equal(a.Admins, b.Admins) &&
		a.Lookup == b.Lookup &&
		slices.Equal(a.Proxies, b.Proxies)
}
