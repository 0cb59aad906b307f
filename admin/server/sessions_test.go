package server

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// sessionState is snapshot plus the open sessions with their live expiry
// (Annotate gives a session's leases the session's live expiry, so a
// renewal a refused call made would show in the leases too).
func sessionState(t *testing.T, n *Node) []string {
	t.Helper()
	out := snapshot(t, n)
	ss, _ := n.FSM.Sessions()
	for _, s := range ss {
		out = append(out, "session "+s.String())
	}
	return out
}

// Over mutual TLS a proxy identity opens, renews, uses and closes only its
// own proxy's sessions and acquires only its own mailboxes; every other
// attempt is PermissionDenied and changes nothing. The session quota stops a
// loop of opens.
func TestSessionsActOnlyForTheirProxy(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	// No mover: once A registers, placement gives nb's partition to A, and a
	// rebalance starting between the two snapshots is not a refused call's doing.
	n := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, Moves: MoveConfig{Interval: time.Hour}})
	addr := n.GRPCAddr()
	c := ctx(t)
	op := adminv1.NewControlPlaneClient(as(t, p, addr, identity.Operator, "alice"))
	cpA, cpB := adminv1.NewControlPlaneClient(as(t, p, addr, identity.Proxy, "pa")), adminv1.NewControlPlaneClient(as(t, p, addr, identity.Proxy, "pb"))
	sA, sB := adminv1.NewSessionsClient(as(t, p, addr, identity.Proxy, "pa")), adminv1.NewSessionsClient(as(t, p, addr, identity.Proxy, "pb"))

	// B alone is live when nb is created, so nb is placed on B; B takes it
	// in a session before A joins.
	if _, err := cpB.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "pb", Address: "127.0.0.1:9000", RunnerId: "rb"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "nb", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	open, err := sB.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:9001", Ttl: durationpb.New(10 * time.Second)})
	if err != nil || open.GetSession().GetId() == 0 {
		t.Fatalf("B opens a session: %v, %v", open, err)
	}
	sidB := open.GetSession().GetId()
	acq, err := sB.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "pb", SessionId: sidB, MailboxIds: []string{"nb@pb"}})
	if err != nil || !acq.GetResults()[0].GetOk() {
		t.Fatalf("B acquires nb@pb in its session: %v, %v", acq, err)
	}
	if _, err := cpA.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "pa", Address: "127.0.0.1:9100", RunnerId: "ra"}}); err != nil {
		t.Fatal(err)
	}
	openA, err := sA.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "pa", RunnerId: "ra", RunnerAddress: "127.0.0.1:9101"})
	if err != nil || openA.GetSession().GetId() == 0 {
		t.Fatalf("A opens its own session: %v, %v", openA, err)
	}
	sidA := openA.GetSession().GetId()

	before := sessionState(t, n)
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"A opens a session for pb", func() error {
			_, err := sA.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:6666"})
			return err
		}},
		{"A renews B's session as pb", func() error {
			_, err := sA.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "pb", SessionId: sidB})
			return err
		}},
		{"A renews B's session as itself", func() error {
			_, err := sA.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "pa", SessionId: sidB})
			return err
		}},
		{"A closes B's session as itself", func() error {
			_, err := sA.CloseSession(c, &adminv1.CloseSessionRequest{ProxyId: "pa", SessionId: sidB})
			return err
		}},
		{"A acquires nb@pb in its own session", func() error {
			_, err := sA.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "pa", SessionId: sidA, MailboxIds: []string{"nb@pb"}})
			return err
		}},
		{"A acquires nb@pb in B's session", func() error {
			_, err := sA.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "pb", SessionId: sidB, MailboxIds: []string{"nb@pb"}})
			return err
		}},
		{"A acquires its own mailbox in B's session", func() error {
			_, err := sA.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "pa", SessionId: sidB, MailboxIds: []string{"nb@pa"}})
			return err
		}},
		{"A releases nb@pb from B's session", func() error {
			_, err := sA.ReleaseLeases(c, &adminv1.ReleaseLeasesRequest{ProxyId: "pb", SessionId: sidB, MailboxIds: []string{"nb@pb"}})
			return err
		}},
		{"A releases in B's session as itself", func() error {
			_, err := sA.ReleaseLeases(c, &adminv1.ReleaseLeasesRequest{ProxyId: "pa", SessionId: sidB, MailboxIds: []string{"nb@pa"}})
			return err
		}},
		{"an operator opens a session", func() error {
			_, err := adminv1.NewSessionsClient(as(t, p, addr, identity.Operator, "alice")).OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:6666"})
			return err
		}},
	} {
		wantCode(t, tc.name, tc.call(), codes.PermissionDenied)
	}
	if after := sessionState(t, n); !slices.Equal(before, after) {
		t.Fatalf("refused calls changed the state:\nbefore %v\nafter  %v", before, after)
	}

	// B's own calls go through.
	ka, err := sB.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "pb", SessionId: sidB})
	if err != nil || !ka.GetRenewed() {
		t.Fatalf("B renews its session: %v, %v", ka, err)
	}
	// A's opens stop at the quota (one is open already).
	for i := 1; i < DefaultQuotas.SessionsPerProxy; i++ {
		if _, err := sA.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "pa", RunnerId: "ra", RunnerAddress: "127.0.0.1:9101"}); err != nil {
			t.Fatalf("A's open %d: %v", i+1, err)
		}
	}
	_, err = sA.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "pa", RunnerId: "ra", RunnerAddress: "127.0.0.1:9101"})
	wantCode(t, "A's open past the session quota", err, codes.ResourceExhausted)
	closed, err := sB.CloseSession(c, &adminv1.CloseSessionRequest{ProxyId: "pb", SessionId: sidB})
	if err != nil || !closed.GetClosed() || closed.GetLeasesReleased() != 1 {
		t.Fatalf("B closes its session: %v, %v", closed, err)
	}
	if l, _ := n.FSM.Lease("nb@pb"); l != nil {
		t.Fatalf("lease survived its session: %v", l)
	}
	ka, err = sB.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "pb", SessionId: sidB})
	if err != nil || ka.GetRenewed() || ka.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION {
		t.Fatalf("keepalive of a closed session: %v, %v", ka, err)
	}
}

// A leader that lost its quorum renews no session: once its last quorum
// confirmation is older than LeaderLease, a keepalive gets no renewal
// (whether the leadership check or raft's step-down refuses it first) and
// the session's expiry on the leader does not move. The same guard as
// MailboxHeartbeat's, which tests/admin_cluster checks under SIGSTOP.
func TestKeepAliveNeedsAQuorum(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	a := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listenLocal(t), Bootstrap: true}})
	b := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{
		ID: "b", DataDir: t.TempDir(), Listener: listenLocal(t), JoinPeers: []raftnode.Peer{{ID: "a", Addr: a.Raft.Addr()}},
	}})
	c := ctx(t)
	if _, err := adminv1.NewAdminClient(as(t, p, a.GRPCAddr(), identity.Operator, "alice")).AddVoter(c, &adminv1.AddVoterRequest{
		Id: "b", RaftAddress: b.Raft.Addr(), GrpcAddress: b.GRPCAddr(),
	}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to follow a", func() bool { l, _ := b.Raft.Leadership(); return l.LeaderID == "a" })
	cp := adminv1.NewControlPlaneClient(as(t, p, a.GRPCAddr(), identity.Proxy, "p"))
	op := adminv1.NewControlPlaneClient(as(t, p, a.GRPCAddr(), identity.Operator, "alice"))
	ss := adminv1.NewSessionsClient(as(t, p, a.GRPCAddr(), identity.Proxy, "p"))
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p", Address: "127.0.0.1:9000", RunnerId: "r"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "n", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	open, err := ss.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "p", RunnerId: "r", RunnerAddress: "127.0.0.1:9001"})
	if err != nil {
		t.Fatal(err)
	}
	sid := open.GetSession().GetId()
	if r, err := ss.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "p", SessionId: sid, MailboxIds: []string{"n@p"}}); err != nil || !r.GetResults()[0].GetOk() {
		t.Fatalf("acquire: %v, %v", r, err)
	}
	ka, err := ss.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "p", SessionId: sid})
	if err != nil || !ka.GetRenewed() {
		t.Fatalf("keepalive with a quorum: %v, %v", ka, err)
	}
	stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Stop(stop); err != nil {
		t.Fatal(err)
	}
	// The last confirmation may answer for LeaderLease; no later.
	time.Sleep(a.Server.cfg.LeaderLease)
	short, cancelShort := context.WithTimeout(c, 2*time.Second)
	defer cancelShort()
	late, err := ss.KeepAliveSession(short, &adminv1.KeepAliveSessionRequest{ProxyId: "p", SessionId: sid})
	if err == nil || late.GetRenewed() {
		t.Fatalf("keepalive without a quorum: %v, %v", late, err)
	}
	if a.Lessor.Primary() {
		l, _ := a.FSM.Lease("n@p")
		if got := a.Lessor.Annotate(l).GetExpiresAt().AsTime(); !got.Equal(ka.GetExpiresAt().AsTime()) {
			t.Fatalf("session expiry moved to %s without a quorum (was %s)", got, ka.GetExpiresAt().AsTime())
		}
	}
}
