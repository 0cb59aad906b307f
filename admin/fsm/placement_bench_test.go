package fsm

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// placed is an FSM with 20 live proxies and n namespaces on their owners,
// written straight into the state: applying n creates through the harness
// would check its indexes after each.
func placed(b *testing.B, n int) *harness {
	h := newHarness(b)
	for i := range 20 {
		h.apply(c(0, registerRunner(fmt.Sprintf("proxy-%02d", i), "runner")))
	}
	cfg := createNS("x", "t").GetConfig()
	h.f.mu.Lock()
	for i := range n {
		name := fmt.Sprintf("ns-%07d", i)
		h.index++
		tx := &txn{st: h.f.st, index: h.index}
		ns := &adminv1.Namespace{Name: name, Config: cfg, Partition: placement.Partition(name), CreatedIndex: h.index, AssignmentIndex: h.index}
		ns.AssignedProxyId = tx.st.ownerOf(ns)
		tx.putNamespace(ns)
	}
	h.f.mu.Unlock()
	return h
}

// applyRaw applies cmd as the next entry without the harness's checks.
func (h *harness) applyRaw(cmd *adminv1.Command) any {
	data, err := proto.Marshal(cmd)
	if err != nil {
		h.t.Fatal(err)
	}
	h.index++
	return h.f.Apply(&raft.Log{Index: h.index, Type: raft.LogCommand, Data: data})
}

// BenchmarkPlacement is the FSM's apply of a proxy joining and leaving
// (two placement changes: RegisterProxy of a new proxy, then
// MarkProxiesStale of it) and of a live proxy's RegisterProxy (its response
// lists the proxy's assignments, a twentieth of the namespaces), with 100k
// and 1M namespaces on 20 proxies. register reports the heap the FSM holds
// per namespace.
func BenchmarkPlacement(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		h := placed(b, n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
		b.Run(fmt.Sprintf("join+leave/%d", n), func(b *testing.B) {
			for b.Loop() {
				res := h.applyRaw(c(0, registerRunner("proxy-new", "runner"))).(*adminv1.RegisterProxyResponse)
				stale := &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: "proxy-new", LastSeen: res.GetProxy().GetLastSeen()}}}
				if got := h.applyRaw(c(0, stale)).(*MarkStaleResult); len(got.Marked) != 1 {
					b.Fatalf("marked %v", got.Marked)
				}
			}
		})
		b.Run(fmt.Sprintf("register/%d", n), func(b *testing.B) {
			for b.Loop() {
				res := h.applyRaw(c(0, registerRunner("proxy-07", "runner"))).(*adminv1.RegisterProxyResponse)
				if len(res.GetAssignments()) < n/40 {
					b.Fatalf("%d assignments", len(res.GetAssignments()))
				}
			}
			b.ReportMetric(heap, "heap-B/namespace")
		})
	}
}
