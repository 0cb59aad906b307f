// Package replicas proves that a namespace with replicas keeps its whole
// history through the loss of its serving proxy and through a drain
// (docs/architecture.md#replicas): real admin nodes, runners, sidecars and
// `prism gateway` processes on an in-process Kafka (testkit/movetest), the
// oldest 60 % of every partition deleted from Kafka (DeleteRecords, as
// retention would) before the replica exists, and every page of the
// namespace's events walked through the gateway in a loop while it happens.
package replicas

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/movetest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

const (
	history       = "history.events"
	historyEvents = 200
	trimmed       = 0.6
	walkPage      = 50
)

var batchWait = []string{"--batch-wait", "20ms"}

// world is a movetest world whose history topic holds historyEvents events.
func world(t *testing.T) *movetest.World {
	t.Helper()
	w := movetest.New(t, kafkatest.Topics(2, history))
	w.Kafka.ProduceEnvelopes(t, history, kafkatest.Envelopes(history, historyEvents)...)
	return w
}

// ownedBy is the first namespace prefix-0, prefix-1, ... placement gives
// owner among proxies.
func ownedBy(prefix, owner string, proxies ...string) string {
	tab := placement.Compute(proxies)
	for i := 0; ; i++ {
		if name := fmt.Sprintf("%s-%d", prefix, i); tab.Owner(placement.Partition(name)) == owner {
			return name
		}
	}
}

// trim deletes the oldest part of every partition and returns how many
// events Kafka still holds.
func trim(t *testing.T, w *movetest.World) int64 {
	t.Helper()
	left := int64(historyEvents)
	for _, off := range w.Trim(history, trimmed) {
		left -= off
	}
	if left <= 0 || left > historyEvents/2 {
		t.Fatalf("Kafka holds %d of %d events after the trim", left, historyEvents)
	}
	return left
}

// mailboxes is ns's mailboxes by proxy, as the admin reports them.
func mailboxes(w *movetest.World, ns string) (*adminv1.Namespace, map[string]*adminv1.NamespaceReplica) {
	var r *adminv1.GetNamespaceResponse
	w.Must("get "+ns, func(ctx context.Context, a adminv1.AdminClient) (err error) {
		r, err = a.GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: ns, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
		return err
	})
	out := map[string]*adminv1.NamespaceReplica{}
	for _, m := range r.GetReplicas() {
		out[m.GetProxyId()] = m
	}
	return r.GetNamespace(), out
}

// inSyncCopy waits until ns's replica on proxy is in sync and was seeded by
// a copy of every event, its history complete, and returns its recovery.
func inSyncCopy(t *testing.T, w *movetest.World, ns, proxy string) *adminv1.RecoveryStatus {
	t.Helper()
	return seededCopy(t, w, ns, proxy, false)
}

// seededCopy is inSyncCopy, accepting as well, when orServing, the mailbox
// serving ns by then (placement moved the namespace to it).
func seededCopy(t *testing.T, w *movetest.World, ns, proxy string, orServing bool) *adminv1.RecoveryStatus {
	t.Helper()
	var rec *adminv1.RecoveryStatus
	testwait.For(t, 90*time.Second, ns+"'s replica on "+proxy+" copied and in sync", func() (bool, string) {
		_, ms := mailboxes(w, ns)
		m := ms[proxy]
		rec = m.GetHealth().GetRecovery()
		ready := m.GetRole() == adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA && m.GetInSync() ||
			orServing && m.GetRole() == adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING
		return ready &&
			rec.GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPIED && rec.GetEventsCopied() == historyEvents && rec.GetHistoryComplete(), fmt.Sprint(m)
	})
	return rec
}

// walkedWhole waits until r has walked ns whole at least once.
func walkedWhole(t *testing.T, r *movetest.HistoryReader, ns string) {
	t.Helper()
	testwait.For(t, 60*time.Second, ns+" walked whole", func() (bool, string) {
		for _, wk := range r.Walks() {
			if wk.OK() && len(wk.IDs) == historyEvents {
				return true, ""
			}
		}
		return false, ""
	})
}

func createReplicated(w *movetest.World, ns string, replicas uint32) {
	w.Admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{history}, Lease: movetest.Lease.Config(), Replicas: replicas})
}

// TestKilledServingProxyFailsOverWithFullHistory: a namespace with 2
// copies serves from proxy-1; its replica on proxy-2 is placed after Kafka
// deleted the oldest 60 % of its events, so only a copy of proxy-1's
// mailbox gives it the whole history. proxy-1's runner and sidecar are then
// killed with kill -9 while its every page is walked through the gateway:
// every walk answers the whole history (the gateway fails over to the
// in-sync replica within the request; the walks fail at most while in
// flight to the killed runner), the replica is promoted by the admin when
// proxy-1 goes stale, and a replacement replica is placed on proxy-3 and
// seeded by a copy of the promoted mailbox.
func TestKilledServingProxyFailsOverWithFullHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w := world(t)
	three := []string{"proxy-1", "proxy-2", "proxy-3"}
	ns := ownedBy("rep", "proxy-1", three...)
	w.StartProxy("proxy-1", batchWait...)
	w.AwaitProxies("proxy-1")
	createReplicated(w, ns, 2)
	w.StartGateway()
	w.Served(map[string]string{ns: "proxy-1"}, func(n int64) bool { return n == historyEvents }, 60*time.Second)
	left := trim(t, w)
	w.StartProxy("proxy-2", batchWait...)
	w.AwaitProxies("proxy-1", "proxy-2")
	inSyncCopy(t, w, ns, "proxy-2")
	w.StartProxy("proxy-3", batchWait...)
	w.AwaitProxies(three...)
	if n, _ := mailboxes(w, ns); n.GetAssignedProxyId() != "proxy-1" || len(n.GetReplicaProxyIds()) != 1 || n.GetReplicaProxyIds()[0] != "proxy-2" {
		t.Fatalf("after proxy-3 joined: %v, want served by proxy-1 with its replica kept on proxy-2", n)
	}

	r := w.ReadHistory([]string{ns}, walkPage, 5*time.Millisecond, 5*time.Minute)
	walkedWhole(t, r, ns)
	killed := time.Now()
	w.Proxies["proxy-1"].Runner.Kill()
	w.Proxies["proxy-1"].Sidecar.Kill()
	promoted := w.Settled(map[string]string{ns: "proxy-2"}, 90*time.Second)
	// proxy-3 may be the hash owner of the two left: its replica is then
	// made the serving mailbox by a handoff once in sync.
	rec := seededCopy(t, w, ns, "proxy-3", true)
	if rec.GetSourceMailboxId() != ns+"@proxy-2" {
		t.Fatalf("the replacement replica copied %s, want the promoted %s@proxy-2", rec.GetSourceMailboxId(), ns)
	}
	time.Sleep(2 * time.Second)
	walks := r.End()
	v := movetest.JudgeHistory(walks)
	t.Logf("kill -9 of proxy-1 (Kafka holds %d of %d events): promoted after %v; %s", left, historyEvents, promoted.Sub(killed).Round(time.Millisecond), v)
	if v.Lacking != 0 || v.NoMailbox != 0 || v.EpochDown != 0 || v.Walks == 0 {
		t.Errorf("the walks through the failover: %s", v)
	}
	// A walk is four requests; one in flight to the killed runner may fail
	// where the protocol cannot retry it, no more.
	if v.Failed > 1 {
		t.Errorf("%d walks failed, want at most the one in flight at the kill: %s", v.Failed, v)
	}
	// The promoted proxy-2 serves, or proxy-3 if it is the hash owner of
	// the two: placement then moves the namespace there by handoff, to a
	// replica in sync already.
	last := walks[len(walks)-1]
	if from := last.Pages[len(last.Pages)-1].Mailbox; !last.OK() || len(last.IDs) != historyEvents || from != ns+"@proxy-2" && from != ns+"@proxy-3" {
		t.Errorf("the last walk: %d events from %s (%v), want the whole history from proxy-2 or proxy-3", len(last.IDs), from, last.Err)
	}
}

// TestDrainWithReplicasMovesNoData: a namespace with 2 copies on two
// proxies, its replica seeded by a copy after Kafka deleted most of its
// events. Its serving proxy is cordoned (a drain) and then uncordoned (the
// pod back), while its every page is walked through the gateway: the
// namespace switches to its replica and back without a failed walk or a
// lost event, and no mailbox is copied again: the replica that served
// keeps its one seeding copy, and the proxy that came back resumes its
// own store.
func TestDrainWithReplicasMovesNoData(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w := world(t)
	two := []string{"proxy-1", "proxy-2"}
	ns := ownedBy("drain", "proxy-1", two...)
	w.StartProxy("proxy-1", batchWait...)
	w.AwaitProxies("proxy-1")
	createReplicated(w, ns, 2)
	w.StartGateway()
	w.Served(map[string]string{ns: "proxy-1"}, func(n int64) bool { return n == historyEvents }, 60*time.Second)
	trim(t, w)
	w.StartProxy("proxy-2", batchWait...)
	w.AwaitProxies(two...)
	seeded := inSyncCopy(t, w, ns, "proxy-2")

	r := w.ReadHistory([]string{ns}, walkPage, 5*time.Millisecond, 5*time.Minute)
	walkedWhole(t, r, ns)
	cordon := func(on bool) {
		w.Must(fmt.Sprintf("cordon proxy-1 %v", on), func(ctx context.Context, a adminv1.AdminClient) error {
			_, err := a.CordonProxy(ctx, &adminv1.CordonProxyRequest{ProxyId: "proxy-1", Cordoned: on})
			return err
		})
	}
	cordon(true)
	w.Settled(map[string]string{ns: "proxy-2"}, 90*time.Second)
	cordon(false)
	w.Settled(map[string]string{ns: "proxy-1"}, 90*time.Second)
	time.Sleep(2 * time.Second)
	walks := r.End()
	if v := movetest.JudgeHistory(walks); !v.Kept() {
		t.Errorf("the walks through the drain and back: %s", v)
	}
	_, ms := mailboxes(w, ns)
	if rec := ms["proxy-1"].GetHealth().GetRecovery(); rec.GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPIED || !rec.GetHistoryComplete() {
		t.Errorf("%s@proxy-1 after it came back: recovery %v, want its own store resumed (no copy), history complete", ns, rec)
	}
	if rec := ms["proxy-2"].GetHealth().GetRecovery(); rec.GetFinishedAt().AsTime() != seeded.GetFinishedAt().AsTime() || rec.GetEventsCopied() != seeded.GetEventsCopied() {
		t.Errorf("%s@proxy-2's recovery %v after the drain, want only its seeding copy %v", ns, rec, seeded)
	}
}
