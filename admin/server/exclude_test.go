package server

import (
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// The exclusion window of an open_failed report is the leader's
// --open-failure-exclusion, carried in the entry: a report sent to a
// follower started with another window excludes, on both nodes, for the
// leader's. Under fast timing a loaded machine may move leadership to the
// follower mid-test, after which the follower's window is the right one;
// such an attempt proves nothing and starts again with fresh nodes.
func TestOpenFailureExclusionIsTheLeaders(t *testing.T) {
	t.Parallel()
	for attempt := 1; !exclusionIsTheLeaders(t); attempt++ {
		if attempt == 3 {
			t.Fatal("leadership left the first node in three attempts")
		}
	}
}

// exclusionIsTheLeaders runs one attempt; false when a lost leadership
// before the report was applied everywhere.
func exclusionIsTheLeaders(t *testing.T) bool {
	t.Helper()
	const leaderWindow, followerWindow = 3 * time.Minute, 45 * time.Minute
	p := pkitest.New(t)
	a := startTLSNode(t, p, NodeConfig{OpenFailureExclusion: leaderWindow, Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listenLocal(t), Bootstrap: true}})
	b := startTLSNode(t, p, NodeConfig{OpenFailureExclusion: followerWindow, Raft: raftnode.Config{
		ID: "b", DataDir: t.TempDir(), Listener: listenLocal(t), JoinPeers: []raftnode.Peer{{ID: "a", Addr: a.Raft.Addr()}},
	}})
	defer func() { _ = b.Stop(ctx(t)) }()
	defer func() { _ = a.Stop(ctx(t)) }()
	c := ctx(t)
	first, _ := a.Raft.Leadership()
	if _, err := adminv1.NewAdminClient(as(t, p, a.GRPCAddr(), identity.Operator, "alice")).AddVoter(c, &adminv1.AddVoterRequest{
		Id: "b", RaftAddress: b.Raft.Addr(), GrpcAddress: b.GRPCAddr(),
	}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to follow a", func() bool { l, _ := b.Raft.Leadership(); return l.LeaderID == "a" })
	cp := adminv1.NewControlPlaneClient(as(t, p, b.GRPCAddr(), identity.Proxy, "p"))
	op := adminv1.NewControlPlaneClient(as(t, p, b.GRPCAddr(), identity.Operator, "alice"))
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p", Address: "127.0.0.1:9000"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "n", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	hb, err := cp.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{
		Namespace: "n", Status: adminv1.HealthStatus_HEALTH_STATUS_UNHEALTHY, OpenFailed: true, OpenFailure: "open n: damaged",
	}}})
	if err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to apply the heartbeat", func() bool { return b.Raft.AppliedIndex() >= hb.GetIndex() })
	if now, _ := a.Raft.Leadership(); !now.IsLeader || now.Term != first.Term {
		t.Logf("a lost leadership (term %d -> %d, leader %q): trying again", first.Term, now.Term, now.LeaderID)
		return false
	}
	for _, n := range []*Node{a, b} {
		rec, _ := n.FSM.Proxy("p")
		px := rec.GetProxy()
		var until time.Time
		for _, h := range px.GetNamespaceHealth() {
			if h.GetNamespace() == "n" && h.GetExcludedUntil() != nil {
				until = h.GetExcludedUntil().AsTime()
			}
		}
		if got := until.Sub(px.GetLastSeen().AsTime()); got != leaderWindow {
			t.Fatalf("node %s excludes n for %v after the report, want the leader's %v", n.Raft.ID(), got, leaderWindow)
		}
	}
	return true
}
