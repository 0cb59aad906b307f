package auth_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/gateway/auth"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/testkit/authtest"
)

const (
	issuer   = "https://idp.example"
	audience = "prism-gateway"
)

// kindOf is the refusal kind of err, or -1 for none.
func kindOf(t *testing.T, err error) mesh.AuthKind {
	t.Helper()
	if err == nil {
		return -1
	}
	var e *mesh.AuthError
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *mesh.AuthError", err, err)
	}
	return e.Kind
}

func withFile(t *testing.T, keys ...*authtest.Key) (*auth.Authenticator, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jwks.json")
	authtest.WriteJWKS(t, path, keys...)
	a, err := auth.New(auth.Config{JWKSFile: path, Issuer: issuer, Audience: audience})
	if err != nil {
		t.Fatal(err)
	}
	return a, path
}

// unsigned is a token with alg "none" and no signature.
func unsigned(claims map[string]any) string {
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	c, _ := json.Marshal(claims)
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c) + "."
}

func TestVerify(t *testing.T) {
	t.Parallel()
	es, rs, ed := authtest.NewKey(t, "es", jose.ES256), authtest.NewKey(t, "rs", jose.RS256), authtest.NewKey(t, "ed", jose.EdDSA)
	stranger := authtest.NewKey(t, "es", jose.ES256) // same kid, not in the JWKS
	a, _ := withFile(t, es, rs, ed)

	claims := func(edit func(map[string]any)) map[string]any {
		c := authtest.Claims(issuer, audience, "demo")
		if edit != nil {
			edit(c)
		}
		return c
	}
	now := time.Now()
	for _, tc := range []struct {
		name       string
		token      string
		wantErr    string // a substring of the refusal; "" accepts
		wantNS     []string
		wantAll    bool
		wantSubjct string
	}{
		{name: "ES256", token: es.Sign(t, claims(nil)), wantNS: []string{"demo"}, wantSubjct: "test-user"},
		{name: "RS256", token: rs.Sign(t, claims(nil)), wantNS: []string{"demo"}},
		{name: "EdDSA", token: ed.Sign(t, claims(nil)), wantNS: []string{"demo"}},
		{name: "no kid tries every key", token: authtest.Sign(t, jose.SigningKey{Algorithm: jose.RS256, Key: rs.Private()}, "", claims(nil)), wantNS: []string{"demo"}},
		{name: "all namespaces", token: es.Sign(t, claims(func(c map[string]any) { c["prism_namespaces"] = []string{"demo", "*"} })), wantAll: true},
		{name: "one namespace as a string", token: es.Sign(t, claims(func(c map[string]any) { c["prism_namespaces"] = "other" })), wantNS: []string{"other"}},
		{name: "no namespaces claim", token: es.Sign(t, claims(func(c map[string]any) { delete(c, "prism_namespaces") }))},
		{name: "audience among several", token: es.Sign(t, claims(func(c map[string]any) { c["aud"] = []string{"x", audience} })), wantNS: []string{"demo"}},
		{name: "expired within the leeway", token: es.Sign(t, claims(func(c map[string]any) { c["exp"] = now.Add(-10 * time.Second).Unix() })), wantNS: []string{"demo"}},

		{name: "empty", token: "", wantErr: "empty bearer token"},
		{name: "garbage", token: "not.a.token", wantErr: "malformed token"},
		{name: "too long", token: strings.Repeat("a", auth.MaxTokenLen+1), wantErr: "longer than"},
		{name: "alg none", token: unsigned(claims(nil)), wantErr: "malformed token"},
		{name: "HS256 keyed with the public key", token: authtest.Sign(t, jose.SigningKey{Algorithm: jose.HS256, Key: rs.PublicPEM(t)}, "rs", claims(nil)), wantErr: "malformed token"},
		{name: "signed by a stranger's key of a known kid", token: stranger.Sign(t, claims(nil)), wantErr: `does not verify with key "es"`},
		{name: "unknown kid", token: authtest.NewKey(t, "nobody", jose.ES256).Sign(t, claims(nil)), wantErr: `key "nobody", which the JWKS does not hold`},
		{name: "expired", token: es.Sign(t, claims(func(c map[string]any) { c["exp"] = now.Add(-time.Hour).Unix() })), wantErr: "token expired at"},
		{name: "no exp", token: es.Sign(t, claims(func(c map[string]any) { delete(c, "exp") })), wantErr: "no exp claim"},
		{name: "not yet valid", token: es.Sign(t, claims(func(c map[string]any) { c["nbf"] = now.Add(time.Hour).Unix() })), wantErr: "not valid before"},
		{name: "issued in the future", token: es.Sign(t, claims(func(c map[string]any) { c["iat"] = now.Add(time.Hour).Unix() })), wantErr: "issued in the future"},
		{name: "wrong issuer", token: es.Sign(t, claims(func(c map[string]any) { c["iss"] = "https://evil.example" })), wantErr: `issuer "https://evil.example" is not "` + issuer + `"`},
		{name: "no issuer", token: es.Sign(t, claims(func(c map[string]any) { delete(c, "iss") })), wantErr: "issuer"},
		{name: "wrong audience", token: es.Sign(t, claims(func(c map[string]any) { c["aud"] = "another-service" })), wantErr: `does not include "` + audience + `"`},
		{name: "no audience", token: es.Sign(t, claims(func(c map[string]any) { delete(c, "aud") })), wantErr: "audience"},
		{name: "namespaces claim of numbers", token: es.Sign(t, claims(func(c map[string]any) { c["prism_namespaces"] = []int{1} })), wantErr: "claim prism_namespaces"},
		{name: "exp of the wrong type", token: es.Sign(t, claims(func(c map[string]any) { c["exp"] = "tomorrow" })), wantErr: "token claims"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := a.Verify(context.Background(), tc.token)
			if tc.wantErr != "" {
				if kindOf(t, err) != mesh.InvalidToken || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Verify = %+v, %v; want an invalid_token refusal containing %q", p, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if p.All() != tc.wantAll || fmt.Sprint(p.Namespaces()) != fmt.Sprint(tc.wantNS) {
				t.Errorf("principal all=%v namespaces=%v, want all=%v %v", p.All(), p.Namespaces(), tc.wantAll, tc.wantNS)
			}
			if tc.wantSubjct != "" && p.Subject != tc.wantSubjct {
				t.Errorf("subject %q, want %q", p.Subject, tc.wantSubjct)
			}
		})
	}
}

func TestNamespacesClaimName(t *testing.T) {
	t.Parallel()
	k := authtest.NewKey(t, "k", jose.ES256)
	path := filepath.Join(t.TempDir(), "jwks.json")
	authtest.WriteJWKS(t, path, k)
	a, err := auth.New(auth.Config{JWKSFile: path, Issuer: issuer, Audience: audience, NamespacesClaim: "groups"})
	if err != nil {
		t.Fatal(err)
	}
	c := authtest.Claims(issuer, audience, "*")
	c["groups"] = []string{"team-a"}
	p, err := a.Verify(context.Background(), k.Sign(t, c))
	if err != nil || p.All() || fmt.Sprint(p.Namespaces()) != "[team-a]" {
		t.Fatalf("Verify with claim groups = %+v, %v; want team-a only (prism_namespaces ignored)", p, err)
	}
}

func TestMayRead(t *testing.T) {
	t.Parallel()
	k := authtest.NewKey(t, "k", jose.ES256)
	a, _ := withFile(t, k)
	principal := func(ns ...string) mesh.Principal {
		c := authtest.Claims(issuer, audience, ns...)
		if ns == nil {
			delete(c, "prism_namespaces")
		}
		p, err := a.Verify(context.Background(), k.Sign(t, c))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	demo, all, none := principal("demo", "audit"), principal("*"), principal()
	for _, tc := range []struct {
		name    string
		p       mesh.Principal
		mailbox string // or namespace
		ns      bool
		wantErr string
	}{
		{"own mailbox", demo, "demo@p1", false, ""},
		{"other mailbox", demo, "other@p1", false, `test-user may not read namespace "other" (it may read only demo, audit)`},
		{"bad mailbox id", demo, "nonsense", false, `mailbox "nonsense", which names no namespace`},
		{"a second @", demo, "demo@p1@p2", false, "names no namespace"},
		{"empty namespace", demo, "@p1", false, "names no namespace"},
		{"own namespace", demo, "audit", true, ""},
		{"other namespace", demo, "other", true, `namespace "other"`},
		{"namespace prefix", demo, "dem", true, `namespace "dem"`},
		{"all: any mailbox", all, "other@p1", false, ""},
		{"all: a bad id goes on to its 404", all, "nonsense", false, ""},
		{"no claim: nothing", none, "demo@p1", false, "its prism_namespaces claim names none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var err error
			if tc.ns {
				err = tc.p.MayReadNamespace(tc.mailbox)
			} else {
				err = tc.p.MayReadMailbox(tc.mailbox)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if kindOf(t, err) != mesh.Forbidden || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("= %v, want a 403 containing %q", err, tc.wantErr)
			}
			if st := status.Convert(err); st.Code() != codes.PermissionDenied {
				t.Errorf("gRPC code %v, want PermissionDenied", st.Code())
			}
		})
	}
}

func TestRequestCredentials(t *testing.T) {
	t.Parallel()
	k := authtest.NewKey(t, "k", jose.ES256)
	a, _ := withFile(t, k)
	good := k.Sign(t, authtest.Claims(issuer, audience, "demo"))
	for _, tc := range []struct {
		name          string
		header        []string
		wantKind      mesh.AuthKind
		wantChallenge string
	}{
		{"token", []string{"Bearer " + good}, -1, ""},
		{"lower-case scheme", []string{"bearer " + good}, -1, ""},
		{"none", nil, mesh.MissingToken, `Bearer realm="prism"`},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, mesh.MissingToken, `Bearer realm="prism"`},
		{"scheme alone", []string{"Bearer"}, mesh.InvalidToken, `Bearer realm="prism", error="invalid_token"`},
		{"two headers", []string{"Bearer " + good, "Bearer " + good}, mesh.InvalidToken, `Bearer realm="prism", error="invalid_token"`},
		{"bad token", []string{"Bearer x.y.z"}, mesh.InvalidToken, `Bearer realm="prism", error="invalid_token"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "/v1/mailboxes/demo@p1/stats", nil)
			for _, v := range tc.header {
				r.Header.Add("Authorization", v)
			}
			_, err := a.Request(r)
			if got := kindOf(t, err); got != tc.wantKind {
				t.Fatalf("Request = %v, kind %d; want kind %d", err, got, tc.wantKind)
			}
			if err == nil {
				return
			}
			var e *mesh.AuthError
			errors.As(err, &e)
			w := httptest.NewRecorder()
			e.Write(w)
			var body map[string]string
			if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") != tc.wantChallenge ||
				json.Unmarshal(w.Body.Bytes(), &body) != nil || body["error"] != e.Msg || body["code"] != e.Code() || w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("answer %d %q %q, want 401 with challenge %q and {error, code}", w.Code, w.Header().Get("WWW-Authenticate"), w.Body, tc.wantChallenge)
			}
			if status.Code(err) != codes.Unauthenticated {
				t.Errorf("gRPC code %v, want Unauthenticated", status.Code(err))
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	k := authtest.NewKey(t, "k", jose.ES256)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	authtest.WriteJWKS(t, good, k)
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	private, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: k.Private(), KeyID: "p"}}})
	for _, tc := range []struct {
		name    string
		cfg     auth.Config
		wantErr string
	}{
		{"nothing", auth.Config{}, "nothing could authenticate"},
		{"no issuer", auth.Config{JWKSFile: good, Audience: audience}, "issuer"},
		{"no audience", auth.Config{JWKSFile: good, Issuer: issuer}, "audience"},
		{"missing file", auth.Config{JWKSFile: filepath.Join(dir, "nope.json"), Issuer: issuer, Audience: audience}, "no such file"},
		{"not JSON", auth.Config{JWKSFile: write("bad.json", "{"), Issuer: issuer, Audience: audience}, "JWKS"},
		{"no keys", auth.Config{JWKSFile: write("empty.json", `{"keys":[]}`), Issuer: issuer, Audience: audience}, "no signing keys"},
		{"symmetric key", auth.Config{JWKSFile: write("oct.json", `{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0"}]}`), Issuer: issuer, Audience: audience}, "[]uint8 refused"},
		{"private key", auth.Config{JWKSFile: write("priv.json", string(private)), Issuer: issuer, Audience: audience}, "*ecdsa.PrivateKey refused"},
		{"plain http URL", auth.Config{JWKSURL: "http://idp.example/jwks", Issuer: issuer, Audience: audience}, "want https"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := auth.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestJWKSFileRotation: a key added to the file is accepted and a key taken
// out refused on the next request; a broken file keeps the keys before it.
func TestJWKSFileRotation(t *testing.T) {
	t.Parallel()
	old, next := authtest.NewKey(t, "old", jose.ES256), authtest.NewKey(t, "next", jose.RS256)
	a, path := withFile(t, old)
	verify := func(k *authtest.Key) error {
		_, err := a.Verify(context.Background(), k.Sign(t, authtest.Claims(issuer, audience, "demo")))
		return err
	}
	steps := []struct {
		name    string
		change  func()
		old, nx bool // accepted
	}{
		{"old key only", func() {}, true, false},
		{"both published", func() { authtest.WriteJWKS(t, path, old, next) }, true, true},
		{"old one removed", func() { authtest.WriteJWKS(t, path, next) }, false, true},
		{"broken file keeps the last keys", func() {
			if err := os.WriteFile(path, []byte(`{"keys": [`), 0o600); err != nil {
				t.Fatal(err)
			}
		}, false, true},
		{"file gone keeps the last keys", func() { os.Remove(path) }, false, true},
		{"back to the old key", func() { authtest.WriteJWKS(t, path, old) }, true, false},
	}
	for _, s := range steps {
		s.change()
		if err := verify(old); (err == nil) != s.old {
			t.Errorf("%s: old key: %v, want accepted=%v", s.name, err, s.old)
		}
		if err := verify(next); (err == nil) != s.nx {
			t.Errorf("%s: next key: %v, want accepted=%v", s.name, err, s.nx)
		}
	}
}

// jwksServer serves a JWKS over https and counts its fetches.
type jwksServer struct {
	srv     *httptest.Server
	fetches atomic.Int32
	body    atomic.Pointer[[]byte]
	fail    atomic.Bool
}

func newJWKSServer(t *testing.T, keys ...*authtest.Key) *jwksServer {
	s := &jwksServer{}
	s.set(t, keys...)
	s.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		if s.fail.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Write(*s.body.Load())
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *jwksServer) set(t *testing.T, keys ...*authtest.Key) {
	b := authtest.JWKS(t, keys...)
	s.body.Store(&b)
}

// TestJWKSURL: fetched once at start and cached; a token of a key not
// cached yet fetches again, but not more than once per MinRefresh; the
// cache is refreshed in the background once CacheFor is past, and a failed
// refresh keeps the keys fetched before.
func TestJWKSURL(t *testing.T) {
	t.Parallel()
	k1, k2, k3 := authtest.NewKey(t, "k1", jose.ES256), authtest.NewKey(t, "k2", jose.ES256), authtest.NewKey(t, "k3", jose.EdDSA)
	s := newJWKSServer(t, k1)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	a, err := auth.New(auth.Config{JWKSURL: s.srv.URL + "/jwks", Issuer: issuer, Audience: audience, HTTPClient: s.srv.Client(),
		Clock: clk, MinRefresh: time.Minute, CacheFor: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	verify := func(k *authtest.Key) error {
		c := authtest.Claims(issuer, audience, "demo")
		c["exp"] = clk.Now().Add(time.Hour).Unix()
		c["iat"] = clk.Now().Unix()
		_, err := a.Verify(context.Background(), k.Sign(t, c))
		return err
	}
	if err := verify(k1); err != nil || s.fetches.Load() != 1 {
		t.Fatalf("k1 = %v after %d fetches, want accepted after the one at start", err, s.fetches.Load())
	}
	for range 3 {
		if err := verify(k1); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches, want the cached keys used", n)
	}

	s.set(t, k1, k2)
	if err := verify(k2); kindOf(t, err) != mesh.InvalidToken || s.fetches.Load() != 1 {
		t.Fatalf("k2 within MinRefresh of the last fetch = %v (%d fetches); want refused without a fetch", err, s.fetches.Load())
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	if err := verify(k2); err != nil || s.fetches.Load() != 2 {
		t.Fatalf("k2 after MinRefresh = %v (%d fetches); want accepted after a second fetch", err, s.fetches.Load())
	}

	// Past CacheFor: the request is answered from the cache, a refresh runs
	// behind it and brings k3.
	s.set(t, k3)
	clk.SetTime(clk.Now().Add(11 * time.Minute))
	if err := verify(k1); err != nil {
		t.Fatalf("k1 from the stale cache: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for verify(k1) == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := verify(k3); err != nil || verify(k1) == nil {
		t.Fatalf("after the background refresh: k3 %v, k1 %v; want k3 in, k1 out", err, verify(k1))
	}

	// The identity provider fails: the keys fetched before keep serving.
	s.fail.Store(true)
	clk.SetTime(clk.Now().Add(time.Hour))
	before := s.fetches.Load()
	if err := verify(k2); kindOf(t, err) != mesh.InvalidToken {
		t.Fatalf("k2 while the JWKS fails = %v, want refused", err)
	}
	if err := verify(k3); err != nil {
		t.Fatalf("k3 while the JWKS fails = %v, want the cached key to serve", err)
	}
	if s.fetches.Load() == before {
		t.Errorf("no fetch was tried for the unknown kid")
	}
}

// TestJWKSURLUnavailable: with no keys ever fetched, a token is answered
// 503 (the gateway's fault, not the caller's), and keys are fetched once
// the identity provider is back.
func TestJWKSURLUnavailable(t *testing.T) {
	t.Parallel()
	k := authtest.NewKey(t, "k", jose.ES256)
	s := newJWKSServer(t, k)
	s.fail.Store(true)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	a, err := auth.New(auth.Config{JWKSURL: s.srv.URL, Issuer: issuer, Audience: audience, HTTPClient: s.srv.Client(), Clock: clk})
	if err != nil {
		t.Fatalf("New must not fail on an identity provider that is down: %v", err)
	}
	tok := k.Sign(t, authtest.Claims(issuer, audience, "demo"))
	_, err = a.Verify(context.Background(), tok)
	if kindOf(t, err) != mesh.KeysUnavailable || status.Code(err) != codes.Unavailable {
		t.Fatalf("Verify with no keys = %v, want KeysUnavailable", err)
	}
	var e *mesh.AuthError
	errors.As(err, &e)
	if e.HTTPStatus() != http.StatusServiceUnavailable || e.Challenge() != "" {
		t.Errorf("answered %d with challenge %q, want 503 and none", e.HTTPStatus(), e.Challenge())
	}
	s.fail.Store(false)
	clk.SetTime(clk.Now().Add(time.Minute))
	if _, err := a.Verify(context.Background(), tok); err != nil {
		t.Fatalf("Verify once the JWKS is back: %v", err)
	}
}
