package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

const moveTick = 500 * time.Millisecond

// moverEnv is a single admin node on a fake clock with proxies p1 and p2,
// namespace ns on p1 with its mailbox held there (hashing keeps it on p1,
// so only the test's own moves move it).
type moverEnv struct {
	t   *testing.T
	n   *Node
	cp  adminv1.ControlPlaneClient
	adm adminv1.AdminClient
	clk *clocktesting.FakeClock
	c   context.Context
	ns  string
}

func newMoverEnv(t *testing.T) *moverEnv {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n, cp, adm, _ := startSingleWith(t, clk, time.Hour, MoveConfig{MaxLag: 100, HandoffTail: 12 * time.Second, Timeout: time.Minute, Interval: moveTick})
	e := &moverEnv{t: t, n: n, cp: cp, adm: adm, clk: clk, c: ctx(t)}
	e.register("p1")
	table := placement.Compute([]string{"p1", "p2"})
	for i := 0; e.ns == ""; i++ {
		if name := fmt.Sprintf("ns-%d", i); table.Owner(placement.Partition(name)) == "p1" {
			e.ns = name
		}
	}
	if _, err := cp.CreateNamespace(e.c, &adminv1.CreateNamespaceRequest{Namespace: e.ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	e.register("p2")
	e.acquire("p1")
	return e
}

func (e *moverEnv) register(p string) {
	e.t.Helper()
	if _, err := e.cp.RegisterProxy(e.c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: p, Address: "127.0.0.1:9000"}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *moverEnv) acquire(p string) {
	e.t.Helper()
	r, err := e.cp.AcquireLease(e.c, &adminv1.AcquireLeaseRequest{MailboxId: e.ns + "@" + p, RunnerId: p, RunnerAddress: "127.0.0.1:9001"})
	if err != nil || !r.GetGranted() {
		e.t.Fatalf("acquire %s@%s: %v, %v", e.ns, p, r, err)
	}
}

// heartbeat reports ns's lag on proxy p.
func (e *moverEnv) heartbeat(p string, lag int64, known bool) {
	e.t.Helper()
	if _, err := e.cp.ProxyHeartbeat(e.c, &adminv1.ProxyHeartbeatRequest{ProxyId: p, NamespaceHealth: []*adminv1.NamespaceHealth{
		{Namespace: e.ns, Lag: lag, LagKnown: known},
	}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *moverEnv) namespace() *adminv1.Namespace {
	n, _, _ := e.n.FSM.Namespace(e.ns)
	return n
}

// tick steps the clock by d and waits until the mover's look it fired is
// done, with what it proposed applied (the leader proposes synchronously).
func (e *moverEnv) tick(d time.Duration) {
	e.t.Helper()
	before := e.n.Server.moverTicks.Load()
	e.clk.Step(d)
	awaitState(e.t, "the mover's tick", func() bool { return e.n.Server.moverTicks.Load() > before })
}

func (e *moverEnv) start() {
	e.t.Helper()
	if r, err := e.adm.MoveNamespace(e.c, &adminv1.MoveNamespaceRequest{Namespace: e.ns, ToProxyId: "p2"}); err != nil || r.GetNamespace().GetIncomingProxyId() != "p2" {
		e.t.Fatalf("move %s to p2: %v, %v", e.ns, r, err)
	}
}

// The mover switches only on a fresh, known lag within the bound, and
// ends the tail at handoff_until; the watch streams push each role change.
func TestMoverSwitchesThenEndsTheTail(t *testing.T) {
	t.Parallel()
	e := newMoverEnv(t)
	w1, err := e.cp.WatchAssignments(e.c, &adminv1.WatchAssignmentsRequest{ProxyId: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := e.cp.WatchAssignments(e.c, &adminv1.WatchAssignmentsRequest{ProxyId: "p2"})
	if err != nil {
		t.Fatal(err)
	}
	awaitRole := func(w adminv1.ControlPlane_WatchAssignmentsClient, want adminv1.AssignmentRole, present bool) {
		t.Helper()
		for {
			m, err := w.Recv()
			if err != nil {
				t.Fatal(err)
			}
			var got *adminv1.NamespaceAssignment
			for _, a := range m.GetAssignments() {
				if a.GetNamespace() == e.ns {
					got = a
				}
			}
			if (got != nil) == present && (!present || got.GetRole() == want) {
				return
			}
		}
	}
	// A report from before the move never counts for it.
	e.heartbeat("p2", 0, true)
	e.start()
	awaitRole(w2, adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP, true)
	e.acquire("p2")
	for _, step := range []struct {
		name          string
		report        func()
		wantAssignedP string
	}{
		{"the report from before the move", func() {}, "p1"},
		{"lag unknown", func() { e.heartbeat("p2", 0, false) }, "p1"},
		{"lag above the bound", func() { e.heartbeat("p2", 101, true) }, "p1"},
		{"lag within the bound, the source not reported since the move", func() { e.heartbeat("p2", 100, true) }, "p1"},
		{"lag within the bound and the source's", func() { e.heartbeat("p1", 100, true); e.heartbeat("p2", 100, true) }, "p2"},
	} {
		step.report()
		e.tick(moveTick)
		if got := e.namespace().GetAssignedProxyId(); got != step.wantAssignedP {
			t.Fatalf("%s: assigned %s, want %s", step.name, got, step.wantAssignedP)
		}
	}
	switched := e.clk.Now()
	if n := e.namespace(); n.GetHandoffProxyId() != "p1" || !n.GetHandoffUntil().AsTime().Equal(switched.Add(12*time.Second)) {
		t.Fatalf("after the switch: %v", n)
	}
	if r, _ := e.n.FSM.NamespaceRoute(e.ns); r.GetMailboxId() != e.ns+"@p2" {
		t.Fatalf("alias routes to %v after the switch", r)
	}
	awaitRole(w2, adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING, true)
	awaitRole(w1, adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF, true)
	e.tick(11 * time.Second)
	if e.namespace().GetHandoffProxyId() != "p1" {
		t.Fatal("the tail ended before handoff_until")
	}
	e.tick(time.Second)
	if n := e.namespace(); n.GetHandoffProxyId() != "" {
		t.Fatalf("the tail outlived handoff_until: %v", n)
	}
	awaitRole(w1, 0, false)
	if got := scrapeValue(t, e.n, `prism_admin_moves_switched_total{reason="operator"}`); got != 1 {
		t.Fatalf("switched moves metric %v, want 1", got)
	}
}

// The switch waits until the destination is no further behind the topics
// than the source was at its last report before the destination's, both
// reported after the move began: the destination then holds at least what
// the source served.
func TestMoverSwitchesOnlyOverTheSourcesHistory(t *testing.T) {
	t.Parallel()
	type report struct {
		proxy string
		lag   int64
		known bool
	}
	for _, tc := range []struct {
		name string
		// beforeMove are reported before the move starts, after are
		// reported after the destination acquired.
		beforeMove, after []report
		releaseSource     bool
		want              string
	}{
		{name: "behind the source", after: []report{{"p1", 50, true}, {"p2", 51, true}}, want: "p1"},
		{name: "level with the source", after: []report{{"p1", 50, true}, {"p2", 50, true}}, want: "p2"},
		{name: "ahead of the source", after: []report{{"p1", 50, true}, {"p2", 10, true}}, want: "p2"},
		{name: "ahead of the source but over the bound", after: []report{{"p1", 500, true}, {"p2", 101, true}}, want: "p1"},
		{name: "the source's lag unknown", after: []report{{"p1", 0, false}, {"p2", 0, true}}, want: "p1"},
		{name: "the source reported only before the move", beforeMove: []report{{"p1", 50, true}}, after: []report{{"p2", 0, true}}, want: "p1"},
		{name: "the source reported only after the destination", after: []report{{"p2", 0, true}, {"p1", 50, true}}, want: "p1"},
		{name: "the destination again after the source", after: []report{{"p2", 0, true}, {"p1", 50, true}, {"p2", 0, true}}, want: "p2"},
		// The source's newest report is after the destination's: the
		// one before it counts, which the destination is not behind.
		{name: "the source's report before the destination's", after: []report{{"p1", 80, true}, {"p2", 50, true}, {"p1", 10, true}}, want: "p2"},
		{name: "behind the source's report before the destination's", after: []report{{"p1", 20, true}, {"p2", 50, true}, {"p1", 90, true}}, want: "p1"},
		{name: "the source holds no lease", after: []report{{"p2", 100, true}}, releaseSource: true, want: "p2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newMoverEnv(t)
			for _, r := range tc.beforeMove {
				e.heartbeat(r.proxy, r.lag, r.known)
			}
			e.start()
			e.acquire("p2")
			if tc.releaseSource {
				if _, err := e.cp.ReleaseLease(e.c, &adminv1.ReleaseLeaseRequest{MailboxId: e.ns + "@p1", RunnerId: "p1"}); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range tc.after {
				e.heartbeat(r.proxy, r.lag, r.known)
			}
			e.tick(moveTick)
			e.tick(moveTick)
			if got := e.namespace().GetAssignedProxyId(); got != tc.want {
				t.Fatalf("assigned %s, want %s", got, tc.want)
			}
		})
	}
}

// heartbeatPositions reports ns's lag on proxy p with stored positions on
// topic t, pos[i] for partition i (none when pos is nil).
func (e *moverEnv) heartbeatPositions(p string, lag int64, pos []int64) {
	e.t.Helper()
	e.heartbeatRecovery(p, lag, pos, adminv1.RecoveryState_RECOVERY_STATE_UNSPECIFIED)
}

// heartbeatRecovery is heartbeatPositions with the mailbox's recovery state.
func (e *moverEnv) heartbeatRecovery(p string, lag int64, pos []int64, rs adminv1.RecoveryState) {
	e.t.Helper()
	h := &adminv1.NamespaceHealth{Namespace: e.ns, Lag: lag, LagKnown: true}
	if rs != adminv1.RecoveryState_RECOVERY_STATE_UNSPECIFIED {
		h.Recovery = &adminv1.RecoveryStatus{State: rs, SourceMailboxId: e.ns + "@p1"}
	}
	for i, at := range pos {
		h.StoredPositions = append(h.StoredPositions, &adminv1.StoredPosition{Topic: "t", Partition: int32(i), NextOffset: at})
	}
	if _, err := e.cp.ProxyHeartbeat(e.c, &adminv1.ProxyHeartbeatRequest{ProxyId: p, NamespaceHealth: []*adminv1.NamespaceHealth{h}}); err != nil {
		e.t.Fatal(err)
	}
}

// When both proxies report stored positions, the switch waits until, for
// every partition the source reported, the destination's position (from
// its newest report no newer than the source's, both after the move
// began) is at least the source's, whatever the two lags say; MaxLag still
// bounds the destination's lag; when either proxy reports no positions the
// lags are compared as before.
func TestMoverSwitchesOnStoredPositions(t *testing.T) {
	t.Parallel()
	type report struct {
		proxy string
		lag   int64
		pos   []int64 // nil: no positions
	}
	const (
		copying = adminv1.RecoveryState_RECOVERY_STATE_COPYING
		copied  = adminv1.RecoveryState_RECOVERY_STATE_COPIED
	)
	for _, tc := range []struct {
		name string
		// beforeMove are reported before the move starts, after are
		// reported after the destination acquired.
		beforeMove, after []report
		// dst is the recovery state of the destination's reports.
		dst  adminv1.RecoveryState
		want string
	}{
		{name: "behind on one partition", after: []report{{"p2", 0, []int64{10, 9}}, {"p1", 0, []int64{10, 10}}}, want: "p1"},
		{name: "level", after: []report{{"p2", 0, []int64{10, 10}}, {"p1", 0, []int64{10, 10}}}, want: "p2"},
		{name: "ahead", after: []report{{"p2", 0, []int64{12, 11}}, {"p1", 0, []int64{10, 10}}}, want: "p2"},
		{name: "ahead on one, behind on the other", after: []report{{"p2", 0, []int64{12, 9}}, {"p1", 0, []int64{10, 10}}}, want: "p1"},
		{name: "a partition the destination does not report", after: []report{{"p2", 0, []int64{10}}, {"p1", 0, []int64{10, 0}}}, want: "p1"},
		{name: "a partition the source does not report", after: []report{{"p2", 0, []int64{10, 3}}, {"p1", 0, []int64{10}}}, want: "p2"},
		// The skew the lags had: the destination measured further
		// behind a later high watermark, yet holding what the source does.
		{name: "level, the destination's lag larger", after: []report{{"p2", 60, []int64{10, 10}}, {"p1", 50, []int64{10, 10}}}, want: "p2"},
		{name: "level but the destination over the lag bound", after: []report{{"p2", 101, []int64{10, 10}}, {"p1", 500, []int64{10, 10}}}, want: "p1"},
		{name: "the source's report older than the destination's", after: []report{{"p1", 0, []int64{10, 10}}, {"p2", 0, []int64{10, 10}}}, want: "p1"},
		{name: "the source again after the destination", after: []report{{"p1", 0, []int64{10, 10}}, {"p2", 0, []int64{10, 10}}, {"p1", 0, []int64{10, 10}}}, want: "p2"},
		// The destination's newest report is after the source's: the
		// one before it counts, which is behind.
		{name: "the destination's report before the source's behind", after: []report{{"p2", 0, []int64{5, 5}}, {"p1", 0, []int64{10, 10}}, {"p2", 0, []int64{20, 20}}}, want: "p1"},
		{name: "the source reported only before the move", beforeMove: []report{{"p1", 0, []int64{10, 10}}}, after: []report{{"p2", 0, []int64{10, 10}}}, want: "p1"},
		{name: "fallback, the source without positions, lag behind", after: []report{{"p1", 40, nil}, {"p2", 50, []int64{10, 10}}}, want: "p1"},
		{name: "fallback, the source without positions, lag level", after: []report{{"p1", 50, nil}, {"p2", 50, []int64{10, 9}}}, want: "p2"},
		{name: "fallback, the destination without positions, lag behind", after: []report{{"p1", 40, []int64{10, 10}}, {"p2", 50, nil}}, want: "p1"},
		{name: "fallback, the destination without positions, lag level", after: []report{{"p1", 50, []int64{10, 10}}, {"p2", 50, nil}}, want: "p2"},
		// A destination still copying from the source is never caught up,
		// even if its runner reported a lag and positions meanwhile; once
		// copied, the positions decide as always.
		{name: "the destination copying, level", after: []report{{"p2", 0, []int64{10, 10}}, {"p1", 0, []int64{10, 10}}}, dst: copying, want: "p1"},
		{name: "the destination copying, no positions", after: []report{{"p1", 50, nil}, {"p2", 0, nil}}, dst: copying, want: "p1"},
		{name: "the destination copied, level", after: []report{{"p2", 0, []int64{10, 10}}, {"p1", 0, []int64{10, 10}}}, dst: copied, want: "p2"},
		{name: "the destination copied, behind", after: []report{{"p2", 0, []int64{10, 9}}, {"p1", 0, []int64{10, 10}}}, dst: copied, want: "p1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newMoverEnv(t)
			for _, r := range tc.beforeMove {
				e.heartbeatPositions(r.proxy, r.lag, r.pos)
			}
			e.start()
			e.acquire("p2")
			for _, r := range tc.after {
				rs := adminv1.RecoveryState_RECOVERY_STATE_UNSPECIFIED
				if r.proxy == "p2" {
					rs = tc.dst
				}
				e.heartbeatRecovery(r.proxy, r.lag, r.pos, rs)
			}
			e.tick(moveTick)
			e.tick(moveTick)
			if got := e.namespace().GetAssignedProxyId(); got != tc.want {
				t.Fatalf("assigned %s, want %s", got, tc.want)
			}
		})
	}
}

// The mover abandons a move whose destination lost its lease after
// acquiring it, or that did not switch in time; the source keeps serving.
func TestMoverAbandons(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cause  func(e *moverEnv)
		reason string
		// sourceExpired: the fake clock ran past the source's lease,
		// which nobody renews here, so the alias has nowhere to go.
		sourceExpired bool
	}{
		{"lease lost", func(e *moverEnv) {
			e.acquire("p2")
			e.tick(moveTick)
			if _, err := e.cp.ReleaseLease(e.c, &adminv1.ReleaseLeaseRequest{MailboxId: e.ns + "@p2", RunnerId: "p2"}); err != nil {
				e.t.Fatal(err)
			}
			e.tick(moveTick)
		}, "lease_lost", false},
		{"timeout", func(e *moverEnv) {
			e.acquire("p2")
			e.heartbeat("p2", 1000, true) // never catches up
			e.tick(30 * time.Second)
			if e.namespace().GetIncomingProxyId() != "p2" {
				e.t.Fatal("abandoned before the timeout")
			}
			e.tick(31 * time.Second)
		}, "timeout", true},
		{"cancelled", func(e *moverEnv) {
			if r, err := e.adm.CancelMove(e.c, &adminv1.CancelMoveRequest{Namespace: e.ns}); err != nil || r.GetNamespace().GetIncomingProxyId() != "" {
				e.t.Fatalf("cancel: %v, %v", r, err)
			}
		}, "cancelled", false},
		{"destination cordoned", func(e *moverEnv) {
			if r, err := e.adm.CordonProxy(e.c, &adminv1.CordonProxyRequest{ProxyId: "p2", Cordoned: true}); err != nil || !r.GetChanged() {
				e.t.Fatalf("cordon: %v, %v", r, err)
			}
		}, "target_cordoned", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newMoverEnv(t)
			e.start()
			tc.cause(e)
			if n := e.namespace(); n.GetIncomingProxyId() != "" || n.GetAssignedProxyId() != "p1" {
				t.Fatalf("after %s: %v, want on p1 with no move", tc.name, n)
			}
			if r, _ := e.n.FSM.NamespaceRoute(e.ns); !tc.sourceExpired && r.GetMailboxId() != e.ns+"@p1" {
				t.Fatalf("alias routes to %v", r)
			}
			if got := scrapeValue(t, e.n, fmt.Sprintf(`prism_admin_moves_abandoned_total{reason=%q}`, tc.reason)); got != 1 {
				t.Fatalf("abandoned{%s} = %v, want 1", tc.reason, got)
			}
		})
	}
}

// A join is rebalanced by the mover's Rebalance, never past the limit,
// the rest started as earlier moves finish.
func TestMoverRebalancesAJoin(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n, cp, _, _ := startSingleWith(t, clk, time.Hour, MoveConfig{MaxConcurrent: 2, Interval: moveTick, HandoffTail: time.Second})
	e := &moverEnv{t: t, n: n, cp: cp, clk: clk, c: ctx(t)}
	e.register("p1")
	for i := range 30 {
		if _, err := cp.CreateNamespace(e.c, &adminv1.CreateNamespaceRequest{Namespace: fmt.Sprintf("ns-%d", i), Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
			t.Fatal(err)
		}
	}
	e.register("p2")
	pending, _ := n.FSM.PendingMoves()
	if pending < 3 {
		t.Fatalf("%d namespaces move to the new proxy; the test needs more than the limit", pending)
	}
	switched := 0
	for round := 0; switched < pending; round++ {
		if round > 3*pending {
			t.Fatalf("%d of %d moves switched after %d rounds", switched, pending, round)
		}
		e.tick(moveTick)
		moves, _ := n.FSM.Moves()
		catching := 0
		var health []*adminv1.NamespaceHealth
		for _, m := range moves {
			if m.Role != adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP {
				continue
			}
			catching++
			e.ns = m.Namespace.GetName()
			if l, _ := n.FSM.Lease(e.ns + "@p2"); l == nil {
				e.acquire("p2")
			}
			health = append(health, &adminv1.NamespaceHealth{Namespace: e.ns, LagKnown: true})
		}
		if catching > 2 {
			t.Fatalf("round %d: %d moves in progress, limit 2", round, catching)
		}
		if _, err := cp.ProxyHeartbeat(e.c, &adminv1.ProxyHeartbeatRequest{ProxyId: "p2", NamespaceHealth: health}); err != nil {
			t.Fatal(err)
		}
		switched = int(scrapeValue(t, n, `prism_admin_moves_switched_total{reason="rebalance"}`))
	}
	if p, _ := n.FSM.PendingMoves(); p != 0 {
		t.Fatalf("%d moves still pending", p)
	}
}
