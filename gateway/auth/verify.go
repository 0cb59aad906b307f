package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/prism-mesh/prism/mesh"
)

// Algorithms are the signature algorithms a token may use: asymmetric only,
// so the JWKS's public keys can never serve as an HMAC secret.
var Algorithms = []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.EdDSA}

func invalid(format string, args ...any) error {
	return &mesh.AuthError{Kind: mesh.InvalidToken, Msg: fmt.Sprintf(format, args...)}
}

// Verify checks a bearer token (its signature, issuer, audience and times)
// and reads the namespaces it may read.
func (a *Authenticator) Verify(ctx context.Context, token string) (mesh.Principal, error) {
	if a.file == nil && a.url == nil {
		return mesh.Principal{}, invalid("this gateway has no JWKS to check tokens with")
	}
	return a.verify(ctx, token)
}

func (a *Authenticator) verify(ctx context.Context, token string) (mesh.Principal, error) {
	if token == "" {
		return mesh.Principal{}, invalid("empty bearer token")
	}
	if len(token) > MaxTokenLen {
		return mesh.Principal{}, invalid("bearer token of %d bytes is longer than %d", len(token), MaxTokenLen)
	}
	jws, err := jose.ParseSignedCompact(token, Algorithms)
	if err != nil {
		return mesh.Principal{}, invalid("malformed token (a JWS signed with one of %v expected): %v", Algorithms, err)
	}
	h := jws.Signatures[0].Header
	keys, err := a.keysFor(ctx, h.KeyID)
	if err != nil {
		return mesh.Principal{}, err
	}
	var payload []byte
	for _, k := range keys {
		if k.Algorithm != "" && k.Algorithm != h.Algorithm {
			continue
		}
		if payload, err = jws.Verify(k.Key); err == nil {
			break
		}
	}
	if payload == nil {
		if h.KeyID != "" {
			return mesh.Principal{}, invalid("signature does not verify with key %q of the JWKS", mesh.Echo(h.KeyID))
		}
		return mesh.Principal{}, invalid("signature does not verify with any key of the JWKS")
	}
	return a.principal(payload)
}

// keysFor are the keys a token naming kid may be signed with: the one key
// of that id, or every key for a token naming none.
func (a *Authenticator) keysFor(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	var all []jose.JSONWebKey
	if a.file != nil {
		all = append(all, a.file.get()...)
	}
	if a.url != nil {
		keys, err := a.url.get(ctx, kid)
		if err != nil && len(all) == 0 {
			return nil, err
		}
		all = append(all, keys...)
	}
	if kid == "" {
		return all, nil
	}
	var out []jose.JSONWebKey
	for _, k := range all {
		if k.KeyID == kid {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, invalid("token signed by key %q, which the JWKS does not hold", mesh.Echo(kid))
	}
	return out, nil
}

// principal checks the claims of a token whose signature verified.
func (a *Authenticator) principal(payload []byte) (mesh.Principal, error) {
	var std jwt.Claims
	if err := json.Unmarshal(payload, &std); err != nil {
		return mesh.Principal{}, invalid("token claims: %v", err)
	}
	var extra map[string]json.RawMessage
	if err := json.Unmarshal(payload, &extra); err != nil {
		return mesh.Principal{}, invalid("token claims: %v", err)
	}
	if std.Expiry == nil {
		return mesh.Principal{}, invalid("token has no exp claim; tokens must expire")
	}
	now := a.cfg.Clock.Now()
	err := std.ValidateWithLeeway(jwt.Expected{Issuer: a.cfg.Issuer, AnyAudience: jwt.Audience{a.cfg.Audience}, Time: now}, a.cfg.Leeway)
	switch {
	case err == nil:
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return mesh.Principal{}, invalid("token issuer %q is not %q", mesh.Echo(std.Issuer), a.cfg.Issuer)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return mesh.Principal{}, invalid("token audience %q does not include %q", mesh.Echo(fmt.Sprint([]string(std.Audience))), a.cfg.Audience)
	case errors.Is(err, jwt.ErrExpired):
		return mesh.Principal{}, invalid("token expired at %s", std.Expiry.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrNotValidYet):
		return mesh.Principal{}, invalid("token not valid before %s", std.NotBefore.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return mesh.Principal{}, invalid("token issued in the future, at %s", std.IssuedAt.Time().UTC().Format(time.RFC3339))
	default:
		return mesh.Principal{}, invalid("token claims: %v", err)
	}
	return mesh.Claimed(std.Subject, a.cfg.NamespacesClaim, extra[a.cfg.NamespacesClaim])
}
