package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/gateway/auth"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/authtest"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

const (
	testIssuer   = "https://idp.example"
	testAudience = "prism-gateway"
)

// countingRunner is a MailboxQuery upstream that counts the calls reaching
// it and answers for the mailbox it was asked for (a namespace's is
// <namespace>@p1).
type countingRunner struct {
	mailboxv1.UnimplementedMailboxQueryServer
	calls atomic.Int64
}

func (r *countingRunner) mailbox(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(mesh.HeaderMailboxID); len(v) > 0 {
		return v[0]
	}
	if v := md.Get(mesh.HeaderNamespace); len(v) > 0 {
		return v[0] + "@p1"
	}
	return ""
}

func (r *countingRunner) GetStats(ctx context.Context, _ *mailboxv1.GetStatsRequest) (*mailboxv1.GetStatsResponse, error) {
	r.calls.Add(1)
	return &mailboxv1.GetStatsResponse{Stats: &mailboxv1.MailboxStats{MailboxId: r.mailbox(ctx), TotalEvents: 7}}, nil
}

func (r *countingRunner) QueryEvents(ctx context.Context, _ *mailboxv1.QueryEventsRequest) (*mailboxv1.QueryEventsResponse, error) {
	r.calls.Add(1)
	return &mailboxv1.QueryEventsResponse{}, nil
}

// oneProxy is the routing state of a mesh whose one proxy, p1, has its
// runner r1 at addr.
func oneProxy(cp *xdstest.ControlPlane, addr string) *ir.IR {
	return &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{cp.Addr}, Lookup: "dns:///" + cp.Addr,
		Proxies: []ir.Proxy{{ID: "p1", RunnerID: "r1", Address: addr, Healthy: true}}}
}

// authMesh is a gateway with query auth on, its HTTP and gRPC doors served
// over TLS that takes a client certificate when one is offered, routing
// demo@p1 and other@p1 (and their namespaces) to one counting runner.
type authMesh struct {
	gw         *gateway.Gateway
	auth       *auth.Authenticator
	runner     *countingRunner
	key        *authtest.Key
	jwksPath   string
	httpURL    string
	grpcAddr   string
	httpClient func(role identity.Role) *http.Client // "" role: no client certificate
	grpcConn   func(role identity.Role) *grpc.ClientConn
}

func startAuthMesh(t *testing.T) *authMesh {
	t.Helper()
	m := &authMesh{runner: &countingRunner{}, key: authtest.NewKey(t, "k1", jose.ES256)}

	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := grpc.NewServer()
	mailboxv1.RegisterMailboxQueryServer(rs, m.runner)
	go rs.Serve(rl)
	t.Cleanup(rs.Stop)

	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	// Proxy p1's runner serves demo@p1 and other@p1; the lookup routes
	// their namespaces.
	cp.Namespaces.Set("demo", "demo@p1", 1)
	cp.Namespaces.Set("other", "other@p1", 1)
	cp.Update(oneProxy(cp, rl.Addr().String()))

	m.jwksPath = filepath.Join(t.TempDir(), "jwks.json")
	authtest.WriteJWKS(t, m.jwksPath, m.key)
	a, err := auth.New(auth.Config{
		JWKSFile: m.jwksPath, Issuer: testIssuer, Audience: testAudience,
		CertRoles: []identity.Role{identity.Operator, identity.Reader}, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}

	boot, err := gateway.Bootstrap([]string{cp.Addr}, "gateway-"+t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Bootstrap: boot, Timeout: upstreamTimeout, ProbeInterval: 20 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := gw.Run(ctx); err != nil {
		t.Fatalf("gateway never got its routes: %v", err)
	}
	m.gw, m.auth = gw, a

	// The doors' TLS: a server certificate, and a client certificate
	// verified against the CA when the client offers one.
	p := pkitest.New(t)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.CA.CertPEM())
	serverCert := loadPair(t, p.Files(identity.Gateway, "gw"))
	serverTLS := &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: roots, MinVersion: tls.VersionTLS13}
	clientTLS := func(role identity.Role) *tls.Config {
		c := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
		if role != "" {
			c.Certificates = []tls.Certificate{loadPair(t, p.Files(role, "someone"))}
		}
		return c
	}

	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: gw.HTTPHandler(gateway.WithAuth(a)), TLSConfig: serverTLS.Clone()}
	go func() { _ = hs.ServeTLS(hl, "", "") }()
	t.Cleanup(func() { hs.Close() })
	m.httpURL = "https://" + hl.Addr().String()
	m.httpClient = func(role identity.Role) *http.Client {
		tr := &http.Transport{TLSClientConfig: clientTLS(role)}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}

	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS.Clone())), grpc.ChainUnaryInterceptor(gw.GRPCInterceptor(gateway.WithAuth(a))))
	gw.RegisterGRPC(gs)
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	m.grpcAddr = gl.Addr().String()
	m.grpcConn = func(role identity.Role) *grpc.ClientConn {
		cc, err := grpc.NewClient(m.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(role))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	return m
}

func loadPair(t *testing.T, f pki.Files) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// token signs claims for namespaces with k, after edit.
func token(t *testing.T, k *authtest.Key, edit func(map[string]any), namespaces ...string) string {
	t.Helper()
	c := authtest.Claims(testIssuer, testAudience, namespaces...)
	if edit != nil {
		edit(c)
	}
	return k.Sign(t, c)
}

func algNone(t *testing.T) string {
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	c, _ := json.Marshal(authtest.Claims(testIssuer, testAudience, "*"))
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c) + "."
}

func (m *authMesh) httpGet(t *testing.T, role identity.Role, tok, path string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, m.httpURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := m.httpClient(role).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

func (m *authMesh) grpcStats(t *testing.T, role identity.Role, tok, key, value string) (*mailboxv1.GetStatsResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, key, value)
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	return mailboxv1.NewMailboxQueryClient(m.grpcConn(role)).GetStats(ctx, &mailboxv1.GetStatsRequest{})
}

// TestGatewayQueryAuth: with a JWKS configured, every query through either
// door needs a token (or an operator's or reader's certificate) that may
// read the mailbox's namespace; a refused query never reaches the runner.
func TestGatewayQueryAuth(t *testing.T) {
	t.Parallel()
	m := startAuthMesh(t)
	k := m.key
	hs256 := authtest.Sign(t, jose.SigningKey{Algorithm: jose.HS256, Key: k.PublicPEM(t)}, k.ID, authtest.Claims(testIssuer, testAudience, "*"))
	expired := token(t, k, func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() }, "demo")

	const (
		byMailbox   = "mailbox"
		byNamespace = "namespace"
	)
	for _, tc := range []struct {
		name     string
		role     identity.Role // a client certificate of this role
		token    string
		by, id   string
		wantHTTP int
		wantGRPC codes.Code
		wantMsg  string // in the refusal
		wantCode string // the JSON body's code
	}{
		{"no token", "", "", byMailbox, "demo@p1", 401, codes.Unauthenticated, "no bearer token", "missing_token"},
		{"malformed token", "", "abc.def", byMailbox, "demo@p1", 401, codes.Unauthenticated, "malformed token", "invalid_token"},
		{"expired", "", expired, byMailbox, "demo@p1", 401, codes.Unauthenticated, "token expired", "invalid_token"},
		{"wrong issuer", "", token(t, k, func(c map[string]any) { c["iss"] = "https://evil.example" }, "demo"), byMailbox, "demo@p1", 401, codes.Unauthenticated, "issuer", "invalid_token"},
		{"wrong audience", "", token(t, k, func(c map[string]any) { c["aud"] = "other-service" }, "demo"), byMailbox, "demo@p1", 401, codes.Unauthenticated, "audience", "invalid_token"},
		{"alg none", "", algNone(t), byMailbox, "demo@p1", 401, codes.Unauthenticated, "malformed token", "invalid_token"},
		{"HS256 keyed with the public key", "", hs256, byMailbox, "demo@p1", 401, codes.Unauthenticated, "malformed token", "invalid_token"},
		{"key not in the JWKS", "", token(t, authtest.NewKey(t, "k9", jose.ES256), nil, "*"), byMailbox, "demo@p1", 401, codes.Unauthenticated, `key "k9"`, "invalid_token"},
		{"another namespace's token", "", token(t, k, nil, "other"), byMailbox, "demo@p1", 403, codes.PermissionDenied, `may not read namespace "demo" (it may read only other)`, "insufficient_scope"},
		{"another namespace's token by alias", "", token(t, k, nil, "other"), byNamespace, "demo", 403, codes.PermissionDenied, `namespace "demo"`, "insufficient_scope"},
		{"token without the claim", "", token(t, k, func(c map[string]any) { delete(c, "prism_namespaces") }), byMailbox, "demo@p1", 403, codes.PermissionDenied, "claim names none", "insufficient_scope"},
		{"a proxy's certificate is no token", identity.Proxy, "", byMailbox, "demo@p1", 401, codes.Unauthenticated, "no bearer token", "missing_token"},
		{"the namespace's token", "", token(t, k, nil, "demo"), byMailbox, "demo@p1", 200, codes.OK, "", ""},
		{"the namespace's token by alias", "", token(t, k, nil, "audit", "demo"), byNamespace, "demo", 200, codes.OK, "", ""},
		{"a token for every namespace", "", token(t, k, nil, "*"), byMailbox, "other@p1", 200, codes.OK, "", ""},
		{"an operator's certificate", identity.Operator, "", byMailbox, "other@p1", 200, codes.OK, "", ""},
		{"a reader's certificate", identity.Reader, "", byNamespace, "demo", 200, codes.OK, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, key := "/v1/mailboxes/"+tc.id+"/stats", mesh.HeaderMailboxID
			if tc.by == byNamespace {
				path, key = "/v1/namespaces/"+tc.id+"/stats", mesh.HeaderNamespace
			}
			wantMailbox := tc.id
			if tc.by == byNamespace {
				wantMailbox = tc.id + "@p1"
			}

			before := m.runner.calls.Load()
			r := m.httpGet(t, tc.role, tc.token, path)
			if r.code != tc.wantHTTP {
				t.Fatalf("HTTP %s = %d %s, want %d", path, r.code, r.body, tc.wantHTTP)
			}
			if tc.wantHTTP == 200 {
				if !strings.Contains(r.body, `"mailbox_id":"`+wantMailbox+`"`) || m.runner.calls.Load() != before+1 {
					t.Errorf("HTTP answer %s after %d runner calls, want the runner's stats of %s", r.body, m.runner.calls.Load()-before, wantMailbox)
				}
			} else {
				var body map[string]string
				if json.Unmarshal([]byte(r.body), &body) != nil || !strings.Contains(body["error"], tc.wantMsg) || body["code"] != tc.wantCode || r.header.Get("Content-Type") != "application/json" {
					t.Errorf("HTTP refusal %q, want JSON {error containing %q, code %q}", r.body, tc.wantMsg, tc.wantCode)
				}
				if ch := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer ") {
					t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", ch)
				}
				if n := m.runner.calls.Load() - before; n != 0 {
					t.Errorf("the runner was called %d times for a refused query", n)
				}
			}

			before = m.runner.calls.Load()
			resp, err := m.grpcStats(t, tc.role, tc.token, key, tc.id)
			if st := status.Convert(err); st.Code() != tc.wantGRPC || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("gRPC GetStats = %v, want %v containing %q", err, tc.wantGRPC, tc.wantMsg)
			}
			if tc.wantGRPC == codes.OK && resp.GetStats().GetMailboxId() != wantMailbox {
				t.Errorf("gRPC answered for %q, want %q", resp.GetStats().GetMailboxId(), wantMailbox)
			}
			wantCalls := int64(0)
			if tc.wantGRPC == codes.OK {
				wantCalls = 1
			}
			if n := m.runner.calls.Load() - before; n != wantCalls {
				t.Errorf("the runner was called %d times, want %d", n, wantCalls)
			}
		})
	}

	// A malformed query is refused before its token is looked at, and an id
	// the mesh cannot route before it is taken apart for its namespace.
	before := m.runner.calls.Load()
	if r := m.httpGet(t, "", token(t, k, nil, "other"), "/v1/mailboxes/demo@p1/events?limit=-1"); r.code != http.StatusBadRequest || !strings.Contains(r.body, `"limit: `) || m.runner.calls.Load() != before {
		t.Errorf("events of demo with bad parameters and another namespace's token = %d %s, want 400 naming limit", r.code, r.body)
	}
	if r := m.httpGet(t, "", "", "/v1/mailboxes/demo@p1@x/stats"); r.code != http.StatusBadRequest || !strings.Contains(r.body, `"mailbox_id: \"demo@p1@x\" is not a mailbox id`) || m.runner.calls.Load() != before {
		t.Errorf("stats of an id naming no namespace without a token = %d %s, want 400 naming mailbox_id", r.code, r.body)
	}
	if _, err := m.grpcStats(t, "", "", mesh.HeaderMailboxID, "demo@p1@x"); status.Code(err) != codes.InvalidArgument || m.runner.calls.Load() != before {
		t.Errorf("gRPC stats of an id naming no namespace without a token = %v, want InvalidArgument", err)
	}
	if r := m.httpGet(t, "", token(t, k, nil, "demo"), "/v1/mailboxes/demo@p1/events"); r.code != http.StatusOK || m.runner.calls.Load() != before+1 {
		t.Errorf("events of demo with its token = %d %s, want 200 from the runner", r.code, r.body)
	}

	// Probes and metrics need no token.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := m.httpGet(t, "", "", path); r.code != http.StatusOK {
			t.Errorf("GET %s without a token = %d %s, want 200", path, r.code, r.body)
		}
	}
	if resp, err := healthpb.NewHealthClient(m.grpcConn("")).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health without a token = %v, %v; want SERVING", resp, err)
	}
	metrics := m.httpGet(t, "", "", "/metrics").body
	for _, want := range []string{
		`prism_gateway_http_requests_total{code="401",method="GetStats"}`,
		`prism_gateway_http_requests_total{code="403",method="GetStats"}`,
		`prism_gateway_http_requests_total{code="400",method="QueryEvents"}`,
		`prism_gateway_grpc_requests_total{code="InvalidArgument",method="GetStats"}`,
		`prism_gateway_grpc_requests_total{code="Unauthenticated",method="GetStats"}`,
		`prism_gateway_grpc_requests_total{code="PermissionDenied",method="GetStats"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestGatewayJWKSRotation: a key added to the JWKS file is accepted by the
// running gateway, and a key removed from it refused, with no restart.
func TestGatewayJWKSRotation(t *testing.T) {
	t.Parallel()
	m := startAuthMesh(t)
	next := authtest.NewKey(t, "k2", jose.RS256)
	oldTok, newTok := token(t, m.key, nil, "demo"), token(t, next, nil, "demo")
	for _, step := range []struct {
		name             string
		publish          []*authtest.Key
		wantOld, wantNew int
	}{
		{"before", nil, 200, 401},
		{"both published", []*authtest.Key{m.key, next}, 200, 200},
		{"old key removed", []*authtest.Key{next}, 401, 200},
	} {
		if step.publish != nil {
			authtest.WriteJWKS(t, m.jwksPath, step.publish...)
		}
		for _, c := range []struct {
			which string
			tok   string
			want  int
		}{{"old", oldTok, step.wantOld}, {"new", newTok, step.wantNew}} {
			if r := m.httpGet(t, "", c.tok, "/v1/mailboxes/demo@p1/stats"); r.code != c.want {
				t.Errorf("%s: HTTP with the %s key = %d %s, want %d", step.name, c.which, r.code, r.body, c.want)
			}
			_, err := m.grpcStats(t, "", c.tok, mesh.HeaderMailboxID, "demo@p1")
			if want := map[int]codes.Code{200: codes.OK, 401: codes.Unauthenticated}[c.want]; status.Code(err) != want {
				t.Errorf("%s: gRPC with the %s key = %v, want %v", step.name, c.which, err, want)
			}
		}
	}
}

// TestGatewayWithoutAuth: no WithAuth, no checks: a query without a token
// is answered with no Authorization check at all.
func TestGatewayWithoutAuth(t *testing.T) {
	t.Parallel()
	runner := &countingRunner{}
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := grpc.NewServer()
	mailboxv1.RegisterMailboxQueryServer(rs, runner)
	go rs.Serve(rl)
	t.Cleanup(rs.Stop)
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	cp.Update(oneProxy(cp, rl.Addr().String()))
	boot, err := gateway.Bootstrap([]string{cp.Addr}, "gateway-"+t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Bootstrap: boot, Timeout: upstreamTimeout, ProbeInterval: 20 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := gw.Run(ctx); err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: gw.HTTPHandler(gateway.WithAuth(nil))}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })
	if r := get(t, "http://"+hl.Addr().String()+"/v1/mailboxes/demo@p1/stats"); r.code != http.StatusOK || runner.calls.Load() != 1 {
		t.Fatalf("without auth = %d %s, want the runner's 200", r.code, r.body)
	}
	intercept := gw.GRPCInterceptor()
	called := false
	_, err = intercept(metadata.NewIncomingContext(ctx, metadata.Pairs(mesh.HeaderMailboxID, "demo@p1")), &mailboxv1.GetStatsRequest{}, &grpc.UnaryServerInfo{FullMethod: "/prism.mailbox.v1.MailboxQuery/GetStats"}, func(context.Context, any) (any, error) {
		called = true
		return nil, errors.New("handled")
	})
	if !called || err == nil || err.Error() != "handled" {
		t.Errorf("interceptor without auth: handler called %v, err %v; want the handler's answer", called, err)
	}
}
