// Package xdsenvoy runs a real Envoy against the in-process control plane
// with the bootstrap from envoy/, and queries through it. It needs an envoy
// binary on PATH and skips, saying so, without one.
package xdsenvoy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/mailbox/query"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/testproc"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// held is the one mailbox the test runner serves, under epoch 7.
const held, heldEpoch, heldNamespace = "$admin@proxy-01", 7, "$admin"

// TestEnvoyGatewayRoutesByMailbox: Envoy routes a mailbox by its proxy
// (x-mailbox-id's suffix for gRPC, the path for HTTP) to that proxy's
// runner, which answers for what it holds with x-prism-mailbox and
// x-prism-epoch and NotFound / a JSON 404 naming the mailbox otherwise; a
// namespace is resolved by the admin's ext_authz; a mailbox of no
// registered proxy is the JSON 404 over HTTP and the admin's NotFound
// naming it over gRPC.
func TestEnvoyGatewayRoutesByMailbox(t *testing.T) {
	bin, err := exec.LookPath("envoy")
	if err != nil {
		t.Skip("envoy not on PATH: skipping the real-Envoy gateway test; put an envoy binary on PATH to run it (the resources Envoy would get are still checked by xds/translator's golden tests and ValidateAll)")
	}
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cp, err := xdstest.StartControlPlane(log, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	const runner = "runner-a"
	addr := startRunner(t, runner)
	cp.Namespaces.Set(heldNamespace, held, heldEpoch)

	gateway, admin := testproc.FreeAddr(t), testproc.FreeAddr(t)
	cp.Update(&ir.IR{
		Version: 1,
		Gateway: ir.Gateway{Address: gateway},
		Admins:  []string{cp.Addr},
		Lookup:  "dns:///" + cp.Addr,
		Proxies: []ir.Proxy{{ID: "proxy-01", RunnerID: runner, Address: addr, Healthy: true}},
	})
	boot, err := envoy.YAML(envoy.Config{NodeID: "test-gateway", AdminNodes: []string{cp.Addr}, AdminAddress: admin})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(path, boot, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-c", path, "--base-id", fmt.Sprint(time.Now().UnixNano()%100000),
		"--log-level", "warn", "--disable-hot-restart")
	logf, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("envoy log:\n%s", b)
		}
	}()

	// A mailbox of no registered proxy over HTTP: the direct 404 with a
	// JSON body.
	var first response
	poll(t, "gateway answers HTTP", func() bool {
		var err error
		first, err = get("http://" + gateway + "/v1/mailboxes/nobody@proxy-09/events")
		return err == nil
	})
	if first.code != http.StatusNotFound || first.header.Get("content-type") != "application/json" || first.body != translator.NotFoundBody {
		t.Fatalf("unknown proxy's mailbox over HTTP: %d %q %s", first.code, first.header.Get("content-type"), first.body)
	}

	// HTTP by mailbox and by namespace: the path picks proxy-01's route,
	// or ext_authz names the namespace's mailbox; the runner answers, with
	// the mailbox and epoch that served.
	for _, path := range []string{"/v1/mailboxes/$admin@proxy-01/stats", "/v1/mailboxes/%24admin%40proxy-01/stats", "/v1/namespaces/$admin/stats", "/v1/namespaces/%24admin/stats"} {
		var r response
		poll(t, path+" answered by the runner", func() bool {
			var err error
			r, err = get("http://" + gateway + path)
			return err == nil && r.code == http.StatusOK
		})
		var body struct {
			MailboxID string `json:"mailbox_id"`
			Epoch     uint64 `json:"epoch"`
		}
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.MailboxID != held || body.Epoch != heldEpoch {
			t.Errorf("GET %s = %s, want the stats of %s at epoch %d", path, r.body, held, heldEpoch)
		}
		if r.header.Get(xdstest.RunnerHeader) != runner || r.header.Get(mesh.HeaderMailbox) != held || r.header.Get(mesh.HeaderEpoch) != fmt.Sprint(heldEpoch) {
			t.Errorf("GET %s answered by %q as %q epoch %q, want %s as %s epoch %d", path,
				r.header.Get(xdstest.RunnerHeader), r.header.Get(mesh.HeaderMailbox), r.header.Get(mesh.HeaderEpoch), runner, held, heldEpoch)
		}
	}

	// HTTP refusals: a mailbox of proxy-01 the runner does not hold is the
	// runner's 404 naming it; a namespace the lookup does not route is
	// Envoy's 404 for namespaces. Both JSON.
	for _, tc := range []struct{ path, want string }{
		{"/v1/mailboxes/other@proxy-01/stats", `mailbox \"other@proxy-01\" is not served here`},
		{"/v1/namespaces/nobody/stats", "namespace is not routed"},
	} {
		r, err := get("http://" + gateway + tc.path)
		if err != nil || r.code != http.StatusNotFound || r.header.Get("content-type") != "application/json" || !strings.Contains(r.body, tc.want) {
			t.Errorf("GET %s = %d %q %s, %v; want a JSON 404 containing %s", tc.path, r.code, r.header.Get("content-type"), r.body, err, tc.want)
		}
	}

	// gRPC through Envoy: routed by x-mailbox-id, or by x-prism-namespace
	// through ext_authz, answered by the runner, who answered named in the
	// response headers.
	conn, err := grpc.NewClient(gateway, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := mailboxv1.NewMailboxQueryClient(conn)
	for _, kv := range [][]string{{mesh.HeaderMailboxID, held}, {mesh.HeaderNamespace, heldNamespace}} {
		var hdr metadata.MD
		poll(t, "gRPC by "+kv[0]+" routed to the runner", func() bool {
			ctx := metadata.AppendToOutgoingContext(context.Background(), kv...)
			_, err := client.GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
			return err == nil
		})
		if got := hdr.Get(xdstest.RunnerHeader); len(got) != 1 || got[0] != runner {
			t.Errorf("by %s: answered by %v, want %s", kv[0], got, runner)
		}
		if m, e := hdr.Get(mesh.HeaderMailbox), hdr.Get(mesh.HeaderEpoch); len(m) != 1 || m[0] != held || len(e) != 1 || e[0] != fmt.Sprint(heldEpoch) {
			t.Errorf("by %s: x-prism-mailbox %v x-prism-epoch %v, want %s and %d", kv[0], m, e, held, heldEpoch)
		}
	}

	// gRPC refusals, each NotFound naming what was asked: a mailbox of no
	// registered proxy from the admin node, one of proxy-01 the runner does
	// not hold from the runner, a namespace the lookup does not route from
	// the admin node.
	for _, kv := range [][]string{{mesh.HeaderMailboxID, "ghost@proxy-02"}, {mesh.HeaderMailboxID, "other@proxy-01"}, {mesh.HeaderNamespace, "nobody"}} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), kv...)
		if _, err := client.GetStats(ctx, &mailboxv1.GetStatsRequest{}); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), kv[1]) {
			t.Errorf("GetStats %s=%s: %v, want NotFound naming it", kv[0], kv[1], err)
		}
	}
}

// startRunner serves what a runner's query port does, gRPC (with health)
// and the HTTP API on one h2c port, from mailbox/query over the one mailbox
// held; every answer names the runner in xdstest.RunnerHeader. It returns
// the port's address.
func startRunner(t *testing.T, id string) string {
	t.Helper()
	mb := mailboxes{}
	m := query.NewMetrics(prometheus.NewRegistry())
	named := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs(xdstest.RunnerHeader, id))
		return h(ctx, req)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(named))
	query.NewGRPCServer(mb, m).Register(g)
	healthpb.RegisterHealthServer(g, health.NewServer())
	api := query.NewHTTPHandler(mb, m)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protocols, ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		w.Header().Set(xdstest.RunnerHeader, id)
		api.ServeHTTP(w, r)
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// mailboxes is a runner holding only the mailbox held.
type mailboxes struct{}

func (mailboxes) Mailbox(id string) (query.Source, uint64, bool) {
	if id != held {
		return nil, 0, false
	}
	return source{}, heldEpoch, true
}

func (mailboxes) IDs() []string { return []string{held} }

// source is an empty mailbox.
type source struct{}

func (source) Query(context.Context, *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error) {
	return &mailboxv1.QueryEventsResponse{}, nil
}

func (source) Get(_ context.Context, id string) (*mailboxv1.MailboxItem, error) {
	return nil, status.Errorf(codes.NotFound, "message_id %q not found", id)
}

func (source) Stats(context.Context) (*mailboxv1.MailboxStats, error) {
	return &mailboxv1.MailboxStats{}, nil
}

type response struct {
	code   int
	header http.Header
	body   string
}

func get(url string) (response, error) {
	resp, err := http.Get(url)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}, err
}

func poll(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
