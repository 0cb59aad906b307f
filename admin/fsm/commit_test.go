package fsm

import (
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

type commits []Commit

func (c *commits) Committed(x Commit) { *c = append(*c, x) }

// TestCommitObserverSeesEachChangeOnce: the observer gets every command that
// changed the state, with its index, principal and the leases it granted or
// removed, and nothing for a command refused (by check or by state) or one
// that changed nothing (an expire of an epoch no lease has).
func TestCommitObserverSeesEachChangeOnce(t *testing.T) {
	t.Parallel()
	var got commits
	h := newHarness(t, WithCommitObserver(&got))
	h.must(c(0, registerRunner("p1", "r1")))
	create := c(0, createNS("orders", "orders.events"))
	create.Principal = "spiffe://prism.local/operator/alice"
	h.must(create)
	unstamped := c(0, createNS("other"))
	unstamped.Now = nil
	if _, ok := h.apply(unstamped).(error); !ok {
		t.Fatal("a command without the leader's timestamp applied")
	}
	if r := h.must(c(time.Second, acquire("orders@p1", "r2"))).(*adminv1.AcquireLeaseResponse); r.GetRefusal() == nil {
		t.Fatal("another runner's acquire was granted")
	}
	grant := h.must(c(time.Second, acquire("orders@p1", "r1"))).(*adminv1.AcquireLeaseResponse)
	epoch := grant.GetLease().GetEpoch()
	h.must(c(2*time.Second, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: "orders@p1", Epoch: epoch + 100}}}))
	h.must(c(3*time.Second, &adminv1.ReleaseLeaseRequest{MailboxId: "orders@p1", RunnerId: "r1", Epoch: epoch}))

	want := []struct {
		index     uint64
		kind      string
		principal string
		granted   int
		removed   int
	}{
		{1, "register_proxy", "", 0, 0},
		{2, "create_namespace", "spiffe://prism.local/operator/alice", 0, 0},
		{5, "acquire_lease", "", 1, 0},
		{7, "release_lease", "", 0, 1},
	}
	if len(got) != len(want) {
		for _, g := range got {
			t.Logf("got %d %s", g.Index, CommandType(g.Command))
		}
		t.Fatalf("%d commits observed, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Index != w.index || CommandType(g.Command) != w.kind || g.Command.GetPrincipal() != w.principal ||
			len(g.Granted) != w.granted || len(g.Removed) != w.removed {
			t.Errorf("commit %d: index %d %s principal %q granted %d removed %d, want %+v",
				i, g.Index, CommandType(g.Command), g.Command.GetPrincipal(), len(g.Granted), len(g.Removed), w)
		}
	}
	if r := got[3].Removed; len(r) == 1 && (r[0].GetMailboxId() != "orders@p1" || r[0].GetEpoch() != epoch) {
		t.Errorf("release removed %v, want orders@p1 epoch %d", r[0], epoch)
	}
}
