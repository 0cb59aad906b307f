package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"
)

// startNode runs a node on 127.0.0.1 and returns its ControlPlane client.
func startNode(t *testing.T, cfg NodeConfig) (*Node, adminv1.ControlPlaneClient) {
	t.Helper()
	n, cc := startNodeConn(t, cfg)
	return n, adminv1.NewControlPlaneClient(cc)
}

// startNodeConn runs a node on 127.0.0.1 on fast raft timing and returns a
// connection to its gRPC server; both are closed when the test ends.
func startNodeConn(t *testing.T, cfg NodeConfig) (*Node, *grpc.ClientConn) {
	t.Helper()
	cfg.Raft.Timing = raftnode.FastTiming()
	cfg.GRPCAddr, cfg.Logger = "127.0.0.1:0", quiet()
	n, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Stop(ctx)
	})
	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return n, cc
}

// A node with no leader to forward to still refuses a malformed write at
// once, as InvalidArgument, rather than waiting for a leader and answering
// Unavailable.
func TestNodeWithoutLeaderRefusesBadWrites(t *testing.T) {
	t.Parallel()
	_, cp := startNode(t, NodeConfig{Raft: raftnode.Config{ID: "lonely"}})
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "no-at-sign", RunnerId: "r", RunnerAddress: "127.0.0.1:1"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad acquire without a leader: %v, want InvalidArgument", err)
	}
}

// Time enters the FSM only through the leader's stamp: a write sent to a
// follower whose clock is an hour ahead is timed by the leader's clock.
func TestForwardedWriteIsTimedByTheLeader(t *testing.T) {
	t.Parallel()
	leaderNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	lead, _ := startNode(t, NodeConfig{
		Raft:  raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listen(), Bootstrap: true},
		Clock: clocktesting.NewFakeClock(leaderNow),
	})
	follower, cp := startNode(t, NodeConfig{
		Raft:  raftnode.Config{ID: "b", DataDir: t.TempDir(), Listener: listen()},
		Clock: clocktesting.NewFakeClock(leaderNow.Add(time.Hour)),
	})
	c := ctx(t)
	awaitState(t, "a to lead", func() bool { l, _ := lead.Raft.Leadership(); return l.IsLeader && lead.Lessor.Primary() })
	if _, err := lead.Server.AddVoter(c, &adminv1.AddVoterRequest{Id: "b", RaftAddress: follower.Raft.Addr(), GrpcAddress: follower.GRPCAddr()}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to follow a", func() bool {
		l, _ := follower.Raft.Leadership()
		return l.LeaderID == "a" && follower.FSM.MemberAddress("a") != ""
	})
	reg, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000", RunnerId: "r1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "n", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "n@p1", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	if err != nil || !acq.GetGranted() {
		t.Fatalf("acquire through the follower: %v, %v", acq, err)
	}
	for what, got := range map[string]time.Time{
		"proxy registered_at": reg.GetProxy().GetRegisteredAt().AsTime(),
		"lease granted_at":    acq.GetLease().GetGrantedAt().AsTime(),
	} {
		if !got.Equal(leaderNow) {
			t.Errorf("%s = %s, want the leader's %s", what, got, leaderNow)
		}
	}
}
