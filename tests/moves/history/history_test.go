// Package history proves peer recovery (docs/architecture.md#peer-recovery):
// a planned move's destination copies the source's mailbox, so the namespace
// URL keeps answering history that Kafka has deleted. Each test produces the
// events, lets the mailboxes store them, deletes the oldest 60 % of every
// partition from Kafka (DeleteRecords, as retention would) and walks every
// page of the namespaces' events through the gateway in a loop while moves
// happen. It is a package of its own, beside tests/moves, so that go test
// runs the two suites of multi-process moves at the same time.
package history

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/movetest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// batchWait keeps the runners' write batches short, so catch-up is quick.
var batchWait = []string{"--batch-wait", "20ms"}

const (
	history       = "history.events"
	historyEvents = 200
	// trimmed is the part of each partition Kafka deletes before the moves.
	trimmed = 0.6
	// walkPage is the walks' page size: a walk of 200 events is 4 pages.
	walkPage = 50
)

// historyWorld is a world whose history topic holds historyEvents events.
func historyWorld(t *testing.T) *movetest.World {
	t.Helper()
	w := movetest.New(t, kafkatest.Topics(2, history))
	w.Kafka.ProduceEnvelopes(t, history, kafkatest.Envelopes(history, historyEvents)...)
	return w
}

// createHistory creates namespaces reading the history topic.
func createHistory(w *movetest.World, names ...string) {
	for _, ns := range names {
		w.Admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{history}, Lease: movetest.Lease.Config()})
	}
}

// trim deletes the oldest part of every partition of the history topic and
// returns how many events Kafka still holds.
func trim(t *testing.T, w *movetest.World) int64 {
	t.Helper()
	low := w.Trim(history, trimmed)
	left := int64(historyEvents)
	for _, off := range low {
		left -= off
	}
	if left <= 0 || left > historyEvents/2 {
		t.Fatalf("Kafka holds %d of %d events after the trim (low watermarks %v)", left, historyEvents, low)
	}
	t.Logf("Kafka deleted the oldest %d of %d events (low watermarks %v)", historyEvents-left, historyEvents, low)
	return left
}

// replicas is namespace ns's mailboxes as the admin reports them.
func replicas(w *movetest.World, ns string) []*adminv1.NamespaceReplica {
	var r *adminv1.GetNamespaceResponse
	w.Must("get "+ns, func(ctx context.Context, a adminv1.AdminClient) (err error) {
		r, err = a.GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: ns})
		return err
	})
	return r.GetReplicas()
}

// servingReplica is ns's replica on its assigned proxy, or nil.
func servingReplica(w *movetest.World, ns string) *adminv1.NamespaceReplica {
	for _, r := range replicas(w, ns) {
		if r.GetRole() == adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING {
			return r
		}
	}
	return nil
}

// recovered checks that ns's serving mailbox was seeded by a copy of all
// the events and says its history is complete (copied), or at least that
// its history is complete (a proxy that served ns before resumes its own
// store, left on its disk, and copies nothing).
func recovered(t *testing.T, w *movetest.World, ns string, copied bool) {
	t.Helper()
	rep := servingReplica(w, ns)
	rec := rep.GetHealth().GetRecovery()
	switch {
	case !rec.GetHistoryComplete():
		t.Errorf("%s's mailbox %s: recovery %v, want its history complete", ns, rep.GetMailboxId(), rec)
	case copied && (rec.GetState() != adminv1.RecoveryState_RECOVERY_STATE_COPIED || rec.GetEventsCopied() != historyEvents):
		t.Errorf("%s's mailbox %s: recovery %v, want copied, %d events", ns, rep.GetMailboxId(), rec, historyEvents)
	}
}

// walkedBefore waits until r has walked each of namespaces whole (want
// events) at least once: what the moves must keep is what was answered.
func walkedBefore(t *testing.T, r *movetest.HistoryReader, want int, namespaces ...string) {
	t.Helper()
	testwait.For(t, 60*time.Second, fmt.Sprintf("%v walked whole by the reader", namespaces), func() (bool, string) {
		whole := map[string]bool{}
		for _, wk := range r.Walks() {
			if wk.OK() && len(wk.IDs) == want {
				whole[wk.NS] = true
			}
		}
		for _, ns := range namespaces {
			if !whole[ns] {
				return false, ns + " not yet"
			}
		}
		return true, ""
	})
}

// walkUntil waits until a walk of ns is answered by its mailbox on proxy
// with want events.
func walkUntil(t *testing.T, w *movetest.World, ns, proxy string, want int) movetest.Walk {
	t.Helper()
	var wk movetest.Walk
	testwait.For(t, 60*time.Second, fmt.Sprintf("%s walked on %s with %d events", ns, proxy, want), func() (bool, string) {
		wk = w.WalkEvents(ns, walkPage)
		last := movetest.Answer{}
		if len(wk.Pages) > 0 {
			last = wk.Pages[len(wk.Pages)-1]
		}
		return wk.OK() && last.Mailbox == ns+"@"+proxy && len(wk.IDs) == want, fmt.Sprintf("%d events, last page %s, %v", len(wk.IDs), last, wk.Err)
	})
	return wk
}

// TestMovesKeepHistoryKafkaDeleted: namespaces on two proxies hold events
// Kafka has since deleted. An operator's move, a third proxy joining
// (rebalancing) and a drain of that proxy move namespaces by handoff while
// every page of every namespace is walked through the gateway in a loop: no
// walk fails, no epoch goes down, and no walk lacks an event an earlier one
// returned; each moved namespace's mailbox says it was copied and its
// history is complete.
func TestMovesKeepHistoryKafkaDeleted(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w := historyWorld(t)
	two, three := []string{"proxy-1", "proxy-2"}, []string{"proxy-1", "proxy-2", "proxy-3"}
	for _, id := range two {
		w.StartProxy(id, batchWait...)
	}
	w.AwaitProxies(two...)
	// Names whose owner among two proxies is not their owner among three,
	// so the join moves them, and one more that stays for the operator's
	// move.
	tab2, tab3 := placement.Compute(two), placement.Compute(three)
	var joining []string
	byHand := ""
	for i := 0; len(joining) < 2 || byHand == ""; i++ {
		ns := fmt.Sprintf("hist-%d", i)
		switch p := placement.Partition(ns); {
		case tab3.Owner(p) == "proxy-3" && len(joining) < 2:
			joining = append(joining, ns)
		case tab3.Owner(p) == tab2.Owner(p) && byHand == "":
			byHand = ns
		}
	}
	names := append([]string{byHand}, joining...)
	where := map[string]string{}
	for _, ns := range names {
		where[ns] = tab2.Owner(placement.Partition(ns))
	}
	createHistory(w, names...)
	w.StartGateway()
	w.Served(where, func(n int64) bool { return n == historyEvents }, 60*time.Second)
	trim(t, w)
	r := w.ReadHistory(names, walkPage, 5*time.Millisecond, 5*time.Minute)
	walkedBefore(t, r, historyEvents, names...)
	started := time.Now()

	// (1) An operator's move.
	to := map[string]string{"proxy-1": "proxy-2", "proxy-2": "proxy-1"}[where[byHand]]
	w.Must("move "+byHand, func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: byHand, ToProxyId: to})
		return err
	})
	where[byHand] = to
	w.Settled(where, 90*time.Second)
	walkUntil(t, w, byHand, to, historyEvents)
	recovered(t, w, byHand, true)

	// (2) A third proxy joins: rebalancing moves the joining namespaces.
	w.StartProxy("proxy-3", batchWait...)
	for _, ns := range joining {
		where[ns] = "proxy-3"
	}
	w.Settled(where, 120*time.Second)
	for _, ns := range joining {
		walkUntil(t, w, ns, "proxy-3", historyEvents)
		recovered(t, w, ns, true)
	}

	// (3) The third proxy is drained: its namespaces move back.
	w.Must("cordon proxy-3", func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.CordonProxy(ctx, &adminv1.CordonProxyRequest{ProxyId: "proxy-3", Cordoned: true})
		return err
	})
	for _, ns := range joining {
		where[ns] = tab2.Owner(placement.Partition(ns))
	}
	w.Settled(where, 120*time.Second)
	for _, ns := range joining {
		walkUntil(t, w, ns, where[ns], historyEvents)
		recovered(t, w, ns, false)
	}
	time.Sleep(2 * time.Second)
	walks := r.End()
	t.Logf("%s moved by hand, %v joined proxy-3 and were drained back, in %v; %d walks", byHand, joining, time.Since(started).Round(time.Millisecond), len(walks))
	if v := movetest.JudgeHistory(walks); !v.Kept() {
		logWalks(t, walks)
		t.Errorf("%s", v)
	}
}

// TestMoveWithoutASourceFallsBackAndSaysSo: the same walk over a move whose
// source stops serving before its destination could copy it (its runner
// paused as the move starts: its proxy reports it not ready, and the
// namespace is reassigned at once). The destination falls back to Kafka:
// the walks lose the events Kafka deleted, which is what the test above
// proves peer recovery prevents, and the admin says the history is
// incomplete, from when it starts.
func TestMoveWithoutASourceFallsBackAndSaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w := historyWorld(t)
	two := []string{"proxy-1", "proxy-2"}
	w.StartProxy("proxy-1", batchWait...)
	w.StartProxy("proxy-2", append(slices.Clone(batchWait), "--recovery-give-up", "3s")...)
	w.AwaitProxies(two...)
	ns := movetest.OwnedBy("lost", "proxy-1", two...)
	createHistory(w, ns)
	w.StartGateway()
	w.Served(map[string]string{ns: "proxy-1"}, func(n int64) bool { return n == historyEvents }, 60*time.Second)
	left := trim(t, w)
	r := w.ReadHistory([]string{ns}, walkPage, 5*time.Millisecond, 5*time.Minute)
	walkedBefore(t, r, historyEvents, ns)

	src := w.Proxies["proxy-1"].Runner
	src.Pause()
	defer src.Resume()
	w.Must("move "+ns, func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: "proxy-2"})
		return err
	})
	w.Settled(map[string]string{ns: "proxy-2"}, 60*time.Second)
	var rec *adminv1.RecoveryStatus
	testwait.For(t, 60*time.Second, ns+"@proxy-2 reports its history incomplete", func() (bool, string) {
		rec = servingReplica(w, ns).GetHealth().GetRecovery()
		return rec.GetState() == adminv1.RecoveryState_RECOVERY_STATE_INCOMPLETE && !rec.GetHistoryComplete() && rec.GetHistoryStartsAt() != nil, fmt.Sprint(rec)
	})
	walkUntil(t, w, ns, "proxy-2", int(left))
	st, err := w.Stats(ns)
	if err != nil || st["history_complete"] != false || st["history_starts_at"] == nil {
		t.Fatalf("%s/stats after the fallback: %v %v, want history_complete false and history_starts_at", ns, st, err)
	}
	walks := r.End()
	logWalks(t, walks)
	v := movetest.JudgeHistory(walks)
	t.Logf("fallback: %s; recovery %v", v, rec)
	if v.Lacking == 0 || v.Lost[ns] != historyEvents-int(left) {
		t.Fatalf("the walks after a move without a copy lost %v events, want %d: %s", v.Lost, historyEvents-int(left), v)
	}
	for _, id := range slices.Sorted(maps.Keys(v.Lost)) {
		t.Logf("%s lost %d events answered before the move", id, v.Lost[id])
	}
}

// logWalks logs each change in what a namespace's walks saw: events,
// pages, the last page's mailbox, a failure.
func logWalks(t *testing.T, walks []movetest.Walk) {
	t.Helper()
	prev := map[string]string{}
	for _, wk := range walks {
		last := movetest.Answer{}
		if len(wk.Pages) > 0 {
			last = wk.Pages[len(wk.Pages)-1]
		}
		sum := fmt.Sprintf("%s: %d events in %d pages, last from %s, error %v", wk.NS, len(wk.IDs), len(wk.Pages), last.Mailbox, wk.Err)
		if sum != prev[wk.NS] {
			t.Logf("walk at %s: %s", wk.Start.Format("15:04:05.000"), sum)
			prev[wk.NS] = sum
		}
	}
}

// TestMoveWithoutPeerRecoveryLosesHistory is the operator's move of the test
// above on runners with peer recovery off (--peer-recovery=false): the
// destination reads Kafka alone, so the same walks lose the events Kafka
// deleted, and the moved mailbox says its history is incomplete.
func TestMoveWithoutPeerRecoveryLosesHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w := historyWorld(t)
	two := []string{"proxy-1", "proxy-2"}
	for _, id := range two {
		w.StartProxy(id, append(slices.Clone(batchWait), "--peer-recovery=false")...)
	}
	w.AwaitProxies(two...)
	ns := movetest.OwnedBy("off", "proxy-1", two...)
	createHistory(w, ns)
	w.StartGateway()
	w.Served(map[string]string{ns: "proxy-1"}, func(n int64) bool { return n == historyEvents }, 60*time.Second)
	left := trim(t, w)
	r := w.ReadHistory([]string{ns}, walkPage, 5*time.Millisecond, 5*time.Minute)
	walkedBefore(t, r, historyEvents, ns)
	w.Must("move "+ns, func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: "proxy-2"})
		return err
	})
	w.Settled(map[string]string{ns: "proxy-2"}, 90*time.Second)
	walkUntil(t, w, ns, "proxy-2", int(left))
	walks := r.End()
	v := movetest.JudgeHistory(walks)
	t.Logf("without peer recovery: %s", v)
	if v.Lost[ns] != historyEvents-int(left) {
		logWalks(t, walks)
		t.Fatalf("the walks after a move without peer recovery lost %v events, want %d", v.Lost, historyEvents-int(left))
	}
	if rec := servingReplica(w, ns).GetHealth().GetRecovery(); rec.GetHistoryComplete() {
		t.Fatalf("%s@proxy-2 built from Kafka alone reports %v, want its history incomplete", ns, rec)
	}
}

// TestLostProxyReassignedSaysHistoryIncomplete: a namespace whose proxy is
// lost (its runner killed with kill -9: its sidecar finds it gone and
// reports it not ready) is reassigned at once with no copy to make, and its
// new mailbox, told which mailbox held the history before it, is built from
// Kafka alone and says so: the walks lose the events Kafka deleted, the
// admin reports its recovery INCOMPLETE from its oldest event, and its
// /stats through the gateway say history_complete false with
// history_starts_at. A namespace on the other proxy, never served elsewhere,
// says its history is complete.
func TestLostProxyReassignedSaysHistoryIncomplete(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w := historyWorld(t)
	two := []string{"proxy-1", "proxy-2"}
	for _, id := range two {
		w.StartProxy(id, batchWait...)
	}
	w.AwaitProxies(two...)
	tab := placement.Compute(two)
	owned := map[string]string{}
	for i := 0; len(owned) < 2; i++ {
		name := fmt.Sprintf("gone-%d", i)
		if p := tab.Owner(placement.Partition(name)); owned[p] == "" {
			owned[p] = name
		}
	}
	lost, first := owned["proxy-1"], owned["proxy-2"]
	createHistory(w, lost, first)
	w.StartGateway()
	w.Served(map[string]string{lost: "proxy-1", first: "proxy-2"}, func(n int64) bool { return n == historyEvents }, 60*time.Second)
	left := trim(t, w)
	r := w.ReadHistory([]string{lost}, walkPage, 5*time.Millisecond, 5*time.Minute)
	walkedBefore(t, r, historyEvents, lost)

	w.Proxies["proxy-1"].Runner.Kill()
	w.Settled(map[string]string{lost: "proxy-2", first: "proxy-2"}, 60*time.Second)
	var rec *adminv1.RecoveryStatus
	testwait.For(t, 60*time.Second, lost+"@proxy-2 reports its history incomplete", func() (bool, string) {
		rec = servingReplica(w, lost).GetHealth().GetRecovery()
		return rec.GetState() == adminv1.RecoveryState_RECOVERY_STATE_INCOMPLETE && !rec.GetHistoryComplete() &&
			rec.GetHistoryStartsAt() != nil && rec.GetSourceMailboxId() == lost+"@proxy-1", fmt.Sprint(rec)
	})
	walkUntil(t, w, lost, "proxy-2", int(left))
	st, err := w.Stats(lost)
	if err != nil || st["history_complete"] != false || st["history_starts_at"] == nil {
		t.Fatalf("%s/stats after its proxy was lost: %v %v, want history_complete false and history_starts_at", lost, st, err)
	}
	st, err = w.Stats(first)
	if err != nil || st["history_complete"] != true || st["history_starts_at"] != nil {
		t.Fatalf("%s/stats: %v %v, want history_complete true", first, st, err)
	}
	if rec := servingReplica(w, first).GetHealth().GetRecovery(); !rec.GetHistoryComplete() {
		t.Fatalf("%s's recovery %v, want its history complete", first, rec)
	}
	walks := r.End()
	logWalks(t, walks)
	v := movetest.JudgeHistory(walks)
	t.Logf("lost proxy: %s; recovery %v", v, rec)
	if v.Lost[lost] != historyEvents-int(left) {
		t.Fatalf("the walks after the lost proxy's reassignment lost %v events, want %d: %s", v.Lost, historyEvents-int(left), v)
	}
}
