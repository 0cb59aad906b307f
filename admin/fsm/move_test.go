package fsm

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

const (
	roleServing = adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING
	catchingUp  = adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP
	handingOff  = adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF
	noRole      = adminv1.AssignmentRole(-1)
	notPlaced   = adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE
	noRefusal   = adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNSPECIFIED
	moveTimeout = adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TIMEOUT
)

// moveBase is base with namespace ns on owner, its mailbox held there, and
// a move of ns to other started (by an operator) at the returned index.
func moveBase(t *testing.T) (h *harness, owner, other string, start uint64) {
	h, owner, other, _ = base(t)
	if got := h.must(c(4*time.Second, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: other})).(*MoveResult); !got.Applied {
		t.Fatalf("start move: %v", got)
	}
	return h, owner, other, h.index
}

// roleOf is ns's role in proxy's assignments, or noRole.
func roleOf(f *FSM, proxy string) adminv1.AssignmentRole {
	w, _ := f.Assignments(proxy)
	for _, a := range w.GetAssignments() {
		if a.GetNamespace() == ns {
			return a.GetRole()
		}
	}
	return noRole
}

func aliasOf(t *testing.T, f *FSM) string {
	t.Helper()
	r, _ := f.NamespaceRoute(ns)
	return r.GetMailboxId()
}

type recordingMoves struct {
	switched  []string
	abandoned []adminv1.MoveAbandonReason
}

func (r *recordingMoves) MoveSwitched(ns string, why adminv1.MoveReason) {
	r.switched = append(r.switched, ns+":"+why.String())
}

func (r *recordingMoves) MoveAbandoned(_ string, why adminv1.MoveAbandonReason) {
	r.abandoned = append(r.abandoned, why)
}

// The whole handoff, step by step: who is assigned what role, where the
// alias goes, and who may acquire, after each command.
func TestMoveLifecycle(t *testing.T) {
	t.Parallel()
	h, owner, other, _ := base(t)
	rec := &recordingMoves{}
	h.f.moves = rec
	until := at(30 * time.Second)
	var start uint64
	for _, step := range []struct {
		name                 string
		cmd                  func() *adminv1.Command
		applied              bool
		ownerRole, otherRole adminv1.AssignmentRole
		alias                string // mailbox the alias routes to
		acquireOther         adminv1.LeaseRefusalReason
	}{
		{"before", nil, false, roleServing, noRole, owner, notPlaced},
		{"start", func() *adminv1.Command {
			return c(4*time.Second, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: other})
		}, true, roleServing, catchingUp, owner, noRefusal},
		{"a second start is refused", func() *adminv1.Command {
			return c(5*time.Second, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: other})
		}, false, roleServing, catchingUp, owner, noRefusal},
		{"a switch of another move is refused", func() *adminv1.Command {
			return c(6*time.Second, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: other, MoveIndex: start + 99, HandoffUntil: until})
		}, false, roleServing, catchingUp, owner, noRefusal},
		{"switch", func() *adminv1.Command {
			return c(7*time.Second, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: other, MoveIndex: start, HandoffUntil: until})
		}, true, handingOff, roleServing, other, noRefusal},
		{"end before handoff_until is refused", func() *adminv1.Command {
			return c(29*time.Second, &adminv1.EndHandoffCommand{Namespace: ns, HandoffProxyId: owner, HandoffUntil: until})
		}, false, handingOff, roleServing, other, noRefusal},
		{"end of another tail is refused", func() *adminv1.Command {
			return c(31*time.Second, &adminv1.EndHandoffCommand{Namespace: ns, HandoffProxyId: owner, HandoffUntil: at(time.Hour)})
		}, false, handingOff, roleServing, other, noRefusal},
		{"end", func() *adminv1.Command {
			return c(31*time.Second, &adminv1.EndHandoffCommand{Namespace: ns, HandoffProxyId: owner, HandoffUntil: until})
		}, true, noRole, roleServing, other, noRefusal},
	} {
		if step.cmd != nil {
			res := h.must(step.cmd()).(*MoveResult)
			if res.Applied != step.applied {
				t.Fatalf("%s: %+v, want applied %v", step.name, res, step.applied)
			}
			if step.name == "start" {
				start = h.index
			}
			if step.name == "switch" {
				// Q's sidecar acquired while catching up (below); the
				// alias now resolves to it.
				n, _, _ := h.f.Namespace(ns)
				if n.GetAssignedProxyId() != other || n.GetAssignmentIndex() != h.index || n.GetHandoffProxyId() != owner ||
					!n.GetOperatorPlaced() || n.GetSwitchedAt().AsTime() != t0.Add(7*time.Second) {
					t.Fatalf("after the switch: %v", n)
				}
			}
		}
		if got := roleOf(h.f, owner); got != step.ownerRole {
			t.Fatalf("%s: %s's role %v, want %v", step.name, owner, got, step.ownerRole)
		}
		if got := roleOf(h.f, other); got != step.otherRole {
			t.Fatalf("%s: %s's role %v, want %v", step.name, other, got, step.otherRole)
		}
		if step.name == "start" {
			// Catching up: Q acquires its own mailbox, the alias stays on P.
			res := h.must(c(4*time.Second, acquire(mailboxID(ns, other), "runner-b"))).(*adminv1.AcquireLeaseResponse)
			if !res.GetGranted() {
				t.Fatalf("incoming proxy's acquire refused: %v", res.GetRefusal())
			}
		}
		if got := aliasOf(t, h.f); got != mailboxID(ns, step.alias) {
			t.Fatalf("%s: alias routes to %s, want %s", step.name, got, mailboxID(ns, step.alias))
		}
		// A third proxy's runner asking for the mailbox on a proxy that is
		// neither assigned nor incoming stays NOT_PLACED_HERE.
		if step.name == "before" {
			res := h.must(c(time.Second, acquire(mailboxID(ns, other), "runner-b"))).(*adminv1.AcquireLeaseResponse)
			if res.GetRefusal().GetReason() != step.acquireOther {
				t.Fatalf("%s: acquire on %s: %v, want %v", step.name, other, res.GetRefusal(), step.acquireOther)
			}
		}
	}
	if moves, _ := h.f.Moves(); len(moves) != 0 {
		t.Fatalf("moves after the end: %v", moves)
	}
	n, _, _ := h.f.Namespace(ns)
	if n.GetMoveIndex() != 0 || n.GetMoveStartedAt() != nil || n.GetHandoffUntil() != nil {
		t.Fatalf("the move's bookkeeping outlived it: %v", n)
	}
	if want := []string{ns + ":MOVE_REASON_OPERATOR"}; fmt.Sprint(rec.switched) != fmt.Sprint(want) || len(rec.abandoned) != 0 {
		t.Fatalf("observer saw switched %v abandoned %v, want %v", rec.switched, rec.abandoned, want)
	}
}

// Every way a move ends without a switch: the source keeps serving, the
// destination's assignment is gone, its acquire is refused again, and the
// observer hears the reason.
func TestMoveAbandoned(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// end applies the cause; it returns the command or nil when the
		// cause is itself a command of another kind.
		end  func(h *harness, other string, start uint64)
		want adminv1.MoveAbandonReason
	}{
		{"destination stale", func(h *harness, other string, _ uint64) {
			p, _ := h.f.Proxy(other)
			h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: other, LastSeen: p.GetProxy().GetLastSeen()}}}))
		}, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_STALE},
		{"destination runner not ready", func(h *harness, other string, _ uint64) {
			h.must(c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: other, RunnerNotReady: true}))
		}, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_NOT_READY},
		{"destination cordoned", func(h *harness, other string, _ uint64) {
			h.must(c(time.Minute, &adminv1.CordonProxyCommand{ProxyId: other, Cordoned: true}))
		}, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_CORDONED},
		{"lease lost (the mover's command)", func(h *harness, _ string, start uint64) {
			h.must(c(time.Minute, &adminv1.AbandonMoveCommand{Namespace: ns, Reason: adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_LEASE_LOST, MoveIndex: start}))
		}, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_LEASE_LOST},
		{"timeout (the mover's command)", func(h *harness, _ string, start uint64) {
			h.must(c(time.Minute, &adminv1.AbandonMoveCommand{Namespace: ns, Reason: moveTimeout, MoveIndex: start}))
		}, moveTimeout},
		{"operator cancel names no index", func(h *harness, _ string, _ uint64) {
			h.must(c(time.Minute, &adminv1.AbandonMoveCommand{Namespace: ns}))
		}, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_CANCELLED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, start := moveBase(t)
			rec := &recordingMoves{}
			h.f.moves = rec
			h.must(c(5*time.Second, acquire(mailboxID(ns, other), "runner-b")))
			// An abandon naming an older move changes nothing.
			if res := h.must(c(6*time.Second, &adminv1.AbandonMoveCommand{Namespace: ns, Reason: moveTimeout, MoveIndex: start - 1})).(*MoveResult); res.Applied {
				t.Fatal("an abandon of another move applied")
			}
			tc.end(h, other, start)
			n, _, _ := h.f.Namespace(ns)
			if n.GetAssignedProxyId() != owner || n.GetIncomingProxyId() != "" || n.GetMoveIndex() != 0 {
				t.Fatalf("after the abandon: %v, want on %s with no move", n, owner)
			}
			if roleOf(h.f, owner) != roleServing || roleOf(h.f, other) != noRole {
				t.Fatalf("roles %v/%v, want serving/none", roleOf(h.f, owner), roleOf(h.f, other))
			}
			if got := aliasOf(t, h.f); got != mailboxID(ns, owner) {
				t.Fatalf("alias %s, want the source's", got)
			}
			res := h.must(c(2*time.Minute, acquire(mailboxID(ns, other), "runner-b"))).(*adminv1.AcquireLeaseResponse)
			if res.GetRefusal().GetReason() != notPlaced {
				t.Fatalf("acquire on the abandoned destination: %v, want NOT_PLACED_HERE", res)
			}
			if len(rec.abandoned) != 1 || rec.abandoned[0] != tc.want || len(rec.switched) != 0 {
				t.Fatalf("observer saw abandoned %v switched %v, want [%v]", rec.abandoned, rec.switched, tc.want)
			}
			if res := h.must(c(3*time.Minute, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: other, MoveIndex: start, HandoffUntil: at(time.Hour)})).(*MoveResult); res.Applied {
				t.Fatal("the abandoned move switched")
			}
		})
	}
}

// A switch needs the destination's lease: without it, refused and nothing
// changes.
func TestSwitchRefusedWithoutLease(t *testing.T) {
	t.Parallel()
	h, owner, other, start := moveBase(t)
	before := tables(t, h.f)
	res := h.must(c(5*time.Second, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: other, MoveIndex: start, HandoffUntil: at(time.Minute)})).(*MoveResult)
	if res.Applied || res.Refused == "" {
		t.Fatalf("switch without the destination's lease: %+v", res)
	}
	if !bytes.Equal(before, tables(t, h.f)) {
		t.Fatal("a refused switch changed state")
	}
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != owner {
		t.Fatalf("namespace on %s", n.GetAssignedProxyId())
	}
}

// StartMove's preconditions.
func TestStartMoveRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(h *harness, owner, other string)
		ns    string
		to    func(owner, other string) string
	}{
		{"unknown namespace", nil, "no-such", func(_, other string) string { return other }},
		{"to the assigned proxy", nil, ns, func(owner, _ string) string { return owner }},
		{"to an unregistered proxy", nil, ns, func(_, _ string) string { return "proxy-99" }},
		{"to a cordoned proxy", func(h *harness, _, other string) {
			h.must(c(4*time.Second, &adminv1.CordonProxyCommand{ProxyId: other, Cordoned: true}))
		}, ns, func(_, other string) string { return other }},
		{"to a proxy whose runner is not ready", func(h *harness, _, other string) {
			h.must(c(4*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: other, RunnerNotReady: true}))
		}, ns, func(_, other string) string { return other }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, _ := base(t)
			if tc.setup != nil {
				tc.setup(h, owner, other)
			}
			before := tables(t, h.f)
			res := h.must(c(5*time.Second, &adminv1.StartMoveCommand{Namespace: tc.ns, ToProxyId: tc.to(owner, other)})).(*MoveResult)
			if res.Applied || res.Refused == "" {
				t.Fatalf("start: %+v, want refused", res)
			}
			if !bytes.Equal(before, tables(t, h.f)) {
				t.Fatal("a refused start changed state")
			}
		})
	}
}

// movesHarness has proxies p1..p3 live and namespaces ns-0..ns-(n-1)
// created on them.
func movesHarness(t *testing.T, n int) *harness {
	h := newHarness(t)
	for _, p := range []string{"p1", "p2", "p3"} {
		h.must(c(0, register(p)))
	}
	for i := range n {
		h.must(c(time.Second, createNS(fmt.Sprintf("ns-%02d", i), "t")))
	}
	return h
}

func assignedTo(h *harness) map[string]string {
	out := map[string]string{}
	nss, _ := h.f.Namespaces()
	for _, n := range nss {
		out[n.GetName()] = n.GetAssignedProxyId()
	}
	return out
}

// finishMoves switches every move in progress and ends every tail, with
// leases acquired, as the mover and the sidecars would.
func finishMoves(h *harness, d time.Duration) {
	moves, _ := h.f.Moves()
	for _, m := range moves {
		n := m.Namespace
		if m.Role == catchingUp {
			h.must(c(d, acquire(mailboxID(n.GetName(), m.To), m.To)))
			h.must(c(d, &adminv1.SwitchMoveCommand{Namespace: n.GetName(), ToProxyId: m.To, MoveIndex: n.GetMoveIndex(), HandoffUntil: timestamppb.New(t0.Add(d))}))
			continue
		}
		h.must(c(d, &adminv1.EndHandoffCommand{Namespace: n.GetName(), HandoffProxyId: m.From, HandoffUntil: n.GetHandoffUntil()}))
	}
}

// A join: only the namespaces hashing now places on the new proxy move,
// none at once, at most the limit at a time, the rest as earlier ones
// finish; every move ends on the hash owner.
func TestJoinRebalancesAtTheLimit(t *testing.T) {
	t.Parallel()
	const total, limit = 40, 3
	h := movesHarness(t, total)
	before := assignedTo(h)
	h.must(c(time.Minute, register("p4")))
	if got := assignedTo(h); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatal("a join reassigned namespaces at once")
	}
	want := map[string]string{}
	for name, a := range before {
		if o := ownerOf(name, "p1", "p2", "p3", "p4"); o != a {
			if o != "p4" {
				t.Fatalf("%s: hashing moves it from %s to %s, not to the new proxy", name, a, o)
			}
			want[name] = o
		}
	}
	if pending, _ := h.f.PendingMoves(); pending != len(want) || pending <= limit {
		t.Fatalf("pending moves %d, want %d (more than the limit %d, or the test proves nothing)", pending, len(want), limit)
	}
	moved := map[string]bool{}
	for round := 0; ; round++ {
		d := time.Minute + time.Duration(round)*time.Second
		res := h.must(c(d, &adminv1.RebalanceCommand{MaxConcurrentMoves: limit})).(*RebalanceResult)
		if _, inProgress := h.f.PendingMoves(); inProgress > limit {
			t.Fatalf("round %d: %d moves in progress, limit %d", round, inProgress, limit)
		}
		if len(res.Started) == 0 {
			break
		}
		for _, name := range res.Started {
			if _, ok := want[name]; !ok || moved[name] {
				t.Fatalf("round %d: started a move of %s (wanted: %v, already moved: %v)", round, name, ok, moved[name])
			}
			moved[name] = true
		}
		// A second rebalance before any finishes starts nothing more.
		if again := h.must(c(d, &adminv1.RebalanceCommand{MaxConcurrentMoves: limit})).(*RebalanceResult); len(res.Started) == limit && len(again.Started) != 0 {
			t.Fatalf("round %d: started %v past the limit", round, again.Started)
		}
		finishMoves(h, d)
		finishMoves(h, d)
	}
	if len(moved) != len(want) {
		t.Fatalf("moved %d namespaces, hashing wants %d", len(moved), len(want))
	}
	for name, a := range assignedTo(h) {
		if o := ownerOf(name, "p1", "p2", "p3", "p4"); a != o {
			t.Fatalf("%s ends on %s, owner %s", name, a, o)
		}
	}
}

// A cordon drains the proxy by handoff: its namespaces move (reason DRAIN)
// to their owners without it, nothing else moves, it gets nothing new, and
// an uncordon brings its partitions back by handoff too.
func TestCordonDrains(t *testing.T) {
	t.Parallel()
	h := movesHarness(t, 30)
	before := assignedTo(h)
	h.must(c(time.Minute, &adminv1.CordonProxyCommand{ProxyId: "p2", Cordoned: true}))
	if got := assignedTo(h); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatal("a cordon reassigned namespaces at once")
	}
	res := h.must(c(time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 100})).(*RebalanceResult)
	var onP2 int
	for name, a := range before {
		if a == "p2" {
			onP2++
			n, _, _ := h.f.Namespace(name)
			if n.GetIncomingProxyId() != ownerOf(name, "p1", "p3") || n.GetMoveReason() != adminv1.MoveReason_MOVE_REASON_DRAIN {
				t.Fatalf("%s on the cordoned proxy: %v", name, n)
			}
		}
	}
	if onP2 == 0 || len(res.Started) != onP2 {
		t.Fatalf("started %d moves, p2 had %d namespaces", len(res.Started), onP2)
	}
	if got := h.must(c(time.Minute, createNS("new-one", "t"))).(*adminv1.CreateNamespaceResponse); got.GetNamespace().GetAssignedProxyId() == "p2" {
		t.Fatal("a cordoned proxy got a new namespace")
	}
	finishMoves(h, 2*time.Minute)
	finishMoves(h, 2*time.Minute)
	if info, _ := h.f.Proxy("p2"); len(info.GetNamespaces()) != 0 || !info.GetProxy().GetCordoned() {
		t.Fatalf("drained p2: %v", info)
	}
	if w, _ := h.f.Assignments("p2"); len(w.GetAssignments()) != 0 {
		t.Fatalf("drained p2 still watches %v", w.GetAssignments())
	}
	// Registering again (a restarted sidecar) keeps the cordon.
	h.must(c(3*time.Minute, register("p2")))
	if info, _ := h.f.Proxy("p2"); !info.GetProxy().GetCordoned() {
		t.Fatal("re-registration cleared the cordon")
	}
	h.must(c(3*time.Minute, &adminv1.CordonProxyCommand{ProxyId: "p2", Cordoned: false}))
	h.must(c(3*time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 100}))
	finishMoves(h, 4*time.Minute)
	finishMoves(h, 4*time.Minute)
	after := assignedTo(h)
	delete(after, "new-one")
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("after uncordon:\n%v\nwant\n%v", after, before)
	}
}

// Unplanned losses stay break-before-make: a stale or runner-dead assigned
// proxy's namespace is reassigned at once, and a move of it in progress is
// abandoned (SOURCE_LOST).
func TestUnplannedLossReassignsAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(h *harness, owner string)
	}{
		{"stale", func(h *harness, owner string) {
			p, _ := h.f.Proxy(owner)
			h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
		}},
		{"runner not ready", func(h *harness, owner string) {
			h.must(c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: owner, RunnerNotReady: true}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := movesHarness(t, 20)
			before := assignedTo(h)
			// One namespace of p1 is mid-move to p3 (an operator's).
			var moving string
			for _, name := range sortedKeys(before) {
				if before[name] == "p1" {
					moving = name
					break
				}
			}
			h.must(c(30*time.Second, &adminv1.StartMoveCommand{Namespace: moving, ToProxyId: "p3"}))
			rec := &recordingMoves{}
			h.f.moves = rec
			tc.lose(h, "p1")
			for name, a := range assignedTo(h) {
				want := before[name]
				if want == "p1" {
					want = ownerOf(name, "p2", "p3")
				}
				if a != want {
					t.Fatalf("%s on %s, want %s at once", name, a, want)
				}
			}
			if n, _, _ := h.f.Namespace(moving); n.GetIncomingProxyId() != "" {
				t.Fatalf("the move of %s survived its source's loss: %v", moving, n)
			}
			if len(rec.abandoned) != 1 || rec.abandoned[0] != adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_SOURCE_LOST {
				t.Fatalf("abandoned %v, want [SOURCE_LOST]", rec.abandoned)
			}
		})
	}
}

// The same commands give the same state on every replica, and a snapshot
// taken mid-move restores it whole (old snapshots have no move fields and
// load as no move in progress: the fields' zero values).
func TestMovesDeterministicAndSnapshotted(t *testing.T) {
	t.Parallel()
	var cmds []*adminv1.Command
	h := movesHarness(t, 25)
	record := func(cmd *adminv1.Command) { h.must(cmd); cmds = append(cmds, cmd) }
	record(c(time.Minute, register("p4")))
	record(c(time.Minute, &adminv1.CordonProxyCommand{ProxyId: "p1", Cordoned: true}))
	record(c(time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 5}))
	moves, _ := h.f.Moves()
	if len(moves) != 5 {
		t.Fatalf("%d moves, want 5", len(moves))
	}
	m := moves[0]
	record(c(time.Minute, acquire(mailboxID(m.Namespace.GetName(), m.To), m.To)))
	record(c(time.Minute, &adminv1.SwitchMoveCommand{Namespace: m.Namespace.GetName(), ToProxyId: m.To, MoveIndex: m.Namespace.GetMoveIndex(), HandoffUntil: at(2 * time.Minute)}))

	g := movesHarness(t, 25)
	for _, cmd := range cmds {
		g.must(cmd)
	}
	if !bytes.Equal(dump(t, h.f), dump(t, g.f)) {
		t.Fatal("two replicas applying the same commands differ")
	}
	r := roundTrip(t, h.f)
	want, _ := h.f.Moves()
	got, _ := r.Moves()
	if len(want) != 5 || len(got) != len(want) {
		t.Fatalf("restored %d moves, want %d (4 catching up, 1 handing off)", len(got), len(want))
	}
	for i := range want {
		if got[i].From != want[i].From || got[i].To != want[i].To || got[i].Role != want[i].Role || !equalAny(got[i].Namespace, want[i].Namespace) {
			t.Fatalf("restored move %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, p := range []string{"p1", "p2", "p3", "p4"} {
		a, _ := h.f.Assignments(p)
		b, _ := r.Assignments(p)
		if !equalAny(a, b) {
			t.Fatalf("%s's assignments differ after restore", p)
		}
	}
	if p, _ := r.Proxy("p1"); !p.GetProxy().GetCordoned() {
		t.Fatal("the cordon did not survive the snapshot")
	}
}
