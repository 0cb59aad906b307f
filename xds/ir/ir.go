// Package ir holds the routing state the xDS translator consumes: which
// runners exist, which mailbox each live lease places on which runner, and
// which mailbox answers for each namespace. It is built from the admin FSM and
// knows nothing about Envoy.
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

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/prism-mesh/prism/mesh"
)

// IR is one consistent view of routing state.
type IR struct {
	// Version is the Raft applied index the IR was built from; it becomes the
	// xDS snapshot version so every admin node labels the same state alike.
	// Ideally it is the index of the last command that changed routing state.
	Version uint64 `json:"version"`
	// Gateway describes the Envoy gateway's socket listener.
	Gateway Gateway `json:"gateway"`
	// NotFound lists the addresses (IP:port) of the admin nodes serving
	// xds/notfound's MailboxQuery, which answers NotFound for gRPC requests
	// naming a mailbox no route knows.
	NotFound []string `json:"notFound,omitempty"`
	// Runners are the mailbox runners known to the admin cluster.
	Runners []Runner `json:"runners,omitempty"`
	// Mailboxes are the mailboxes with a live lease.
	Mailboxes []Mailbox `json:"mailboxes,omitempty"`
	// Aliases map a namespace to the mailbox currently serving it.
	Aliases []Alias `json:"aliases,omitempty"`
}

// Gateway is the Envoy gateway's listener and how the gateways (Envoy and
// prism gateway) reach the mesh.
type Gateway struct {
	// Address is the IP:port Envoy listens on for queries.
	Address string `json:"address"`
	// UpstreamTLS, when set, makes every cluster mutual TLS: runners must
	// present their proxy identity and the not-found endpoints an admin
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

// Runner is one mailbox runner process.
type Runner struct {
	// ID names the runner; it is unique and becomes part of its cluster name.
	ID string `json:"id"`
	// Address is the runner's query endpoint as IP:port (Envoy EDS does not
	// resolve host names, so the sidecar registers the pod IP).
	Address string `json:"address"`
	// Healthy is false when the runner should get no traffic (for example its
	// proxy is stale); its endpoint is then sent as UNHEALTHY.
	Healthy bool `json:"healthy"`
	// ProxyID is the proxy the runner serves, whose identity
	// (proxy/<ProxyID>) it presents under UpstreamTLS. Empty accepts any
	// proxy identity of the trust domain.
	ProxyID string `json:"proxyId,omitempty"`
}

// Mailbox is a mailbox with a live lease.
type Mailbox struct {
	// ID is "{namespace}@{proxy_id}", e.g. "$admin@proxy-01".
	ID string `json:"id"`
	// Namespace is the namespace part of ID.
	Namespace string `json:"namespace"`
	// RunnerID is the runner holding the lease.
	RunnerID string `json:"runnerId"`
	// Epoch is the lease's fencing token, sent to clients in x-prism-epoch.
	Epoch uint64 `json:"epoch"`
}

// Alias routes /v1/namespaces/{Namespace}/ to a mailbox.
type Alias struct {
	// Namespace is the namespace the alias answers for.
	Namespace string `json:"namespace"`
	// MailboxID is the namespace's current mailbox.
	MailboxID string `json:"mailboxId"`
}

// Named validation errors; every error Validate returns wraps one of them.
var (
	ErrVersion         = errors.New("version must be positive")
	ErrAddress         = errors.New("address must be IP:port")
	ErrRunnerID        = errors.New("runner id must match " + runnerIDPattern)
	ErrMailboxID       = errors.New("mailbox id must be {namespace}@{proxy_id}")
	ErrNamespace       = errors.New("namespace must match " + namespacePattern)
	ErrEpoch           = errors.New("epoch must be positive")
	ErrDuplicate       = errors.New("duplicate")
	ErrUnknownRunner   = errors.New("unknown runner")
	ErrUnknownMailbox  = errors.New("unknown mailbox")
	ErrAliasNamespace  = errors.New("alias namespace differs from the mailbox's")
	ErrGatewayListener = errors.New("gateway listener")
	ErrTrustDomain     = errors.New("upstream TLS trust domain")
	ErrProxyID         = errors.New("proxy id must match " + runnerIDPattern)
	ErrQueryAuth       = errors.New("gateway query auth")
)

const (
	namespacePattern = `[A-Za-z0-9$][A-Za-z0-9._~$-]*`
	runnerIDPattern  = `[A-Za-z0-9][A-Za-z0-9._~-]*`
)

// namespaceName and runnerIDName match the patterns above; matching by hand is
// an order of magnitude cheaper, and Valid runs on every state.
type nameMatcher struct{ dollar bool }

var (
	namespaceName = nameMatcher{dollar: true}
	runnerIDName  = nameMatcher{dollar: false}
)

func (n nameMatcher) MatchString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '$' && n.dollar:
		case i > 0 && (c == '.' || c == '_' || c == '~' || c == '-'):
		default:
			return false
		}
	}
	return s != ""
}

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
	for _, a := range c.NotFound {
		if err := checkAddress(a); err != nil {
			errs = append(errs, fmt.Errorf("not-found endpoint: %w", err))
			continue
		}
		if len(out.NotFound) > 0 && out.NotFound[len(out.NotFound)-1] == a {
			continue
		}
		out.NotFound = append(out.NotFound, a)
	}
	runners := map[string]bool{}
	for _, r := range c.Runners {
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if runners[r.ID] {
			errs = append(errs, fmt.Errorf("runner %q: %w", r.ID, ErrDuplicate))
			continue
		}
		runners[r.ID] = true
		out.Runners = append(out.Runners, r)
	}
	mailboxes := map[string]Mailbox{}
	for _, m := range c.Mailboxes {
		if err := m.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := mailboxes[m.ID]; dup {
			errs = append(errs, fmt.Errorf("mailbox %q: %w", m.ID, ErrDuplicate))
			continue
		}
		if !runners[m.RunnerID] {
			errs = append(errs, fmt.Errorf("mailbox %q: runner %q: %w", m.ID, m.RunnerID, ErrUnknownRunner))
			continue
		}
		mailboxes[m.ID] = m
		out.Mailboxes = append(out.Mailboxes, m)
	}
	aliases := map[string]bool{}
	for _, a := range c.Aliases {
		m, ok := mailboxes[a.MailboxID]
		switch {
		case !namespaceName.MatchString(a.Namespace):
			errs = append(errs, fmt.Errorf("alias %q: %w", a.Namespace, ErrNamespace))
		case aliases[a.Namespace]:
			errs = append(errs, fmt.Errorf("alias %q: %w", a.Namespace, ErrDuplicate))
		case !ok:
			errs = append(errs, fmt.Errorf("alias %q: mailbox %q: %w", a.Namespace, a.MailboxID, ErrUnknownMailbox))
		case m.Namespace != a.Namespace:
			errs = append(errs, fmt.Errorf("alias %q: mailbox %q: %w", a.Namespace, a.MailboxID, ErrAliasNamespace))
		default:
			aliases[a.Namespace] = true
			out.Aliases = append(out.Aliases, a)
		}
	}
	return out, errors.Join(errs...)
}

// Validate checks r on its own.
func (r Runner) Validate() error {
	var errs []error
	if !runnerIDName.MatchString(r.ID) {
		errs = append(errs, ErrRunnerID)
	}
	if err := checkAddress(r.Address); err != nil {
		errs = append(errs, err)
	}
	if r.ProxyID != "" && !runnerIDName.MatchString(r.ProxyID) {
		errs = append(errs, ErrProxyID)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("runner %q: %w", r.ID, err)
	}
	return nil
}

// Validate checks m on its own.
func (m Mailbox) Validate() error {
	var errs []error
	if !namespaceName.MatchString(m.Namespace) {
		errs = append(errs, ErrNamespace)
	}
	id, err := mesh.ParseMailboxID(m.ID)
	if err != nil || id.Namespace != m.Namespace || !runnerIDName.MatchString(id.Proxy) {
		errs = append(errs, ErrMailboxID)
	}
	if m.Epoch == 0 {
		errs = append(errs, ErrEpoch)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("mailbox %q: %w", m.ID, err)
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
		Version:   x.Version,
		Gateway:   x.Gateway,
		NotFound:  slices.Sorted(slices.Values(x.NotFound)),
		Runners:   slices.Clone(x.Runners),
		Mailboxes: slices.Clone(x.Mailboxes),
		Aliases:   slices.Clone(x.Aliases),
	}
	slices.SortStableFunc(c.Runners, func(a, b Runner) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortStableFunc(c.Mailboxes, func(a, b Mailbox) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortStableFunc(c.Aliases, func(a, b Alias) int { return cmp.Compare(a.Namespace, b.Namespace) })
	return c
}

// Equal reports whether x and y describe the same routing state. Version is
// ignored: Raft commands that do not touch routing (heartbeats) advance the
// applied index, and they must not cause a push.
func (x *IR) Equal(y *IR) bool {
	if x == nil || y == nil {
		return x == y
	}
	a, b := x.Sorted(), y.Sorted()
	return a.Gateway == b.Gateway &&
		slices.Equal(a.NotFound, b.NotFound) &&
		slices.Equal(a.Runners, b.Runners) &&
		slices.Equal(a.Mailboxes, b.Mailboxes) &&
		slices.Equal(a.Aliases, b.Aliases)
}
