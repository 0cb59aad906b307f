package fsm

import (
	"bytes"
	"io"
	"maps"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// openFailed is a heartbeat from proxy reporting it cannot open the
// mailboxes of namespaces.
func openFailed(proxy string, namespaces ...string) *adminv1.ProxyHeartbeatRequest {
	hb := &adminv1.ProxyHeartbeatRequest{ProxyId: proxy}
	for _, ns := range namespaces {
		hb.NamespaceHealth = append(hb.NamespaceHealth, &adminv1.NamespaceHealth{
			Namespace: ns, Status: adminv1.HealthStatus_HEALTH_STATUS_UNHEALTHY, OpenFailed: true, OpenFailure: "open " + ns + ": damaged",
		})
	}
	return hb
}

func excludedUntil(h *harness, proxy, ns string) *timestamppb.Timestamp {
	p, _ := h.f.Proxy(proxy)
	return healthEntry(p.GetProxy(), ns).GetExcludedUntil()
}

// A namespace whose store its proxy cannot open moves at once to the next
// proxy in rendezvous order, and only that namespace; the next proxy failing
// too sends it on to the third.
func TestOpenFailureMovesTheNamespaceAtOnce(t *testing.T) {
	t.Parallel()
	h := movesHarness(t, 20)
	before := assignedTo(h)
	ns := nsOn("bad", "p1", "p1", "p2", "p3")
	h.must(c(2*time.Second, createNS(ns, "t")))
	rec := &recordingMoves{}
	h.f.moves = rec

	h.must(c(time.Minute, openFailed("p1", ns)))
	second := ownerOf(ns, "p2", "p3")
	after := assignedTo(h)
	if after[ns] != second {
		t.Fatalf("%s on %s after p1 reported it unopenable, want %s (next by rendezvous) at once", ns, after[ns], second)
	}
	delete(after, ns)
	if !maps.Equal(after, before) {
		t.Fatalf("other namespaces moved: %v, want %v", after, before)
	}
	if want := at(time.Minute + DefaultOpenFailureExclusion); !excludedUntil(h, "p1", ns).AsTime().Equal(want.AsTime()) {
		t.Fatalf("p1 excluded from %s until %v, want %v", ns, excludedUntil(h, "p1", ns), want)
	}
	if moves, _ := h.f.Moves(); len(moves) != 0 {
		t.Fatalf("unplanned reassignment left moves %v", moves)
	}

	third := "p1"
	for _, p := range []string{"p2", "p3"} {
		if p != second {
			third = p
		}
	}
	h.must(c(2*time.Minute, openFailed(second, ns)))
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != third {
		t.Fatalf("%s on %s after %s failed too, want %s", ns, n.GetAssignedProxyId(), second, third)
	}
	h.must(c(3*time.Minute, openFailed(third, ns)))
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != "" {
		t.Fatalf("%s on %s with every proxy excluded, want none", ns, n.GetAssignedProxyId())
	}
}

// The exclusion outlives the proxy's reports (it stops reporting once the
// namespace is gone) until the window passes; then the proxy's next
// heartbeat drops it and the namespace moves back by handoff, a move that
// is abandoned if the proxy still cannot open it.
func TestOpenFailureExclusionEnds(t *testing.T) {
	t.Parallel()
	h := movesHarness(t, 0)
	ns := nsOn("bad", "p1", "p1", "p2", "p3")
	h.must(c(time.Second, createNS(ns, "t")))
	h.must(c(time.Minute, openFailed("p1", ns)))
	second := ownerOf(ns, "p2", "p3")

	h.must(c(time.Minute+DefaultOpenFailureExclusion-time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}))
	if excludedUntil(h, "p1", ns) == nil {
		t.Fatalf("exclusion dropped before its end")
	}
	if pending, _ := h.f.PendingMoves(); pending != 0 {
		t.Fatalf("%d moves pending while p1 is excluded", pending)
	}

	h.must(c(time.Minute+DefaultOpenFailureExclusion, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}))
	if u := excludedUntil(h, "p1", ns); u != nil {
		t.Fatalf("exclusion kept past its end: %v", u)
	}
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != second {
		t.Fatalf("%s on %s, want it still served by %s until a handoff", ns, n.GetAssignedProxyId(), second)
	}
	res := h.must(c(time.Minute+DefaultOpenFailureExclusion+2*time.Second, &adminv1.RebalanceCommand{MaxConcurrentMoves: 4})).(*RebalanceResult)
	if n, _, _ := h.f.Namespace(ns); len(res.Started) != 1 || n.GetIncomingProxyId() != "p1" {
		t.Fatalf("rebalance started %v, %s incoming %q; want the move back to p1", res.Started, ns, n.GetIncomingProxyId())
	}

	rec := &recordingMoves{}
	h.f.moves = rec
	h.must(c(time.Minute+DefaultOpenFailureExclusion+time.Minute, openFailed("p1", ns)))
	n, _, _ := h.f.Namespace(ns)
	if n.GetIncomingProxyId() != "" || n.GetAssignedProxyId() != second {
		t.Fatalf("after p1 failed again while catching up: assigned %q incoming %q, want %s and no move", n.GetAssignedProxyId(), n.GetIncomingProxyId(), second)
	}
	if len(rec.abandoned) != 1 || rec.abandoned[0] != adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_NOT_READY {
		t.Fatalf("abandoned %v, want [TARGET_NOT_READY]", rec.abandoned)
	}
}

// Only the admin sets excluded_until, and only for a namespace that exists;
// an operator's move toward an excluded proxy is refused; the exclusion
// survives a re-registration and a snapshot.
func TestOpenFailureExclusionIsTheAdmins(t *testing.T) {
	t.Parallel()
	h := movesHarness(t, 0)
	ns := nsOn("bad", "p1", "p1", "p2", "p3")
	h.must(c(time.Second, createNS(ns, "t")))

	forged := &adminv1.ProxyHeartbeatRequest{ProxyId: "p1", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: ns, ExcludedUntil: at(time.Hour)}}}
	h.must(c(time.Minute, forged))
	h.must(c(time.Minute, openFailed("p2", "no-such-namespace")))
	if excludedUntil(h, "p1", ns) != nil || excludedUntil(h, "p2", "no-such-namespace") != nil {
		t.Fatalf("a sidecar's excluded_until or an unknown namespace made an exclusion")
	}
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != "p1" {
		t.Fatalf("%s moved to %s without a report", ns, n.GetAssignedProxyId())
	}

	h.must(c(2*time.Minute, openFailed("p1", ns)))
	h.must(c(2*time.Minute, register("p1")))
	if excludedUntil(h, "p1", ns) == nil {
		t.Fatalf("re-registering dropped the exclusion")
	}
	if res := h.must(c(3*time.Minute, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: "p1"})).(*MoveResult); res.Applied {
		t.Fatalf("an operator's move to the excluded proxy was applied")
	}

	restored := New()
	if err := restored.Restore(io.NopCloser(bytes.NewReader(dump(t, h.f)))); err != nil {
		t.Fatalf("restore: %v", err)
	}
	p, _ := restored.Proxy("p1")
	if healthEntry(p.GetProxy(), ns).GetExcludedUntil() == nil {
		t.Fatalf("the exclusion did not survive a snapshot")
	}
}

func TestOpenFailureTooLongRefused(t *testing.T) {
	t.Parallel()
	hb := openFailed("p1", "a")
	hb.NamespaceHealth[0].OpenFailure = string(make([]byte, maxOpenFailureLen+1))
	if err := Validate(c(0, hb)); err == nil {
		t.Fatalf("an open_failure of %d bytes was accepted", maxOpenFailureLen+1)
	}
}

// withWindow is cmd carrying the leader's exclusion window w.
func withWindow(cmd *adminv1.Command, w time.Duration) *adminv1.Command {
	cmd.OpenFailureExclusion = durationpb.New(w)
	return cmd
}

// The window is the entry's: two replicas applying the same entries exclude
// until the same instant whatever they were started with, an entry without
// a window (written before it was carried) keeps the 10 minutes, and the
// exclusion ends when the entry's window says.
func TestOpenFailureExclusionWindowIsTheEntrys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window time.Duration // 0: an entry without the field
		want   time.Duration
	}{
		{"old entry", 0, DefaultOpenFailureExclusion},
		{"two minutes", 2 * time.Minute, 2 * time.Minute},
		{"an hour", time.Hour, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var replicas []*harness
			for range 2 {
				h := movesHarness(t, 0)
				ns := nsOn("bad", "p1", "p1", "p2", "p3")
				h.must(c(time.Second, createNS(ns, "t")))
				cmd := c(time.Minute, openFailed("p1", ns))
				if tc.window != 0 {
					cmd = withWindow(cmd, tc.window)
				}
				h.must(cmd)
				if got := excludedUntil(h, "p1", ns); !got.AsTime().Equal(at(time.Minute + tc.want).AsTime()) {
					t.Fatalf("excluded until %v, want %v", got.AsTime(), at(time.Minute+tc.want).AsTime())
				}
				h.must(c(time.Minute+tc.want-time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}))
				if excludedUntil(h, "p1", ns) == nil {
					t.Fatalf("exclusion dropped a second before its window ended")
				}
				h.must(c(time.Minute+tc.want, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}))
				if u := excludedUntil(h, "p1", ns); u != nil {
					t.Fatalf("exclusion kept past its window: %v", u.AsTime())
				}
				replicas = append(replicas, h)
			}
			if !bytes.Equal(dump(t, replicas[0].f), dump(t, replicas[1].f)) {
				t.Fatalf("replicas applying the same entries differ")
			}
		})
	}
}

func TestOpenFailureExclusionWindowRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cmd  *adminv1.Command
	}{
		{"zero", withWindow(c(0, openFailed("p1", "a")), 0)},
		{"negative", withWindow(c(0, openFailed("p1", "a")), -time.Minute)},
		{"under a second", withWindow(c(0, openFailed("p1", "a")), MinOpenFailureExclusion-1)},
		{"over a week", withWindow(c(0, openFailed("p1", "a")), MaxOpenFailureExclusion+1)},
		{"not a heartbeat", withWindow(c(0, register("p1")), time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := Validate(tc.cmd); err == nil {
				t.Fatalf("window %v accepted", tc.cmd.GetOpenFailureExclusion().AsDuration())
			}
			h := newHarness(t)
			h.must(c(0, register("p1")))
			before := tables(t, h.f)
			if _, ok := h.apply(tc.cmd).(error); !ok {
				t.Fatalf("an entry with window %v applied", tc.cmd.GetOpenFailureExclusion().AsDuration())
			}
			if !bytes.Equal(before, tables(t, h.f)) {
				t.Fatalf("a refused entry changed state")
			}
		})
	}
	for _, d := range []time.Duration{MinOpenFailureExclusion, DefaultOpenFailureExclusion, MaxOpenFailureExclusion} {
		if err := Validate(withWindow(c(0, openFailed("p1", "a")), d)); err != nil {
			t.Fatalf("window %v refused: %v", d, err)
		}
	}
}
