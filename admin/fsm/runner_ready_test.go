package fsm

import (
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// A proxy whose sidecar reports its runner not ready stays LIVE but leaves
// placement like a stale proxy: its namespaces move to the other proxy, and
// come back when a heartbeat or registration says ready again, or says
// nothing (an older sidecar). Each flip moves ProxyRoutesIndex, since the
// proxy's endpoint health follows it; a repeated report moves nothing.
func TestRunnerNotReadyLeavesPlacement(t *testing.T) {
	t.Parallel()
	h, owner, other, _ := base(t)
	hb := func(ready bool) *adminv1.ProxyHeartbeatRequest {
		return &adminv1.ProxyHeartbeatRequest{ProxyId: owner, RunnerId: "runner-a", RunnerNotReady: !ready}
	}
	// A standby sidecar of the same proxy, beside a runner that is not the
	// registered one, does not speak for the proxy's runner.
	standby := func(ready bool) *adminv1.ProxyHeartbeatRequest {
		return &adminv1.ProxyHeartbeatRequest{ProxyId: owner, RunnerId: "runner-standby", RunnerNotReady: !ready}
	}
	reg := func(ready bool) *adminv1.RegisterProxyRequest {
		r := registerRunner(owner, "runner-a")
		r.RunnerNotReady = !ready
		return r
	}
	stale := func() *adminv1.MarkProxiesStaleCommand {
		p, _ := h.f.Proxy(owner)
		return &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}
	}
	for i, step := range []struct {
		name     string
		body     func() any
		notReady bool
		status   adminv1.ProxyStatus
		placedOn string
		// moves: ProxyRoutesIndex is this entry's; placed: the namespace's
		// assignment is.
		moves, placed bool
	}{
		{"heartbeat without the field", func() any { return &adminv1.ProxyHeartbeatRequest{ProxyId: owner} }, false, liveStatus, owner, false, false},
		{"standby's runner not ready", func() any { return standby(false) }, false, liveStatus, owner, false, false},
		{"runner not ready", func() any { return hb(false) }, true, liveStatus, other, true, true},
		{"not ready again", func() any { return hb(false) }, true, liveStatus, other, false, false},
		{"standby's runner ready", func() any { return standby(true) }, true, liveStatus, other, false, false},
		// Back in placement, but other serves the namespace: it comes
		// back by handoff (Rebalance), not at once.
		{"ready again", func() any { return hb(true) }, false, liveStatus, other, true, false},
		{"registers not ready", func() any { return reg(false) }, true, liveStatus, other, true, false},
		{"older sidecar heartbeats without the field", func() any { return &adminv1.ProxyHeartbeatRequest{ProxyId: owner} }, false, liveStatus, other, true, false},
		{"not ready", func() any { return hb(false) }, true, liveStatus, other, true, false},
		{"marked stale while not ready", func() any { return stale() }, true, adminv1.ProxyStatus_PROXY_STATUS_STALE, other, true, false},
		{"stale proxy heartbeats still not ready", func() any { return hb(false) }, true, liveStatus, other, true, false},
		{"registers ready", func() any { return reg(true) }, false, liveStatus, other, true, false},
	} {
		beforeRoutes := h.f.ProxyRoutesIndex()
		n, _, _ := h.f.Namespace(ns)
		beforePlaced := n.GetAssignmentIndex()
		h.must(c(time.Duration(10+i)*time.Second, step.body()))
		p, _ := h.f.Proxy(owner)
		if got := p.GetProxy(); got.GetRunnerNotReady() != step.notReady || got.GetStatus() != step.status {
			t.Fatalf("%s: proxy runner_not_ready %v status %v, want %v %v", step.name, got.GetRunnerNotReady(), got.GetStatus(), step.notReady, step.status)
		}
		n, _, _ = h.f.Namespace(ns)
		if n.GetAssignedProxyId() != step.placedOn {
			t.Fatalf("%s: namespace on %q, want %q", step.name, n.GetAssignedProxyId(), step.placedOn)
		}
		if got, want := n.GetAssignmentIndex(), map[bool]uint64{true: h.index, false: beforePlaced}[step.placed]; got != want {
			t.Fatalf("%s at %d: assignment index %d, want %d", step.name, h.index, got, want)
		}
		if got, want := h.f.ProxyRoutesIndex(), map[bool]uint64{true: h.index, false: beforeRoutes}[step.moves]; got != want {
			t.Fatalf("%s at %d: ProxyRoutesIndex %d, want %d", step.name, h.index, got, want)
		}
		if w, _ := h.f.Assignments(owner); (len(w.GetAssignments()) == 1) != (step.placedOn == owner) {
			t.Fatalf("%s: %s is watching %v", step.name, owner, w.GetAssignments())
		}
	}
	// Placeable again, the owner takes its namespace back by a move.
	h.must(c(time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 4}))
	if n, _, _ := h.f.Namespace(ns); n.GetIncomingProxyId() != owner || n.GetMoveIndex() != h.index {
		t.Fatalf("after a rebalance: %v, want a move to %s at %d", n, owner, h.index)
	}
}

// While the owner's runner is not ready, its namespace's mailbox on the
// other proxy may be acquired (the old proxy's lease is the sidecar's to
// give back), the count of live proxies still holds the owner, and a
// snapshot keeps the flag and the placement it leads to.
func TestRunnerNotReadySurvivesSnapshot(t *testing.T) {
	t.Parallel()
	h, owner, other, mailbox := base(t)
	h.must(c(10*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: owner, RunnerNotReady: true}))
	if got := h.must(c(11*time.Second, acquire(mailboxID(ns, other), "runner-b"))).(*adminv1.AcquireLeaseResponse); !got.GetGranted() {
		t.Fatalf("acquire on the proxy the namespace moved to: %v", got)
	}
	if l, _ := h.f.Lease(mailbox); l == nil {
		t.Fatal("the old proxy's lease went with the move; releasing it is its sidecar's")
	}
	if got := h.f.Counts().LiveProxies; got != 2 {
		t.Fatalf("live proxies %d, want 2: a proxy whose runner is not ready still heartbeats", got)
	}
	g := roundTrip(t, h.f)
	if p, _ := g.Proxy(owner); !p.GetProxy().GetRunnerNotReady() {
		t.Fatalf("restored proxy %v lost runner_not_ready", p)
	}
	if n, _, _ := g.Namespace(ns); n.GetAssignedProxyId() != other {
		t.Fatalf("restored namespace on %q, want %q", n.GetAssignedProxyId(), other)
	}
	// The restored table must leave the owner out too: after a ready
	// heartbeat applied on the restored FSM, a rebalance moves the
	// namespace back, starting at its index.
	gh := &harness{t: t, f: g, index: h.index}
	if pending, _ := g.PendingMoves(); pending != 0 {
		t.Fatalf("restored FSM has %d pending moves before the owner is ready", pending)
	}
	gh.must(c(12*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: owner}))
	gh.must(c(13*time.Second, &adminv1.RebalanceCommand{MaxConcurrentMoves: 1}))
	if n, _, _ := g.Namespace(ns); n.GetAssignedProxyId() != other || n.GetIncomingProxyId() != owner || n.GetMoveIndex() != gh.index {
		t.Fatalf("after a ready heartbeat on the restored FSM: %v, want on %s moving to %s at %d", n, other, owner, gh.index)
	}
}

const liveStatus = adminv1.ProxyStatus_PROXY_STATUS_LIVE
