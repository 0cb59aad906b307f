package fsm

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

func populated(b *testing.B, leases int) *harness {
	h := newHarness(b)
	for i := range 4 {
		h.apply(c(0, registerRunner(fmt.Sprintf("proxy-%02d", i), "runner")))
	}
	for i := range leases {
		h.apply(c(0, acquire(h.created(fmt.Sprintf("ns-%05d", i)), "runner")))
	}
	if got, _ := h.f.Leases(); len(got) != leases {
		b.Fatalf("%d leases", len(got))
	}
	return h
}

// created creates namespace name and returns the mailbox placement gives it.
func (h *harness) created(name string) string {
	res := h.must(c(0, createNS(name, "t"))).(*adminv1.CreateNamespaceResponse)
	return mailboxID(name, res.GetNamespace().GetAssignedProxyId())
}

// BenchmarkApplyAcquire is the FSM's share of an acquire (decode, validate,
// grant) with 10,000 leases present.
func BenchmarkApplyAcquire(b *testing.B) {
	h := populated(b, 10_000)
	data := make([][]byte, 1024)
	for i := range data {
		data[i], _ = proto.Marshal(c(time.Second, acquire(h.created(fmt.Sprintf("bench-%04d", i)), "runner")))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.index++
		if res := h.f.Apply(&raft.Log{Index: h.index, Type: raft.LogCommand, Data: data[i%len(data)]}); !res.(*adminv1.AcquireLeaseResponse).GetGranted() {
			b.Fatal("refused")
		}
	}
}

// BenchmarkSnapshot10k persists a snapshot of 10,000 leases.
func BenchmarkSnapshot10k(b *testing.B) {
	h := populated(b, 10_000)
	b.ReportAllocs()
	for b.Loop() {
		snap, _ := h.f.Snapshot()
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(sink.Len()))
	}
}

// BenchmarkRoutes10k is the copy the xDS feed makes when routes changed.
func BenchmarkRoutes10k(b *testing.B) {
	h := populated(b, 10_000)
	b.ReportAllocs()
	for b.Loop() {
		if r, _, _ := h.f.Routes(); len(r) != 10_000 {
			b.Fatalf("%d routes", len(r))
		}
	}
}

// BenchmarkRoutesIndex10k is what the xDS feed pays after a change that left
// routes alone (a lease checkpoint, a proxy heartbeat).
func BenchmarkRoutesIndex10k(b *testing.B) {
	h := populated(b, 10_000)
	b.ReportAllocs()
	for b.Loop() {
		if h.f.RoutesIndex() == 0 {
			b.Fatal("no routes index")
		}
	}
}
