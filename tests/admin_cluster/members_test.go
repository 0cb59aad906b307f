package admincluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// TestRuntimeMemberLeadsAndIsForwardedTo: a fourth node joins at runtime
// (--join, prismctl member add with its gRPC address); no original node's
// --peers names it. Cutting the raft links among the original three (each
// still reaches the joiner directly) leaves the joiner the only node that
// can win an election. A write sent to an original node must then be
// forwarded to the joiner, which needs its gRPC address from the replicated
// members table.
func TestRuntimeMemberLeadsAndIsForwardedTo(t *testing.T) {
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	lead := c.AwaitLeader()
	j := c.AddJoiner()
	joiner := c.Nodes[j]
	memberAdd(ctx, t, c.Nodes[c.Follower(lead)], joiner)
	// Every original node lists the joiner with its gRPC address, and the
	// bootstrap rows for the static members.
	for i := range 3 {
		testwait.For(t, 30*time.Second, c.Nodes[i].ID+" to know every member's gRPC address", func() (bool, string) {
			st, err := c.Nodes[i].Status(ctx)
			if err != nil {
				return false, err.Error()
			}
			want := map[string]string{}
			for _, n := range c.Nodes {
				want[n.ID] = n.GRPCAddr
			}
			for _, m := range st.GetMembers() {
				if want[m.GetId()] != m.GetGrpcAddress() {
					return false, fmt.Sprintf("%s at %q", m.GetId(), m.GetGrpcAddress())
				}
				delete(want, m.GetId())
			}
			return len(want) == 0, fmt.Sprintf("missing %v", want)
		})
	}

	// The joiner can campaign only once its own log holds the configuration
	// that makes it a voter; cutting the others off before it has caught up
	// leaves a cluster in which nobody can be elected.
	testwait.For(t, 30*time.Second, "the joiner to know itself a voter", func() (bool, string) {
		st, err := joiner.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, m := range st.GetMembers() {
			if m.GetId() == joiner.ID && m.GetSuffrage() == adminv1.MemberSuffrage_MEMBER_SUFFRAGE_VOTER {
				return true, ""
			}
		}
		return false, fmt.Sprintf("members %v", st.GetMembers())
	})
	for a := range 3 {
		for b := range 3 {
			if a != b {
				c.Links[a][b].Blackhole()
			}
		}
	}
	testwait.For(t, 60*time.Second, "the joiner to lead", func() (bool, string) {
		st, err := joiner.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		return st.GetState() == "Leader", st.GetState()
	})
	for i := range 3 {
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := c.Nodes[i].Control().CreateNamespace(wctx, &adminv1.CreateNamespaceRequest{
			Namespace: fmt.Sprintf("via-old-%d", i+1), Config: nsConfig(),
		})
		wcancel()
		if err != nil {
			st, _ := joiner.Status(ctx)
			t.Fatalf("write through %s while %s leads (state %s): %v", c.Nodes[i].ID, joiner.ID, st.GetState(), err)
		}
	}
	r, err := joiner.Admin().ListNamespaces(ctx, &adminv1.ListNamespacesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetNamespaces()) != 3 {
		t.Fatalf("the leader has %d namespaces, want the 3 forwarded writes: %v", len(r.GetNamespaces()), r.GetNamespaces())
	}
	if got := metricValue(t, c.Nodes[0], "prism_admin_forwards_total"); got == 0 {
		t.Fatalf("%s forwarded nothing", c.Nodes[0].ID)
	}
}
