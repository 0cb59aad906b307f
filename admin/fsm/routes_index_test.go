package fsm

import (
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// RoutesIndex is the index Routes reports, and it moves on grants, releases
// and namespace changes but not on checkpoints or proxy heartbeats, which is
// what lets the xDS feed skip the copy.
func TestRoutesIndex(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	check := func(step string) {
		t.Helper()
		before := h.f.RoutesIndex()
		_, _, routesIdx := h.f.Routes()
		if before != routesIdx {
			t.Fatalf("%s: RoutesIndex %d, Routes reports %d", step, before, routesIdx)
		}
	}
	h.must(c(0, registerRunner("p1", "runner")))
	check("register")
	h.must(c(0, createNS("a", "t")))
	check("create namespace")
	h.must(c(0, acquire("a@p1", "runner")))
	granted := h.f.RoutesIndex()
	if granted != h.index {
		t.Fatalf("after the grant at %d: RoutesIndex %d", h.index, granted)
	}
	check("acquire")
	l, _ := h.f.Lease("a@p1")
	for i, cmd := range []*adminv1.Command{
		c(time.Second, &adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{{
			MailboxId: "a@p1", Epoch: l.GetEpoch(), ExpiresAt: at(time.Minute), LastHeartbeatAt: at(time.Second),
		}}}),
		c(2*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}),
	} {
		h.must(cmd)
		if got := h.f.RoutesIndex(); got != granted {
			t.Fatalf("command %d (%s) moved RoutesIndex %d -> %d", i, CommandType(cmd), granted, got)
		}
		check(CommandType(cmd))
	}
	h.must(c(3*time.Second, &adminv1.ReleaseLeaseRequest{MailboxId: "a@p1", RunnerId: "runner"}))
	if got := h.f.RoutesIndex(); got != h.index {
		t.Fatalf("after the release at %d: RoutesIndex %d", h.index, got)
	}
}
