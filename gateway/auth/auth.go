// Package auth decides who may read which namespaces through prism gateway.
//
// A caller proves who it is with a JWT bearer token (Authorization: Bearer,
// over HTTP or as gRPC metadata) signed by a key of the configured JWKS, or,
// where the gateway serves mutual TLS, with a client certificate of a role
// trusted to read everything (operator, reader). A token's namespaces claim
// (default prism_namespaces) lists the namespaces it may read; "*" is every
// namespace.
//
// Only asymmetric signatures are accepted (RS256, ES256, EdDSA), so neither
// an unsigned token (alg "none") nor one "signed" with HS256 using a public
// key as the secret gets in: the algorithm list is checked before any key is
// touched, and a JWKS holding a symmetric key is refused outright. The
// issuer, audience, exp (required) and nbf are checked with a small leeway
// for clock skew.
//
// The namespaces claim and the refusals are the query-token rules both
// gateways share (mesh.Claimed, mesh.AuthError): 401 with WWW-Authenticate:
// Bearer for a missing or bad token (gRPC Unauthenticated), 403 for a
// namespace the caller may not read (PermissionDenied), 503 while no signing
// keys could be loaded (Unavailable).
package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
)

// MaxTokenLen bounds the tokens the gateway parses; real ones are a few
// hundred bytes.
const MaxTokenLen = 8 << 10

// Config says where the signing keys are and what a token must say. Fields
// left zero take the defaults given.
type Config struct {
	// JWKSFile is a JSON Web Key Set on disk, re-read when it changes
	// (a rotated key is accepted, a removed one refused, without a restart).
	JWKSFile string
	// JWKSURL is a JSON Web Key Set served over https, fetched with
	// FetchTimeout and kept for CacheFor; a token signed by a key it does not
	// know yet makes it fetch again, at most once per MinRefresh.
	JWKSURL string
	// Issuer must equal the token's iss. Required with a JWKS.
	Issuer string
	// Audience must be among the token's aud. Required with a JWKS.
	Audience string
	// NamespacesClaim names the claim holding the namespaces a token may
	// read (a list of names, or one name; "*" is all); default
	// mesh.DefaultNamespacesClaim.
	NamespacesClaim string
	// Leeway allowed on exp, nbf and iat for clock skew; default 30s.
	Leeway time.Duration
	// CertRoles are the roles whose client certificate reads every
	// namespace without a token. The certificate is taken as the handshake
	// left it, so the listener's TLS must verify client certificates
	// against the trust bundle (pki.Source.ServerConfig, or
	// VerifyClientCertIfGiven with ClientCAs), never RequestClientCert.
	// Empty: certificates are not accepted in place of a token.
	CertRoles []identity.Role
	// FetchTimeout bounds one fetch of JWKSURL; default 5s.
	FetchTimeout time.Duration
	// CacheFor is how long a fetched JWKS is used before it is fetched
	// again (in the background; the old keys serve meanwhile); default 5m.
	CacheFor time.Duration
	// MinRefresh is the least time between two fetches of JWKSURL, so
	// tokens naming unknown keys cannot make the gateway hammer the
	// identity provider; default 10s.
	MinRefresh time.Duration
	// HTTPClient fetches JWKSURL; default a client trusting the system
	// roots that follows redirects to https only.
	HTTPClient *http.Client
	// Clock tells the time tokens are checked against (default the real one).
	Clock clock.PassiveClock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Authenticator checks callers against a Config.
type Authenticator struct {
	cfg  Config
	log  *slog.Logger
	file *fileKeys
	url  *urlKeys
}

// New checks cfg and loads the JWKS file; it fetches JWKSURL once and only
// warns when that fails (queries are answered 503 until keys arrive). It
// needs a JWKS, or CertRoles for a gateway that takes certificates only.
func New(cfg Config) (*Authenticator, error) {
	if cfg.JWKSFile == "" && cfg.JWKSURL == "" && len(cfg.CertRoles) == 0 {
		return nil, errors.New("auth: no JWKS file or URL, and no certificate roles: nothing could authenticate a caller")
	}
	if cfg.JWKSFile != "" || cfg.JWKSURL != "" {
		if cfg.Issuer == "" {
			return nil, errors.New("auth: the issuer tokens must name (iss) is required with a JWKS")
		}
		if cfg.Audience == "" {
			return nil, errors.New("auth: the audience tokens must name (aud) is required with a JWKS")
		}
	}
	if cfg.NamespacesClaim == "" {
		cfg.NamespacesClaim = mesh.DefaultNamespacesClaim
	}
	if cfg.Leeway <= 0 {
		cfg.Leeway = 30 * time.Second
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 5 * time.Second
	}
	if cfg.CacheFor <= 0 {
		cfg.CacheFor = 5 * time.Minute
	}
	if cfg.MinRefresh <= 0 {
		cfg.MinRefresh = 10 * time.Second
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{CheckRedirect: httpsOnly}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Authenticator{cfg: cfg, log: cfg.Logger}
	if cfg.JWKSFile != "" {
		f, err := loadFileKeys(cfg.JWKSFile, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
		a.file = f
	}
	if cfg.JWKSURL != "" {
		u, err := url.Parse(cfg.JWKSURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("auth: JWKS URL %q: want https://host/path", cfg.JWKSURL)
		}
		a.url = &urlKeys{cfg: cfg}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.FetchTimeout)
		defer cancel()
		if err := a.url.refresh(ctx); err != nil {
			a.log.Warn("JWKS not fetched; queries are refused until it is", "url", cfg.JWKSURL, "err", err)
		}
	}
	return a, nil
}

// Request authenticates an HTTP request: a client certificate of a
// CertRoles identity, else its bearer token.
func (a *Authenticator) Request(r *http.Request) (mesh.Principal, error) {
	if p, ok := a.certificate(identity.FromRequest(r)); ok {
		return p, nil
	}
	return a.bearer(r.Context(), r.Header.Values("Authorization"))
}

// Call authenticates a gRPC call: a client certificate of a CertRoles
// identity, else the bearer token in its authorization metadata.
func (a *Authenticator) Call(ctx context.Context) (mesh.Principal, error) {
	if p, ok := a.certificate(identity.FromContext(ctx)); ok {
		return p, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return a.bearer(ctx, md.Get("authorization"))
}

func (a *Authenticator) certificate(id identity.Identity, err error) (mesh.Principal, bool) {
	if err != nil || !slices.Contains(a.cfg.CertRoles, id.Role) {
		return mesh.Principal{}, false
	}
	return mesh.ReadsEverything(id.String()), true
}

// bearer verifies the token of the one Authorization value given.
func (a *Authenticator) bearer(ctx context.Context, values []string) (mesh.Principal, error) {
	how := "send Authorization: Bearer <JWT>"
	if len(a.cfg.CertRoles) > 0 {
		how += fmt.Sprintf(" or a client certificate of role %v", a.cfg.CertRoles)
	}
	switch {
	case len(values) == 0:
		return mesh.Principal{}, &mesh.AuthError{Kind: mesh.MissingToken, Msg: "no bearer token: " + how}
	case len(values) > 1:
		return mesh.Principal{}, &mesh.AuthError{Kind: mesh.InvalidToken, Msg: "more than one Authorization value"}
	}
	scheme, token, _ := strings.Cut(values[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return mesh.Principal{}, &mesh.AuthError{Kind: mesh.MissingToken, Msg: fmt.Sprintf("Authorization is not a bearer token (scheme %q): %s", mesh.Echo(scheme), how)}
	}
	if a.file == nil && a.url == nil {
		return mesh.Principal{}, &mesh.AuthError{Kind: mesh.InvalidToken, Msg: "this gateway takes no tokens, only client certificates of role " + fmt.Sprint(a.cfg.CertRoles)}
	}
	return a.verify(ctx, strings.TrimSpace(token))
}
