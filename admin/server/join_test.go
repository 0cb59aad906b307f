package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// startJoiner starts node id on dir over mutual TLS without bootstrapping:
// it knows the members' gRPC addresses (grpcAddrs) and admits members to
// raft until it has a configuration.
func startJoiner(t *testing.T, p *pkitest.PKI, id, dir string, members []*Node, grpcAddrs map[string]string) *Node {
	t.Helper()
	var join []raftnode.Peer
	for _, m := range members {
		join = append(join, raftnode.Peer{ID: m.Raft.ID(), Addr: m.Raft.Addr()})
	}
	return startTLSNode(t, p, NodeConfig{
		Raft:      raftnode.Config{ID: id, DataDir: dir, Listener: listenLocal(t), JoinPeers: join},
		GRPCAddrs: grpcAddrs,
	})
}

// suffrages is n's latest configuration: id to "voter" or "nonvoter".
func suffrages(t *testing.T, n *Node) map[string]string {
	t.Helper()
	ms, err := n.Raft.Members()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range ms {
		out[m.ID] = map[bool]string{true: "voter", false: "nonvoter"}[m.Voter]
	}
	return out
}

func readyz(n *Node) int {
	rec := httptest.NewRecorder()
	n.Server.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code
}

// joinWithin runs n.Join and fails the test unless it returns nil in time.
func joinWithin(t *testing.T, n *Node, d time.Duration) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := n.Join(c, n.Raft.Addr()); err != nil {
		t.Fatalf("%s joins: %v", n.Raft.ID(), err)
	}
}

// New nodes with empty data dirs join a running cluster by themselves
// (prism admin --bootstrap-expect): through the leader or a follower, one
// at a time or two at once, each a voter at the end with the cluster's
// state, not ready before. A member removed and restarted on its data does
// not add itself back.
func TestNodesJoinByThemselves(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	a := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listenLocal(t), Bootstrap: true}})
	op := adminv1.NewControlPlaneClient(as(t, p, a.GRPCAddr(), identity.Operator, "alice"))
	c := ctx(t)
	for i := range 5 {
		if _, err := op.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: fmt.Sprintf("ns-%d", i), Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
			t.Fatal(err)
		}
	}
	// The first joiner takes the state from a snapshot, not only the log.
	if err := a.Raft.Snapshot(); err != nil {
		t.Fatal(err)
	}

	b := startJoiner(t, p, "b", t.TempDir(), []*Node{a}, map[string]string{"a": a.GRPCAddr()})
	if code := readyz(b); code != http.StatusServiceUnavailable {
		t.Fatalf("a node not yet joined answers /readyz %d", code)
	}
	// b's first ask, made by hand: a non-voter follows the leader and takes
	// its state, but is not ready.
	first, err := adminv1.NewPeerClient(as(t, p, a.GRPCAddr(), identity.Admin, "b")).Join(c,
		&adminv1.JoinRequest{Id: "b", RaftAddress: b.Raft.Addr(), GrpcAddress: b.GRPCAddr()})
	if err != nil || first.GetVoter() {
		t.Fatalf("b's first ask: %v, %v; want a non-voter", first, err)
	}
	awaitState(t, "b to follow a", func() bool {
		l, _ := b.Raft.Leadership()
		return l.LeaderID == "a" && b.Raft.AppliedIndex() >= first.GetCommitIndex()
	})
	if code := readyz(b); code != http.StatusServiceUnavailable {
		t.Fatalf("a non-voter answers /readyz %d", code)
	}
	joinWithin(t, b, 30*time.Second)
	if got := suffrages(t, a); !maps.Equal(got, map[string]string{"a": "voter", "b": "voter"}) {
		t.Fatalf("after b joined: %v", got)
	}
	awaitState(t, "b ready with a's namespaces", func() bool {
		ns, _ := b.FSM.Namespaces()
		return readyz(b) == http.StatusOK && len(ns) == 5
	})

	// c knows only the follower b, which forwards its ask to a.
	if l, _ := b.Raft.Leadership(); l.IsLeader {
		t.Fatal("b leads; the forward is not tested")
	}
	cn := startJoiner(t, p, "c", t.TempDir(), []*Node{a, b}, map[string]string{"b": b.GRPCAddr()})
	joinWithin(t, cn, 30*time.Second)

	// Two at once, as a StatefulSet grown from 3 to 5 starts them.
	peers := map[string]string{"a": a.GRPCAddr(), "b": b.GRPCAddr(), "c": cn.GRPCAddr()}
	eDir := t.TempDir()
	d := startJoiner(t, p, "d", t.TempDir(), []*Node{a, b, cn}, peers)
	e := startJoiner(t, p, "e", eDir, []*Node{a, b, cn}, peers)
	errs := make(chan error, 2)
	for _, n := range []*Node{d, e} {
		go func() {
			jc, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs <- n.Join(jc, n.Raft.Addr())
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent join: %v", err)
		}
	}
	five := map[string]string{"a": "voter", "b": "voter", "c": "voter", "d": "voter", "e": "voter"}
	if got := suffrages(t, a); !maps.Equal(got, five) {
		t.Fatalf("after d and e joined: %v", got)
	}
	for _, n := range []*Node{cn, d, e} {
		awaitState(t, n.Raft.ID()+" ready", func() bool { return readyz(n) == http.StatusOK })
		if got := a.FSM.MemberAddress(n.Raft.ID()); got != n.GRPCAddr() {
			t.Errorf("members row of %s = %q, want %q", n.Raft.ID(), got, n.GRPCAddr())
		}
	}
	// A voter asking again (an answer lost) changes nothing.
	joinWithin(t, d, 5*time.Second)

	// e removed, then restarted on its data: it has state, so it neither
	// bootstraps nor joins again.
	if _, err := adminv1.NewAdminClient(as(t, p, a.GRPCAddr(), identity.Operator, "alice")).RemoveServer(c, &adminv1.RemoveServerRequest{Id: "e"}); err != nil {
		t.Fatal(err)
	}
	stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Stop(stop); err != nil {
		t.Fatal(err)
	}
	e2 := startJoiner(t, p, "e", eDir, []*Node{a, b, cn, d}, peers)
	began := time.Now()
	joinWithin(t, e2, 5*time.Second)
	if took := time.Since(began); took > time.Second {
		t.Errorf("a removed node with state spent %v in Join", took)
	}
	delete(five, "e")
	if got := suffrages(t, a); !maps.Equal(got, five) {
		t.Fatalf("a removed node restarted on its data re-joined: %v", got)
	}
	if code := readyz(e2); code != http.StatusServiceUnavailable {
		t.Errorf("a removed node answers /readyz %d", code)
	}
}

// Only admin/<id> may ask for id to join: another admin node's identity
// (directly or as the caller a member forwards for), a proxy's or an
// operator's named id, and no certificate are refused and the configuration
// stays as it was. The node's own identity is admitted as a non-voter, and
// its promotion passes the quorum check member add does: a node that does
// not answer at its gRPC address is refused FailedPrecondition.
func TestJoinIsOnlyForTheNodeItself(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	a := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listenLocal(t), Bootstrap: true}})
	c := ctx(t)
	ghost := deadAddr(t)
	req := &adminv1.JoinRequest{Id: "d", RaftAddress: ghost, GrpcAddress: ghost}
	join := func(cc adminv1.PeerClient, ctx context.Context) error {
		_, err := cc.Join(ctx, req)
		return err
	}
	forwardedFor := func(caller string) context.Context {
		return metadata.AppendToOutgoingContext(c, forwardedKey, "b", callerKey, caller)
	}
	byB := adminv1.NewPeerClient(as(t, p, a.GRPCAddr(), identity.Admin, "b"))
	//nolint:gosec // the client skips verifying the server: the test is about the server's check of it
	noCert := adminv1.NewPeerClient(dialAs(t, a.GRPCAddr(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}))
	cases := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"another admin node", join(adminv1.NewPeerClient(as(t, p, a.GRPCAddr(), identity.Admin, "e")), c), codes.PermissionDenied},
		{"a member forwarding for another admin node", join(byB, forwardedFor("spiffe://prism.local/admin/e")), codes.PermissionDenied},
		{"a member forwarding for a proxy of that name", join(byB, forwardedFor("spiffe://prism.local/proxy/d")), codes.PermissionDenied},
		{"a proxy of that name", join(adminv1.NewPeerClient(as(t, p, a.GRPCAddr(), identity.Proxy, "d")), c), codes.PermissionDenied},
		{"an operator", join(adminv1.NewPeerClient(as(t, p, a.GRPCAddr(), identity.Operator, "d")), c), codes.PermissionDenied},
		// The TLS handshake fails: the call never reaches the server.
		{"no client certificate", join(noCert, c), codes.Unavailable},
	}
	for _, tc := range cases {
		wantCode(t, tc.name, tc.err, tc.code)
		if got := suffrages(t, a); !maps.Equal(got, map[string]string{"a": "voter"}) {
			t.Fatalf("%s: configuration %v", tc.name, got)
		}
	}

	self := adminv1.NewPeerClient(as(t, p, a.GRPCAddr(), identity.Admin, "d"))
	resp, err := self.Join(c, req)
	if err != nil || resp.GetVoter() {
		t.Fatalf("d asks for itself: %v, %v; want a non-voter", resp, err)
	}
	if got := suffrages(t, a); !maps.Equal(got, map[string]string{"a": "voter", "d": "nonvoter"}) {
		t.Fatalf("after d asked: %v", got)
	}
	// Caught up, but not answering: a and d as voters would need both.
	promote := &adminv1.JoinRequest{Id: "d", RaftAddress: ghost, GrpcAddress: ghost, AppliedIndex: a.Raft.CommitIndex()}
	_, err = self.Join(c, promote)
	wantCode(t, "promoting a node that does not answer", err, codes.FailedPrecondition)
	if got := suffrages(t, a); !maps.Equal(got, map[string]string{"a": "voter", "d": "nonvoter"}) {
		t.Fatalf("after the refused promotion: %v", got)
	}
	if ids := voters(t, a); !slices.Equal(ids, []string{"a", "d"}) {
		t.Fatalf("members %v", ids)
	}
}
