package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startSingle runs an in-memory single-node admin and returns its clients.
func startSingle(t *testing.T) (*Node, adminv1.ControlPlaneClient, adminv1.AdminClient, *grpc.ClientConn) {
	t.Helper()
	return startSingleAt(t, clock.RealClock{}, 0)
}

// startSingleAt is startSingle on clk. On a fake clock it returns once the
// leader loops' tickers wait on it, so a step reaches every loop.
func startSingleAt(t *testing.T, clk clock.WithTicker, staleAfter time.Duration) (*Node, adminv1.ControlPlaneClient, adminv1.AdminClient, *grpc.ClientConn) {
	t.Helper()
	return startSingleWith(t, clk, staleAfter, MoveConfig{})
}

// startSingleWith is startSingleAt with the mover's settings.
func startSingleWith(t *testing.T, clk clock.WithTicker, staleAfter time.Duration, moves MoveConfig) (*Node, adminv1.ControlPlaneClient, adminv1.AdminClient, *grpc.ClientConn) {
	t.Helper()
	n, cc := startNodeConn(t, NodeConfig{
		Raft:     raftnode.Config{ID: "solo", Bootstrap: true},
		HTTPAddr: "127.0.0.1:0", Clock: clk, StaleProxyAfter: staleAfter,
		XDS: true, GatewayAddr: "127.0.0.1:8080", Moves: moves,
	})
	deadline := time.Now().Add(20 * time.Second)
	for l, _ := n.Raft.Leadership(); !l.IsLeader || !n.Lessor.Primary(); l, _ = n.Raft.Leadership() {
		if time.Now().After(deadline) {
			t.Fatal("single node never became leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if fake, ok := clk.(*clocktesting.FakeClock); ok {
		// expiry, checkpoint, stale proxies and the mover
		awaitState(t, "the leader loops' tickers", func() bool { return fake.Waiters() == 4 })
	}
	return n, adminv1.NewControlPlaneClient(cc), adminv1.NewAdminClient(cc), cc
}

// placeOn registers proxy with runner as its runner and creates namespace
// ns, which placement puts on proxy when it is the only live one: the
// mailbox "{ns}@{proxy}" may then be acquired by runner.
func placeOn(t *testing.T, c context.Context, cp adminv1.ControlPlaneClient, proxy, runner, ns string) {
	t.Helper()
	reg := &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:9000", RunnerId: runner}
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: reg}); err != nil {
		t.Fatal(err)
	}
	res, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
	if err != nil || res.GetNamespace().GetAssignedProxyId() != proxy {
		t.Fatalf("create namespace %s: %v, %v", ns, res, err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestLeaseLifecycleOnOneNode(t *testing.T) {
	t.Parallel()
	n, cp, adm, _ := startSingle(t)
	c := ctx(t)
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000", RunnerId: "r1"}}); err != nil {
		t.Fatal(err)
	}
	// A '$' name is the admin's own: a caller may neither create nor
	// delete one, the admin makes $admin itself.
	if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "$admin", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a caller's create of $admin: %v, want PermissionDenied", err)
	}
	if err := n.Server.EnsureAudit(c, "t"); err != nil {
		t.Fatalf("ensure $admin: %v", err)
	}
	if err := n.Server.EnsureAudit(c, "t"); err != nil {
		t.Fatalf("ensure $admin again: %v", err)
	}
	ns, err := adm.GetNamespace(c, &adminv1.GetNamespaceRequest{Namespace: "$admin"})
	if err != nil || ns.GetNamespace().GetAssignedProxyId() != "p1" || !slices.Equal(ns.GetNamespace().GetConfig().GetTopics(), []string{"t"}) {
		t.Fatalf("$admin: %v, %v", ns, err)
	}
	if _, err := cp.DeleteNamespace(c, &adminv1.DeleteNamespaceRequest{Namespace: "$admin"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a caller's delete of $admin: %v, want PermissionDenied", err)
	}
	acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "$admin@p1", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	if err != nil || !acq.GetGranted() || acq.GetLease().GetEpoch() == 0 {
		t.Fatalf("acquire: %v, %v", acq, err)
	}
	// p1's runner is replaced while r1 holds the lease.
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000", RunnerId: "r2"}}); err != nil {
		t.Fatal(err)
	}
	other, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "$admin@p1", RunnerId: "r2", RunnerAddress: "127.0.0.1:9002"})
	if err != nil || other.GetGranted() || other.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER ||
		other.GetRefusal().GetCurrent().GetRunnerId() != "r1" {
		t.Fatalf("second acquire: %v, %v", other, err)
	}
	hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "$admin@p1", RunnerId: "r1", Epoch: acq.GetLease().GetEpoch()})
	if err != nil || !hb.GetRenewed() {
		t.Fatalf("heartbeat: %v, %v", hb, err)
	}
	hb, err = cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "$admin@p1", RunnerId: "r2"})
	if err != nil || hb.GetRenewed() || hb.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER {
		t.Fatalf("heartbeat by non-holder: %v, %v", hb, err)
	}
	for _, cons := range []adminv1.Consistency{adminv1.Consistency_CONSISTENCY_STALE, adminv1.Consistency_CONSISTENCY_LINEARIZABLE} {
		ls, err := adm.ListLeases(c, &adminv1.ListLeasesRequest{Consistency: cons, Namespace: "$admin"})
		if err != nil || len(ls.GetLeases()) != 1 {
			t.Fatalf("list leases (%v): %v, %v", cons, ls, err)
		}
		rt, err := adm.GetRoute(c, &adminv1.GetRouteRequest{MailboxId: "$admin@p1", Consistency: cons})
		if err != nil || rt.GetRoute().GetRunnerAddress() != "127.0.0.1:9001" {
			t.Fatalf("get route (%v): %v, %v", cons, rt, err)
		}
	}
	rel, err := cp.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "$admin@p1", RunnerId: "r1"})
	if err != nil || !rel.GetReleased() {
		t.Fatalf("release: %v, %v", rel, err)
	}
	if _, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "$admin@p1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get released lease: %v", err)
	}
	st, err := adm.GetClusterStatus(c, &adminv1.GetClusterStatusRequest{})
	if err != nil || st.GetLeaderId() != "solo" || st.GetState() != "Leader" || len(st.GetMembers()) != 1 ||
		st.GetMembers()[0].GetGrpcAddress() != n.GRPCAddr() || st.GetNamespaceCount() != 1 {
		t.Fatalf("cluster status: %v, %v", st, err)
	}
}

// awaitState polls until cond holds; the leader loops run on their own
// tickers, so the test waits for them instead of sleeping.
func awaitState(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLeaseExpiresOnlyAfterTTLPlusGrace(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n, cp, adm, _ := startSingleAt(t, clk, 0)
	c := ctx(t)
	// scanAfter steps the clock by d and waits for the expiry scan the step
	// set off: a step of at least the scan interval passes exactly one tick.
	interval := n.Server.cfg.ExpiryInterval
	scanAfter := func(d time.Duration) {
		t.Helper()
		scans := scrapeValue(t, n, "prism_admin_lease_expiry_scans_total")
		clk.Step(d)
		awaitState(t, "an expiry scan", func() bool { return scrapeValue(t, n, "prism_admin_lease_expiry_scans_total") >= scans+1 })
	}
	placeOn(t, c, cp, "p", "r1", "a")
	acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001", Ttl: durationpb.New(time.Second)})
	if err != nil || !acq.GetGranted() {
		t.Fatalf("acquire: %v, %v", acq, err)
	}
	grace := acq.GetLease().GetGrace().AsDuration()
	// Up to just before expires + grace: several expiry scans pass, the
	// lease stays.
	scanAfter(time.Second + grace - time.Millisecond - 2*interval)
	scanAfter(interval)
	scanAfter(interval)
	if _, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "a@p"}); err != nil {
		t.Fatalf("lease gone before expires+grace: %v", err)
	}
	hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r1"})
	if err != nil || !hb.GetRenewed() {
		t.Fatalf("heartbeat within grace: %v, %v", hb, err)
	}
	// The renewal moved the deadline: a scan past the old one leaves it.
	scanAfter(interval)
	if _, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "a@p"}); err != nil {
		t.Fatalf("renewed lease gone: %v", err)
	}
	scanAfter(time.Second + grace)
	awaitState(t, "the lease to expire", func() bool {
		_, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "a@p"})
		return status.Code(err) == codes.NotFound
	})
	hb, err = cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r1"})
	if err != nil || hb.GetRenewed() || hb.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE {
		t.Fatalf("heartbeat after expiry: %v, %v", hb, err)
	}
	if v := scrapeValue(t, n, "prism_admin_lease_expirations_total"); v != 1 {
		t.Fatalf("expirations = %v", v)
	}
}

func TestStaleProxyLosesItsNamespaces(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	_, cp, adm, _ := startSingleAt(t, clk, 30*time.Second)
	c := ctx(t)
	for _, p := range []string{"p1", "p2"} {
		if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: p, Address: "127.0.0.1:9000"}}); err != nil {
			t.Fatal(err)
		}
	}
	var onP2 string
	for i := 0; onP2 == ""; i++ {
		name := fmt.Sprintf("ns-%d", i)
		r, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: name, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
		if err != nil {
			t.Fatal(err)
		}
		if r.GetNamespace().GetAssignedProxyId() == "p2" {
			onP2 = name
		}
	}
	watch, err := cp.WatchAssignments(c, &adminv1.WatchAssignmentsRequest{ProxyId: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range first.GetAssignments() {
		if a.GetNamespace() == onP2 {
			t.Fatalf("%s already on p1", onP2)
		}
	}
	// p1 keeps heartbeating; p2 goes silent past the stale time.
	clk.Step(20 * time.Second)
	if _, err := cp.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}); err != nil {
		t.Fatal(err)
	}
	clk.Step(15 * time.Second)
	awaitState(t, "p2 to be marked stale", func() bool {
		r, err := adm.GetProxy(c, &adminv1.GetProxyRequest{ProxyId: "p2"})
		return err == nil && r.GetProxy().GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_STALE
	})
	if r, _ := adm.GetProxy(c, &adminv1.GetProxyRequest{ProxyId: "p1"}); r.GetProxy().GetProxy().GetStatus() != adminv1.ProxyStatus_PROXY_STATUS_LIVE {
		t.Fatalf("p1 marked stale although it heartbeated: %v", r)
	}
	ns, err := adm.GetNamespace(c, &adminv1.GetNamespaceRequest{Namespace: onP2})
	if err != nil || ns.GetNamespace().GetAssignedProxyId() != "p1" {
		t.Fatalf("%s after p2 went stale: %v, %v", onP2, ns, err)
	}
	for {
		next, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range next.GetAssignments() {
			if a.GetNamespace() == onP2 {
				return
			}
		}
	}
}

func scrape(t *testing.T, n *Node) string {
	t.Helper()
	resp, err := http.Get("http://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// scrapeValue sums a metric's samples.
func scrapeValue(t *testing.T, n *Node, name string) float64 {
	t.Helper()
	total := 0.0
	for _, l := range strings.Split(scrape(t, n), "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}

func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	n, _, _, cc := startSingle(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + n.HTTPAddr() + p)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", p, resp, err)
		}
		resp.Body.Close()
	}
	hc := healthpb.NewHealthClient(cc)
	c := ctx(t)
	for {
		r, err := hc.Check(c, &healthpb.HealthCheckRequest{})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if c.Err() != nil {
			t.Fatalf("health never SERVING: %v %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	body := scrape(t, n)
	for _, want := range []string{
		`prism_admin_raft_state{state="Leader"} 1`, "prism_admin_raft_term ", "prism_admin_raft_commit_seconds_bucket",
		"prism_admin_fsm_apply_seconds_bucket", `prism_admin_leases{status="live"}`, "prism_admin_raft_leader 1",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestBadInputGetsInvalidArgument(t *testing.T) {
	t.Parallel()
	_, cp, adm, _ := startSingle(t)
	c := ctx(t)
	long := strings.Repeat("x", 254)
	cfg := &adminv1.NamespaceConfig{Topics: []string{"t"}}
	calls := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"register: no registration", func() error { _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{}); return err }, codes.InvalidArgument},
		{"register: proxy id with @", func() error {
			_, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "a@b", Address: "127.0.0.1:1"}})
			return err
		}, codes.InvalidArgument},
		{"register: bad address", func() error {
			_, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p", Address: "nohost"}})
			return err
		}, codes.InvalidArgument},
		{"proxy heartbeat: empty id", func() error { _, err := cp.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{}); return err }, codes.InvalidArgument},
		{"proxy heartbeat: unregistered", func() error {
			_, err := cp.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "ghost"})
			return err
		}, codes.NotFound},
		{"create namespace: empty", func() error {
			_, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Config: cfg})
			return err
		}, codes.InvalidArgument},
		{"create namespace: too long", func() error {
			_, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: long, Config: cfg})
			return err
		}, codes.InvalidArgument},
		{"create namespace: no topics", func() error {
			_, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "n", Config: &adminv1.NamespaceConfig{}})
			return err
		}, codes.InvalidArgument},
		{"delete namespace: empty", func() error { _, err := cp.DeleteNamespace(c, &adminv1.DeleteNamespaceRequest{}); return err }, codes.InvalidArgument},
		{"acquire: mailbox without @", func() error {
			_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "nope", RunnerId: "r", RunnerAddress: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument},
		{"acquire: empty runner", func() error {
			_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerAddress: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument},
		{"acquire: ttl too short", func() error {
			_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r", RunnerAddress: "127.0.0.1:1", Ttl: durationpb.New(time.Millisecond)})
			return err
		}, codes.InvalidArgument},
		{"acquire: ttl too long", func() error {
			_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r", RunnerAddress: "127.0.0.1:1", Ttl: durationpb.New(48 * time.Hour)})
			return err
		}, codes.InvalidArgument},
		{"heartbeat: empty mailbox", func() error {
			_, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{RunnerId: "r"})
			return err
		}, codes.InvalidArgument},
		{"heartbeat: runner with space", func() error {
			_, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r 1"})
			return err
		}, codes.InvalidArgument},
		{"release: two @", func() error {
			_, err := cp.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "a@p@q", RunnerId: "r"})
			return err
		}, codes.InvalidArgument},
		{"get namespace: empty", func() error { _, err := adm.GetNamespace(c, &adminv1.GetNamespaceRequest{}); return err }, codes.InvalidArgument},
		{"get namespace: missing", func() error {
			_, err := adm.GetNamespace(c, &adminv1.GetNamespaceRequest{Namespace: "none"})
			return err
		}, codes.NotFound},
		{"get proxy: empty", func() error { _, err := adm.GetProxy(c, &adminv1.GetProxyRequest{}); return err }, codes.InvalidArgument},
		{"get proxy: missing", func() error { _, err := adm.GetProxy(c, &adminv1.GetProxyRequest{ProxyId: "none"}); return err }, codes.NotFound},
		{"get lease: bad id", func() error { _, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "@p"}); return err }, codes.InvalidArgument},
		{"get route: bad id", func() error { _, err := adm.GetRoute(c, &adminv1.GetRouteRequest{MailboxId: "n@"}); return err }, codes.InvalidArgument},
		{"list leases: bad filter", func() error {
			_, err := adm.ListLeases(c, &adminv1.ListLeasesRequest{ProxyId: "a@b"})
			return err
		}, codes.InvalidArgument},
		{"list namespaces: unknown consistency", func() error {
			_, err := adm.ListNamespaces(c, &adminv1.ListNamespacesRequest{Consistency: 42})
			return err
		}, codes.InvalidArgument},
		{"list routes: unknown consistency", func() error {
			_, err := adm.ListRoutes(c, &adminv1.ListRoutesRequest{Consistency: -1})
			return err
		}, codes.InvalidArgument},
		{"list proxies: unknown consistency", func() error {
			_, err := adm.ListProxies(c, &adminv1.ListProxiesRequest{Consistency: 3})
			return err
		}, codes.InvalidArgument},
		{"add voter: empty id", func() error {
			_, err := adm.AddVoter(c, &adminv1.AddVoterRequest{RaftAddress: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument},
		{"add voter: bad address", func() error {
			_, err := adm.AddVoter(c, &adminv1.AddVoterRequest{Id: "x", RaftAddress: "127.0.0.1:0"})
			return err
		}, codes.InvalidArgument},
		{"add voter: bad grpc address", func() error {
			_, err := adm.AddVoter(c, &adminv1.AddVoterRequest{Id: "x", RaftAddress: "127.0.0.1:1", GrpcAddress: "nowhere"})
			return err
		}, codes.InvalidArgument},
		{"remove server: empty id", func() error { _, err := adm.RemoveServer(c, &adminv1.RemoveServerRequest{}); return err }, codes.InvalidArgument},
		{"watch: empty proxy", func() error {
			s, err := cp.WatchAssignments(c, &adminv1.WatchAssignmentsRequest{})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.want {
				t.Fatalf("code = %v (%v), want %v", status.Code(err), err, tc.want)
			}
			if msg := status.Convert(err).Message(); msg == "" {
				t.Fatal("error without a message")
			}
		})
	}
	st, err := adm.GetClusterStatus(c, &adminv1.GetClusterStatusRequest{})
	if err != nil || st.GetNamespaceCount() != 0 || st.GetLeaseCount() != 0 || st.GetProxyCount() != 0 {
		t.Fatalf("bad input changed state: %v, %v", st, err)
	}
}

func TestWatchAssignmentsFollowsChanges(t *testing.T) {
	t.Parallel()
	_, cp, _, _ := startSingle(t)
	c := ctx(t)
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000"}}); err != nil {
		t.Fatal(err)
	}
	stream, err := cp.WatchAssignments(c, &adminv1.WatchAssignmentsRequest{ProxyId: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || len(first.GetAssignments()) != 0 || len(first.GetPartitionRanges()) == 0 {
		t.Fatalf("first message: %v, %v", first, err)
	}
	if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "audit", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	next, err := stream.Recv()
	if err != nil || len(next.GetAssignments()) != 1 || next.GetAssignments()[0].GetMailboxId() != "audit@p1" || next.GetIndex() <= first.GetIndex() {
		t.Fatalf("after create: %v, %v", next, err)
	}
	if _, err := cp.DeleteNamespace(c, &adminv1.DeleteNamespaceRequest{Namespace: "audit"}); err != nil {
		t.Fatal(err)
	}
	last, err := stream.Recv()
	if err != nil || len(last.GetAssignments()) != 0 {
		t.Fatalf("after delete: %v, %v", last, err)
	}
}
