package lease

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"
)

// BenchmarkRenew measures one leader-local heartbeat among 10,000 live
// leases: the whole server-side cost of a renewal apart from gRPC.
func BenchmarkRenew(b *testing.B) {
	clk := clocktesting.NewFakeClock(t0)
	l := New(Config{Clock: clk, Logger: quiet})
	l.Promote()
	const n = 10_000
	reqs := make([]*struct{ id string }, n)
	for i := range n {
		id := fmt.Sprintf("ns-%05d@proxy-%02d", i, i%16)
		l.LeaseGranted(lease(id, "runner", uint64(i+1), t0))
		reqs[i] = &struct{ id string }{id}
	}
	var i atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := int(i.Add(1)) % n
			if res := renewNow(l, hb(reqs[k].id, "runner", uint64(k+1))); !res.GetRenewed() {
				b.Fatalf("renew refused: %v", res.GetRefusal())
			}
		}
	})
}

// BenchmarkExpiredScan is the expiry loop's cost per tick with 10,000 live
// leases and nothing due: it must stay O(1) in the number of leases.
func BenchmarkExpiredScan(b *testing.B) {
	clk := clocktesting.NewFakeClock(t0)
	l := New(Config{Clock: clk, Logger: quiet})
	l.Promote()
	for i := range 10_000 {
		l.LeaseGranted(lease(fmt.Sprintf("ns-%05d@p", i), "runner", uint64(i+1), t0))
	}
	clk.Step(time.Second)
	for b.Loop() {
		if refs := l.Expired(); len(refs) != 0 {
			b.Fatal("unexpected expiry")
		}
	}
}

// BenchmarkPromote is a new leader's lessor taking over 1,000,000 leases
// in 1,000 sessions and 10,000 leases of their own: what promotion adds to
// a failover at the issue-20 scale.
func BenchmarkPromote(b *testing.B) {
	clk := clocktesting.NewFakeClock(t0)
	l := New(Config{Clock: clk, Logger: quiet})
	for s := range 1000 {
		sid := uint64(s + 1)
		l.SessionOpened(&adminv1.Session{Id: sid, ProxyId: "p", Ttl: durationpb.New(ttl), Grace: durationpb.New(grace), ExpiresAt: timestamppb.New(t0.Add(ttl))})
		for i := range 1000 {
			ls := lease(fmt.Sprintf("ns-%04d-%04d@p", s, i), "runner", uint64(s*1000+i+1), t0)
			ls.SessionId = sid
			l.LeaseGranted(ls)
		}
	}
	for i := range 10_000 {
		l.LeaseGranted(lease(fmt.Sprintf("own-%05d@p", i), "runner", uint64(2_000_000+i), t0))
	}
	for b.Loop() {
		l.Promote()
		l.Demote()
	}
}
