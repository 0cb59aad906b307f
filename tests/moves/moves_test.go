// Package moves proves that namespaces move between proxies without a failed
// query (docs/architecture.md#moves): a client reads namespace URLs through `prism gateway` in
// a tight, bounded loop while namespaces are handed off (make-before-break:
// the destination catches up from Kafka while the source serves, then one
// Raft command switches the alias, and the source keeps serving through the
// gateways' lookup age before it releases). The world they run in is
// testkit/movetest's, which bench/movesbench measures too.
package moves

import (
	"fmt"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/testkit/movetest"
)

// batchWait keeps the runners' write batches short, so catch-up is quick.
var batchWait = []string{"--batch-wait", "20ms"}

// allEvents accepts a quiet namespace's count once caught up.
func allEvents(n int64) bool { return n == movetest.SeedEvents }

// read queries the namespaces round robin from one client, a query every
// few milliseconds, for at most three minutes.
func read(w *movetest.World, namespaces []string) *movetest.Reader {
	return w.Read(namespaces, 1, 3*time.Millisecond, 3*time.Minute)
}

// check asserts a move's properties over a run: no failed query, every
// answer names its mailbox and epoch, each namespace's epochs never go
// down, nor its event count.
func check(t *testing.T, answers []movetest.Answer) {
	t.Helper()
	if v := movetest.Judge(answers); !v.Kept() {
		t.Errorf("%s", v)
	}
}

// create creates namespaces reading the quiet topic.
func create(w *movetest.World, names []string) {
	for _, ns := range names {
		w.Admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{movetest.Quiet}, Lease: movetest.Lease.Config()})
	}
}

// TestJoinRebalancesWithoutAFailedQuery: proxy-2 joins a mesh whose
// namespaces all sit on proxy-1. Exactly the namespaces rendezvous hashing
// now gives proxy-2 move there by handoff while a client reads every
// namespace through the gateway: no query fails, no epoch or event count
// goes down, and the rest stay on proxy-1.
func TestJoinRebalancesWithoutAFailedQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three admin nodes, two runners with sidecars and a gateway")
	}
	w := movetest.New(t)
	w.StartProxy("proxy-1", batchWait...)
	var names []string
	for i := range 8 {
		names = append(names, fmt.Sprintf("join-%d", i))
	}
	create(w, names)
	w.StartGateway()
	before := map[string]string{}
	for _, ns := range names {
		before[ns] = "proxy-1"
	}
	w.Served(before, allEvents, 60*time.Second)

	r := read(w, names)
	started := time.Now()
	w.StartProxy("proxy-2", batchWait...)
	tab := placement.Compute([]string{"proxy-1", "proxy-2"})
	want := map[string]string{}
	moving := 0
	for _, ns := range names {
		want[ns] = tab.Owner(placement.Partition(ns))
		if want[ns] == "proxy-2" {
			moving++
		}
	}
	if moving == 0 || moving == len(names) {
		t.Fatalf("hashing puts %d of %d namespaces on proxy-2: pick other names", moving, len(names))
	}
	// Catch-up of a quiet topic is quick; the bound is the switch (a lag
	// report and a mover tick) plus the source's handoff tail (12 s), for
	// at most --max-concurrent-moves (4) at a time.
	w.Settled(want, 90*time.Second)
	w.Served(want, allEvents, 30*time.Second)
	// The tails have ended and the sources closed their mailboxes: reads
	// go on a little to see that nothing reaches a closed one.
	time.Sleep(2 * time.Second)
	answers := r.End()
	t.Logf("%d of %d namespaces moved to proxy-2 by handoff in %v; %d queries", moving, len(names), time.Since(started).Round(time.Millisecond), len(answers))
	check(t, answers)
}
