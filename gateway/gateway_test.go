package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

// quiet logs only warnings, which go test shows when a test fails.
func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func waitFor(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

// testRunner is a real mailbox runner hosting one mailbox of its proxy on
// loopback.
type testRunner struct {
	*runner.Runner
	id, proxy, mailbox, queryAddr, httpAddr string
}

func startRunner(t testing.TB, brokers []string, id, proxy, mailbox, topic string, epoch uint64) *testRunner {
	t.Helper()
	r, err := runner.New(runner.Config{DataDir: t.TempDir(), Brokers: brokers, BatchWait: 10 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ql, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	r.Serve(ql, hl)
	if err := r.Open(runner.MailboxConfig{ID: mailbox, Topics: []string{topic}, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	return &testRunner{Runner: r, id: id, proxy: proxy, mailbox: mailbox, queryAddr: ql.Addr().String(), httpAddr: hl.Addr().String()}
}

func produce(t testing.TB, brokers []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range n {
		b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprintf("%s-%d", topic, i), Topic: topic, PublishedAt: timestamppb.New(time.UnixMilli(int64(1e12 + i)))}})
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

type response struct {
	code   int
	header http.Header
	body   string
}

func get(t testing.TB, url string) response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

func do(t testing.TB, method, url string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

// testMesh is an in-process xDS control plane routing to two real runners,
// each serving its proxy's mailboxes, and a gateway fed by it.
type testMesh struct {
	cp     *xdstest.ControlPlane
	a, b   *testRunner
	extra  []ir.Proxy // proxies whose runners are not real
	gw     *gateway.Gateway
	url    string
	gwGRPC string
}

// publish sends the routing state at version: the proxies of the two real
// runners and the extra ones. Mailboxes are not in it; a runner serves the
// ones it holds.
func (m *testMesh) publish(version uint64) {
	x := &ir.IR{Version: version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{m.cp.Addr}, Lookup: "dns:///" + m.cp.Addr}
	for _, r := range []*testRunner{m.a, m.b} {
		x.Proxies = append(x.Proxies, ir.Proxy{ID: r.proxy, RunnerID: r.id, Address: r.queryAddr, Healthy: true})
	}
	x.Proxies = append(x.Proxies, m.extra...)
	m.cp.Update(x)
}

func startMesh(t testing.TB) *testMesh {
	t.Helper()
	var err error
	brokers := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "b.events", "a.events.dlq", "b.events.dlq")).Brokers
	produce(t, brokers, "a.events", 3)
	produce(t, brokers, "b.events", 5)
	m := &testMesh{
		a: startRunner(t, brokers, "runner-a", "proxy-a", "audit@proxy-a", "a.events", 5),
		b: startRunner(t, brokers, "runner-b", "proxy-b", "$admin@proxy-b", "b.events", 6),
	}
	for _, r := range []*testRunner{m.a, m.b} {
		waitFor(t, r.mailbox+" filled", func() (bool, string) {
			st, err := r.Stats(context.Background(), r.mailbox)
			return err == nil && st.TotalEvents > 0 && st.TotalEvents == map[string]int64{"runner-a": 3, "runner-b": 5}[r.id], fmt.Sprint(st, err)
		})
	}
	if m.cp, err = xdstest.StartControlPlane(quiet(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.cp.Close)
	boot, err := gateway.Bootstrap([]string{m.cp.Addr}, "gateway-"+t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.gw, err = gateway.New(gateway.Config{Bootstrap: boot, Timeout: upstreamTimeout, ProbeInterval: 20 * time.Millisecond, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.gw.Close() })
	hs := httptest.NewServer(m.gw.HTTPHandler())
	t.Cleanup(hs.Close)
	m.url = hs.URL
	gs := grpc.NewServer()
	m.gw.RegisterGRPC(gs)
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	m.gwGRPC = gl.Addr().String()
	return m
}

func (m *testMesh) run(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.gw.Run(ctx); err != nil {
		t.Fatalf("gateway never got its routes: %v", err)
	}
}

// upstreamTimeout bounds the gateway's calls in these tests.
const upstreamTimeout = 3 * time.Second

// hang accepts connections and never answers on them, like a runner wedged
// before it speaks HTTP/2.
func hang(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return l.Addr().String()
}

// TestGatewayHTTP: queries land on the runner holding the mailbox and are
// answered exactly as that runner answers them itself; unknown mailboxes
// are a JSON 404, bad parameters the runner's own 400, a dead runner 503.
func TestGatewayHTTP(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	if r := get(t, m.url+"/readyz"); r.code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before any routes = %d, want 503", r.code)
	}
	m.publish(1)
	m.run(t)
	if r := get(t, m.url+"/readyz"); r.code != http.StatusOK {
		t.Fatalf("/readyz with routes = %d %q", r.code, r.body)
	}

	for _, tc := range []struct {
		name, path string
		runner     *testRunner
		wantCode   int
		wantEpoch  string
	}{
		{"events of a", "/v1/mailboxes/audit@proxy-a/events", m.a, 200, "5"},
		{"events of b, encoded id", "/v1/mailboxes/%24admin%40proxy-b/events?limit=2", m.b, 200, "6"},
		{"events of b, raw id", "/v1/mailboxes/$admin@proxy-b/events?topic=b.events&start=0", m.b, 200, "6"},
		{"one event", "/v1/mailboxes/$admin@proxy-b/events/b.events-3", m.b, 200, "6"},
		{"stats of a", "/v1/mailboxes/audit@proxy-a/stats", m.a, 200, "5"},
		{"stats of b", "/v1/mailboxes/%24admin@proxy-b/stats", m.b, 200, "6"},
		{"event of another mailbox", "/v1/mailboxes/audit@proxy-a/events/b.events-3", m.a, 404, "5"},
		{"bad limit", "/v1/mailboxes/audit@proxy-a/events?limit=-1", m.a, 400, ""},
		{"unknown parameter", "/v1/mailboxes/audit@proxy-a/events?principals=x", m.a, 400, ""},
		{"bad start", "/v1/mailboxes/audit@proxy-a/events?start=yesterday", m.a, 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := get(t, m.url+tc.path)
			direct := get(t, "http://"+tc.runner.httpAddr+tc.path)
			if got.code != tc.wantCode || got.body != direct.body || got.code != direct.code {
				t.Fatalf("through the gateway %d %s\nfrom the runner      %d %s\nwant %d", got.code, got.body, direct.code, direct.body, tc.wantCode)
			}
			if ct := got.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if tc.wantEpoch != "" && (got.header.Get(mesh.HeaderEpoch) != tc.wantEpoch || got.header.Get(mesh.HeaderMailbox) != tc.runner.mailbox) {
				t.Errorf("x-prism headers = %q %q, want %q %q", got.header.Get(mesh.HeaderMailbox), got.header.Get(mesh.HeaderEpoch), tc.runner.mailbox, tc.wantEpoch)
			}
		})
	}

	var items struct {
		MailboxID string `json:"mailbox_id"`
		Items     []struct {
			Topic string `json:"topic"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(get(t, m.url+"/v1/mailboxes/$admin@proxy-b/events").body), &items); err != nil || len(items.Items) != 5 || items.Items[0].Topic != "b.events" || items.MailboxID != "$admin@proxy-b" {
		t.Fatalf("events of b = %+v, %v", items, err)
	}

	for _, path := range []string{"/v1/mailboxes/nobody@proxy-z/events", "/v1/mailboxes/nobody@proxy-z/stats", "/v1/mailboxes/nobody@proxy-z/events/m-1", "/v1/nowhere"} {
		r := get(t, m.url+path)
		var body map[string]string
		if r.code != http.StatusNotFound || json.Unmarshal([]byte(r.body), &body) != nil || body["error"] == "" {
			t.Errorf("GET %s = %d %q, want a JSON 404", path, r.code, r.body)
		}
	}

	// Another method on a query path: the runner's own JSON 405 with Allow,
	// answered by the gateway without asking the runner.
	for _, path := range []string{"/v1/mailboxes/audit@proxy-a/events", "/v1/mailboxes/audit@proxy-a/events/a.events-1", "/v1/mailboxes/audit@proxy-a/stats", "/v1/namespaces/audit/stats", "/v1/mailboxes/nobody@proxy-z/stats"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
			got := do(t, method, m.url+path)
			if got.code != http.StatusMethodNotAllowed || got.header.Get("Allow") != httpapi.Allow || !strings.Contains(got.body, `"error"`) {
				t.Errorf("%s %s = %d Allow %q %q, want a JSON 405 with Allow %q", method, path, got.code, got.header.Get("Allow"), got.body, httpapi.Allow)
			}
			if !strings.HasPrefix(path, "/v1/mailboxes/audit") {
				continue
			}
			if direct := do(t, method, "http://"+m.a.httpAddr+path); direct.code != got.code || direct.body != got.body || direct.header.Get("Allow") != got.header.Get("Allow") {
				t.Errorf("%s %s: gateway %d %q, runner %d %q; want the same answer", method, path, got.code, got.body, direct.code, direct.body)
			}
		}
	}
	if r := do(t, http.MethodPost, m.url+"/v1/nowhere"); r.code != http.StatusNotFound {
		t.Errorf("POST /v1/nowhere = %d, want 404", r.code)
	}

	// A 10 KB id or path is not echoed back whole, whoever refuses it: the
	// id as no mailbox id (400), the path as no endpoint (404).
	long := strings.Repeat("x", 10_000)
	for path, want := range map[string]int{"/v1/mailboxes/" + long + "@proxy-z/stats": http.StatusBadRequest, "/v1/" + long: http.StatusNotFound} {
		r := get(t, m.url+path)
		var body map[string]string
		if r.code != want || json.Unmarshal([]byte(r.body), &body) != nil || !strings.Contains(body["error"], strings.Repeat("x", 200)+"…") || len(body["error"]) > mesh.MaxEchoLen+300 {
			t.Errorf("GET %.30s… = %d, %d-byte error %.80q…; want a JSON %d echoing the id cut to %d bytes", path, r.code, len(body["error"]), body["error"], want, mesh.MaxEchoLen)
		}
	}

	// runner-b closes its mailbox, as its sidecar has it do before the
	// lease goes. Routes are per proxy, so nothing is published: the route
	// to proxy-b stays and runner-b itself answers a JSON 404 naming the
	// mailbox, never as the mailbox.
	if err := m.b.CloseMailbox(m.b.mailbox); err != nil {
		t.Fatal(err)
	}
	r := get(t, m.url+"/v1/mailboxes/$admin@proxy-b/stats")
	var body map[string]string
	if r.code != http.StatusNotFound || json.Unmarshal([]byte(r.body), &body) != nil || !strings.Contains(body["error"], `mailbox "$admin@proxy-b"`) {
		t.Fatalf("stats of a released mailbox = %d %q, want a JSON 404 naming it", r.code, r.body)
	}
	if h := r.header.Get(mesh.HeaderMailbox) + r.header.Get(mesh.HeaderEpoch); h != "" {
		t.Errorf("released mailbox answered with x-prism headers %q %q", r.header.Get(mesh.HeaderMailbox), r.header.Get(mesh.HeaderEpoch))
	}

	// A runner that never answers: 504 once the gateway's timeout is up.
	m.extra = []ir.Proxy{{ID: "proxy-h", RunnerID: "runner-h", Address: hang(t), Healthy: true}}
	m.publish(2)
	var took time.Duration
	waitFor(t, "stuck mailbox 504", func() (bool, string) {
		start := time.Now()
		r := get(t, m.url+"/v1/mailboxes/stuck@proxy-h/stats")
		took = time.Since(start)
		return r.code == http.StatusGatewayTimeout, fmt.Sprint(r.code, r.body)
	})
	if took < upstreamTimeout || took > upstreamTimeout+2*time.Second {
		t.Errorf("504 after %v, want the upstream timeout %v", took, upstreamTimeout)
	}

	// runner-a dies while it still holds its lease: 503, never a hang.
	m.a.Close()
	start := time.Now()
	r = get(t, m.url+"/v1/mailboxes/audit@proxy-a/stats")
	if r.code != http.StatusServiceUnavailable || json.Unmarshal([]byte(r.body), &body) != nil || !strings.Contains(body["error"], "no runner available") {
		t.Fatalf("stats of a mailbox whose runner is down = %d %q, want a JSON 503", r.code, r.body)
	}
	if took := time.Since(start); took > upstreamTimeout {
		t.Errorf("503 took %v, past the upstream timeout", took)
	}

	metrics := get(t, m.url+"/metrics").body
	for _, want := range []string{
		`prism_gateway_http_requests_total{code="200",method="QueryEvents"}`,
		`prism_gateway_http_requests_total{code="400",method="QueryEvents"}`,
		`prism_gateway_http_requests_total{code="404",method="GetStats"}`,
		`prism_gateway_http_requests_total{code="503",method="GetStats"}`,
		`prism_gateway_http_requests_total{code="504",method="GetStats"}`,
		`prism_gateway_request_seconds_count{api="http",method="GetStats"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestGatewayGRPC: the gRPC front door forwards MailboxQuery calls by their
// x-mailbox-id, passing back the runner's answer, code and headers.
func TestGatewayGRPC(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	cc, err := grpc.NewClient(m.gwGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	if resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before routes = %v, %v; want NOT_SERVING", resp, err)
	}
	m.publish(1)
	m.run(t)
	if resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health with routes = %v, %v; want SERVING", resp, err)
	}

	qc := mailboxv1.NewMailboxQueryClient(cc)
	call := func(mailbox string) (*mailboxv1.GetStatsResponse, metadata.MD, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if mailbox != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, mailbox)
		}
		var hdr metadata.MD
		resp, err := qc.GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
		return resp, hdr, err
	}
	for _, tc := range []struct {
		mailbox string
		events  int64
		epoch   string
	}{{"audit@proxy-a", 3, "5"}, {"$admin@proxy-b", 5, "6"}} {
		resp, hdr, err := call(tc.mailbox)
		if err != nil || resp.GetStats().GetTotalEvents() != tc.events || resp.GetStats().GetMailboxId() != tc.mailbox {
			t.Fatalf("GetStats %s = %v, %v", tc.mailbox, resp, err)
		}
		if got := hdr.Get(mesh.HeaderEpoch); len(got) != 1 || got[0] != tc.epoch {
			t.Errorf("GetStats %s epoch header = %v, want %s", tc.mailbox, got, tc.epoch)
		}
	}
	if _, _, err := call("nobody@proxy-z"); status.Code(err) != codes.NotFound {
		t.Errorf("unknown mailbox = %v, want NotFound", err)
	}
	if _, _, err := call(""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no x-mailbox-id = %v, want InvalidArgument", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, "audit@proxy-a")
	if _, err := qc.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Limit: -1}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("negative limit = %v, want the runner's InvalidArgument", err)
	}
	m.b.Close()
	if _, _, err := call("$admin@proxy-b"); status.Code(err) != codes.Unavailable {
		t.Errorf("runner down = %v, want Unavailable", err)
	}
}

// TestGatewayNamespaces: /v1/namespaces/{ns}/... answers byte for byte as
// /v1/mailboxes/{id}/... for the namespace's current mailbox (grpc-go's RLS
// asks the admin's lookup where the call's x-prism-namespace goes, the
// runner finds the mailbox), over HTTP and gRPC; a namespace the lookup does
// not route is a JSON 404 naming it.
func TestGatewayNamespaces(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	// audit@proxy-a is served but its namespace has no route in the lookup.
	m.cp.Namespaces.Set("$admin", "$admin@proxy-b", 6)
	m.publish(1)
	m.run(t)

	for _, tc := range []struct{ namespace, mailbox string }{
		{"/v1/namespaces/$admin/events", "/v1/mailboxes/$admin@proxy-b/events"},
		{"/v1/namespaces/%24admin/events?limit=2&topic=b.events", "/v1/mailboxes/$admin@proxy-b/events?limit=2&topic=b.events"},
		{"/v1/namespaces/$admin/events/b.events-3", "/v1/mailboxes/$admin@proxy-b/events/b.events-3"},
		{"/v1/namespaces/$admin/events/a.events-1", "/v1/mailboxes/$admin@proxy-b/events/a.events-1"},
		{"/v1/namespaces/$admin/stats", "/v1/mailboxes/$admin@proxy-b/stats"},
		{"/v1/namespaces/$admin/events?limit=-1", "/v1/mailboxes/$admin@proxy-b/events?limit=-1"},
	} {
		t.Run(tc.namespace, func(t *testing.T) {
			got, want := get(t, m.url+tc.namespace), get(t, m.url+tc.mailbox)
			if got.code != want.code || got.body != want.body {
				t.Fatalf("by namespace %d %s\nby mailbox   %d %s", got.code, got.body, want.code, want.body)
			}
			for _, h := range []string{"Content-Type", mesh.HeaderMailbox, mesh.HeaderEpoch} {
				if got.header.Get(h) != want.header.Get(h) {
					t.Errorf("%s = %q, by mailbox %q", h, got.header.Get(h), want.header.Get(h))
				}
			}
			if want.code == http.StatusOK && got.header.Get(mesh.HeaderMailbox) != "$admin@proxy-b" {
				t.Errorf("x-prism-mailbox = %q, want the mailbox that answered", got.header.Get(mesh.HeaderMailbox))
			}
		})
	}
	if r := get(t, m.url+"/v1/namespaces/$admin/stats"); r.code != http.StatusOK || !strings.Contains(r.body, `"total_events":5,`) {
		t.Errorf("stats by namespace = %d %s, want runner-b's 5 events", r.code, r.body)
	}

	for _, ns := range []string{"nobody", "audit", "$admi"} {
		for _, path := range []string{"/events", "/stats", "/events/m-1"} {
			r := get(t, m.url+"/v1/namespaces/"+ns+path)
			var body map[string]string
			if r.code != http.StatusNotFound || json.Unmarshal([]byte(r.body), &body) != nil || !strings.Contains(body["error"], fmt.Sprintf("namespace %q", ns)) {
				t.Errorf("GET /v1/namespaces/%s%s = %d %q, want a JSON 404 naming the namespace", ns, path, r.code, r.body)
			}
		}
	}

	cc, err := grpc.NewClient(m.gwGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	qc := mailboxv1.NewMailboxQueryClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var hdr metadata.MD
	resp, err := qc.GetStats(metadata.AppendToOutgoingContext(ctx, mesh.HeaderNamespace, "$admin"), &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
	if err != nil || resp.GetStats().GetMailboxId() != "$admin@proxy-b" || resp.GetStats().GetTotalEvents() != 5 || resp.GetStats().GetEpoch() != 6 {
		t.Fatalf("gRPC GetStats by namespace = %v, %v", resp, err)
	}
	if got := hdr.Get(mesh.HeaderMailbox); len(got) != 1 || got[0] != "$admin@proxy-b" {
		t.Errorf("gRPC %s = %v", mesh.HeaderMailbox, got)
	}
	if got := hdr.Get(mesh.HeaderEpoch); len(got) != 1 || got[0] != "6" {
		t.Errorf("gRPC %s = %v", mesh.HeaderEpoch, got)
	}
	_, err = qc.GetStats(metadata.AppendToOutgoingContext(ctx, mesh.HeaderNamespace, "nobody"), &mailboxv1.GetStatsRequest{})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), `namespace "nobody"`) {
		t.Errorf("gRPC GetStats of an unknown namespace = %v, want NotFound naming it", err)
	}
}
