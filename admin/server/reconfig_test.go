package server

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// voters is n's latest raft configuration, sorted ids.
func voters(t *testing.T, n *Node) []string {
	t.Helper()
	ms, err := n.Raft.Members()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// deadAddr is an address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln := listenLocal(t)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Membership changes follow etcd's strict reconfiguration check, over
// mutual TLS in a three-node cluster with one node stopped: a change that
// would leave the new configuration without a quorum of healthy voters is
// refused FailedPrecondition naming the counts, and the configuration is
// unchanged; changes that keep a quorum pass; force lets a refused one
// through.
func TestMembershipChangesKeepAQuorum(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	a := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listenLocal(t), Bootstrap: true}})
	nodes := map[string]*Node{"a": a}
	op := adminv1.NewAdminClient(as(t, p, a.GRPCAddr(), identity.Operator, "alice"))
	c := ctx(t)
	for _, id := range []string{"b", "c"} {
		n := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{
			ID: id, DataDir: t.TempDir(), Listener: listenLocal(t), JoinPeers: []raftnode.Peer{{ID: "a", Addr: a.Raft.Addr()}},
		}})
		nodes[id] = n
		// Unforced: the joiner answers, so it counts as healthy.
		if _, err := op.AddVoter(c, &adminv1.AddVoterRequest{Id: id, RaftAddress: n.Raft.Addr(), GrpcAddress: n.GRPCAddr()}); err != nil {
			t.Fatalf("add running voter %s: %v", id, err)
		}
	}
	awaitState(t, "b and c to follow a", func() bool {
		lb, _ := nodes["b"].Raft.Leadership()
		lc, _ := nodes["c"].Raft.Leadership()
		return lb.LeaderID == "a" && lc.LeaderID == "a"
	})
	stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes["c"].Stop(stop); err != nil {
		t.Fatal(err)
	}
	ghost := deadAddr(t)
	add := func(id, raftAddr, grpcAddr string, force bool) func() error {
		return func() error {
			_, err := op.AddVoter(c, &adminv1.AddVoterRequest{Id: id, RaftAddress: raftAddr, GrpcAddress: grpcAddr, Force: force})
			return err
		}
	}
	remove := func(id string, force bool) func() error {
		return func() error {
			_, err := op.RemoveServer(c, &adminv1.RemoveServerRequest{Id: id, Force: force})
			return err
		}
	}
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		says   []string // in the refusal
		voters []string // a's configuration afterwards
	}{
		{"remove a healthy voter while another is down", remove("b", false), codes.FailedPrecondition,
			[]string{"remove server b", "2 voters, 1 healthy now (a), and a quorum needs 2", "not answering: c"}, []string{"a", "b", "c"}},
		{"add a voter that was never started", add("d", ghost, ghost, false), codes.FailedPrecondition,
			[]string{"add voter d", "4 voters, 2 healthy now (a, b), and a quorum needs 3", "not answering: c, d"}, []string{"a", "b", "c"}},
		{"add the stopped voter again at its address (a retry, no change)", add("c", nodes["c"].Raft.Addr(), "", false), codes.OK, nil, []string{"a", "b", "c"}},
		{"remove the stopped voter", remove("c", false), codes.OK, nil, []string{"a", "b"}},
		{"remove a non-member (a retry, no change)", remove("c", false), codes.OK, nil, []string{"a", "b"}},
		// Three voters, two healthy: etcd admits it, and so do we.
		{"add a never-started voter to two healthy", add("d", ghost, ghost, false), codes.OK, nil, []string{"a", "b", "d"}},
		{"then remove a healthy one", remove("b", false), codes.FailedPrecondition,
			[]string{"2 voters, 1 healthy now (a), and a quorum needs 2", "not answering: d"}, []string{"a", "b", "d"}},
	}
	for _, tc := range cases {
		err := tc.call()
		wantCode(t, tc.name, err, tc.code)
		for _, s := range tc.says {
			if !strings.Contains(status.Convert(err).Message(), s) {
				t.Errorf("%s: %q does not say %q", tc.name, status.Convert(err).Message(), s)
			}
		}
		if got := voters(t, a); !slices.Equal(got, tc.voters) {
			t.Fatalf("%s: configuration %v, want %v", tc.name, got, tc.voters)
		}
	}
	if got := a.FSM.MemberAddress("b"); got != nodes["b"].GRPCAddr() {
		t.Errorf("refused removals dropped b's members row: %q", got)
	}
	// Forced, the removal goes through the check to raft; the new
	// configuration {a, d} has no quorum, so the call may fail once the
	// leader steps down, but never FailedPrecondition.
	if err := remove("b", true)(); status.Code(err) == codes.FailedPrecondition {
		t.Fatalf("forced removal refused: %v", err)
	}
	if got := voters(t, a); !slices.Equal(got, []string{"a", "d"}) {
		t.Fatalf("after the forced removal: configuration %v, want [a d]", got)
	}
}

// A single node refuses to add a voter that does not answer (the way to
// take its quorum away) unless forced.
func TestAddingAnAbsentVoterToOneNode(t *testing.T) {
	t.Parallel()
	n, _, adm, _ := startSingle(t)
	c := ctx(t)
	ghost := deadAddr(t)
	_, err := adm.AddVoter(c, &adminv1.AddVoterRequest{Id: "ghost", RaftAddress: ghost, GrpcAddress: ghost})
	wantCode(t, "add an absent voter", err, codes.FailedPrecondition)
	if got := voters(t, n); !slices.Equal(got, []string{"solo"}) {
		t.Fatalf("configuration after the refusal %v, want [solo]", got)
	}
	if got := n.FSM.MemberAddress("ghost"); got != "" {
		t.Fatalf("the refused voter got a members row: %q", got)
	}
	_, err = adm.AddVoter(c, &adminv1.AddVoterRequest{Id: "ghost", RaftAddress: ghost, GrpcAddress: ghost, Force: true})
	if status.Code(err) == codes.FailedPrecondition {
		t.Fatalf("forced add refused: %v", err)
	}
	if got := voters(t, n); !slices.Equal(got, []string{"ghost", "solo"}) {
		t.Fatalf("configuration after the forced add %v, want [ghost solo]", got)
	}
}
