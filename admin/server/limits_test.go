package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/internal/connlimit"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// startLimited is a single leading node with the given limits.
func startLimited(t *testing.T, cfg NodeConfig) (*Node, *grpc.ClientConn) {
	t.Helper()
	cfg.Raft = raftnode.Config{ID: "solo", Bootstrap: true}
	n, cc := startNodeConn(t, cfg)
	awaitState(t, "solo to lead", func() bool { l, _ := n.Raft.Leadership(); return l.IsLeader && n.Lessor.Primary() })
	return n, cc
}

// One more proxy, namespace or lease than the quota is refused
// ResourceExhausted and not added; what exists may still be registered,
// created or acquired again.
func TestQuotasBoundTheTables(t *testing.T) {
	t.Parallel()
	n, cc := startLimited(t, NodeConfig{Quotas: Quotas{Proxies: 1, Namespaces: 1, Leases: 1}})
	cp := adminv1.NewControlPlaneClient(cc)
	c := ctx(t)
	placeOn(t, c, cp, "p1", "r1", "ns")
	acquire := func(mailbox string) error {
		_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: mailbox, RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
		return err
	}
	if err := acquire("ns@p1"); err != nil {
		t.Fatal(err)
	}
	nsConfig := &adminv1.NamespaceConfig{Topics: []string{"t"}}
	cases := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"a second proxy", func() error {
			_, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p2", Address: "127.0.0.1:9000", RunnerId: "r2"}})
			return err
		}, codes.ResourceExhausted},
		{"a second namespace", func() error {
			_, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "other", Config: nsConfig})
			return err
		}, codes.ResourceExhausted},
		{"a second lease", func() error { return acquire("other@p1") }, codes.ResourceExhausted},
		{"the proxy again", func() error {
			_, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000", RunnerId: "r1"}})
			return err
		}, codes.OK},
		{"the namespace again", func() error {
			_, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "ns", Config: nsConfig})
			return err
		}, codes.OK},
		{"the lease again (a reconnect)", func() error { return acquire("ns@p1") }, codes.OK},
	}
	for _, tc := range cases {
		err := tc.call()
		wantCode(t, tc.name, err, tc.code)
		if tc.code == codes.ResourceExhausted && !hasQuotaFailure(err) {
			t.Errorf("%s: %v carries no QuotaFailure, so a client would retry it on every node", tc.name, err)
		}
	}
	if got := n.FSM.Counts(); got.Proxies != 1 || got.Namespaces != 1 || got.Leases != 1 {
		t.Fatalf("tables after refusals: %+v, want one of each", got)
	}
}

func hasQuotaFailure(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) > 0 && q.GetViolations()[0].GetSubject() != "" {
			return true
		}
	}
	return false
}

// A connection carries at most MaxStreams calls at once; the next waits
// until one ends.
func TestMaxStreamsPerConnection(t *testing.T) {
	t.Parallel()
	_, cc := startLimited(t, NodeConfig{MaxStreams: 2})
	cp := adminv1.NewControlPlaneClient(cc)
	c := ctx(t)
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000", RunnerId: "r1"}}); err != nil {
		t.Fatal(err)
	}
	watch := func(ctx context.Context) error {
		s, err := cp.WatchAssignments(ctx, &adminv1.WatchAssignmentsRequest{ProxyId: "p1"})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	first, cancelFirst := context.WithCancel(c)
	defer cancelFirst()
	for range 2 {
		if err := watch(first); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(c, 500*time.Millisecond)
	defer cancel()
	wantCode(t, "a third stream on the connection", watch(short), codes.DeadlineExceeded)
	cancelFirst()
	if err := watch(c); err != nil {
		t.Fatalf("a stream once the others ended: %v", err)
	}
}

// A connection without calls for the idle bound is closed by the server.
func TestIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	_, cc := startLimited(t, NodeConfig{Conn: connlimit.Bounds{Idle: 200 * time.Millisecond}})
	c := ctx(t)
	if _, err := adminv1.NewAdminClient(cc).GetClusterStatus(c, &adminv1.GetClusterStatusRequest{}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "the idle connection to close", func() bool { return cc.GetState() != connectivity.Ready })
}
