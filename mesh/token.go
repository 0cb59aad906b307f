package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The query-token rules both query front ends apply: prism gateway, which
// verifies a bearer token itself (gateway/auth), and the admins' ext_authz
// for Envoy, which reads the payload Envoy's jwt_authn verified (xds/lookup).
// Both turn a token's claims into a Principal with Claimed and refuse with an
// *AuthError, so a caller gets the same answer whichever gateway it goes
// through (docs/security.md#query-tokens).

// AllNamespaces in the namespaces claim (DefaultNamespacesClaim) lets a token
// read every namespace.
const AllNamespaces = "*"

// Principal is an authenticated caller and what it may read.
type Principal struct {
	// Subject names the caller in logs: the token's sub, or the
	// certificate's identity.
	Subject    string
	all        bool
	namespaces []string
	claim      string // the token's namespaces claim, named in refusals
}

// ReadsEverything is a caller that may read every namespace: one whose
// client certificate is of a role trusted to read everything.
func ReadsEverything(subject string) Principal { return Principal{Subject: subject, all: true} }

// All reports a caller that may read every namespace.
func (p Principal) All() bool { return p.all }

// Namespaces are the namespaces the caller may read, when not All.
func (p Principal) Namespaces() []string { return slices.Clone(p.namespaces) }

// MayReadNamespace refuses (403) a namespace the caller may not read.
func (p Principal) MayReadNamespace(ns string) error {
	if p.all || slices.Contains(p.namespaces, ns) {
		return nil
	}
	return p.forbidden(fmt.Sprintf("namespace %q", Echo(ns)))
}

// MayReadMailbox refuses (403) a mailbox whose namespace the caller may not
// read. An id that is not namespace@proxy_id names no namespace, so only a
// caller that may read all of them gets it through (to a 404).
func (p Principal) MayReadMailbox(id string) error {
	if p.all {
		return nil
	}
	mid, err := ParseMailboxID(id)
	if err != nil {
		return p.forbidden(fmt.Sprintf("mailbox %q, which names no namespace", Echo(id)))
	}
	return p.MayReadNamespace(mid.Namespace)
}

func (p Principal) forbidden(what string) error {
	may := "no namespace"
	if p.claim != "" {
		may += ": its " + p.claim + " claim names none"
	}
	if len(p.namespaces) > 0 {
		may = "only " + Echo(strings.Join(p.namespaces, ", "))
	}
	return &AuthError{Kind: Forbidden, Msg: fmt.Sprintf("%s may not read %s (it may read %s)", Echo(p.Subject), what, may)}
}

// Claimed is the principal of a token whose signature and standard claims
// were checked: its subject, and the namespaces claim (named claim) as raw
// JSON, nil if absent. prism gateway passes the claims it verified, the
// admins' ext_authz the payload Envoy's jwt_authn verified, so both gateways
// read the claim alike. A malformed claim is an InvalidToken refusal.
func Claimed(subject, claim string, namespaces json.RawMessage) (Principal, error) {
	p := Principal{Subject: subject, claim: claim}
	if p.Subject == "" {
		p.Subject = "token without sub"
	}
	var err error
	if p.namespaces, err = parseNamespaces(namespaces); err != nil {
		return Principal{}, &AuthError{Kind: InvalidToken, Msg: fmt.Sprintf("claim %s: %v", claim, err)}
	}
	for _, ns := range p.namespaces {
		if ns == AllNamespaces {
			p.all, p.namespaces = true, nil
			break
		}
	}
	return p, nil
}

// parseNamespaces reads a namespaces claim: a list of names, or one name;
// absent or null is none.
func parseNamespaces(raw json.RawMessage) ([]string, error) {
	if raw == nil {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("want a list of namespace names, or \"*\"")
	}
	out := list[:0]
	for _, ns := range list {
		if ns != "" {
			out = append(out, ns)
		}
	}
	return out, nil
}

// AuthKind is what a query refusal is about.
type AuthKind int

const (
	// MissingToken: the caller sent no credentials (401).
	MissingToken AuthKind = iota
	// InvalidToken: the token is malformed, badly signed, expired or not
	// meant for this gateway (401).
	InvalidToken
	// Forbidden: the caller may not read the namespace (403).
	Forbidden
	// KeysUnavailable: no signing keys could be loaded to check the token
	// with (503).
	KeysUnavailable
)

// AuthError is a query refusal; its message names what is missing.
type AuthError struct {
	Kind AuthKind
	Msg  string
}

func (e *AuthError) Error() string { return e.Msg }

// Code is the refusal's machine-readable name, RFC 6750's where it has one.
func (e *AuthError) Code() string {
	switch e.Kind {
	case MissingToken:
		return "missing_token"
	case InvalidToken:
		return "invalid_token"
	case Forbidden:
		return "insufficient_scope"
	default:
		return "keys_unavailable"
	}
}

// HTTPStatus is the status the refusal is answered with.
func (e *AuthError) HTTPStatus() int {
	switch e.Kind {
	case MissingToken, InvalidToken:
		return http.StatusUnauthorized
	case Forbidden:
		return http.StatusForbidden
	default:
		return http.StatusServiceUnavailable
	}
}

// AuthRealm is the realm of the WWW-Authenticate challenges.
const AuthRealm = "prism"

// Challenge is the WWW-Authenticate value of a refusal (RFC 6750 section 3);
// "" for one that is not about the caller's credentials.
func (e *AuthError) Challenge() string {
	switch e.Kind {
	case MissingToken:
		return `Bearer realm="` + AuthRealm + `"`
	case InvalidToken, Forbidden:
		return `Bearer realm="` + AuthRealm + `", error="` + e.Code() + `"`
	default:
		return ""
	}
}

// GRPCStatus is the refusal as a gRPC status, so status.Code and
// status.Convert read it and a handler can return it as it is.
func (e *AuthError) GRPCStatus() *status.Status {
	c := codes.Unavailable
	switch e.Kind {
	case MissingToken, InvalidToken:
		c = codes.Unauthenticated
	case Forbidden:
		c = codes.PermissionDenied
	}
	return status.New(c, e.Msg)
}

// Body is the refusal's HTTP body: the JSON of every refusal of the query
// API, {"error": ...}, with the refusal's code next to it, and a newline.
func (e *AuthError) Body() []byte {
	b, _ := json.Marshal(map[string]string{"error": e.Msg, "code": e.Code()}) // strings only: cannot fail
	return append(b, '\n')
}

// Write answers the refusal over HTTP: its status, its challenge and Body.
func (e *AuthError) Write(w http.ResponseWriter) {
	if c := e.Challenge(); c != "" {
		w.Header().Set("WWW-Authenticate", c)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.HTTPStatus())
	_, _ = w.Write(e.Body()) // the client went away; nothing to tell it
}
