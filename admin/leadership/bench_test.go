package leadership

import (
	"context"
	"testing"
	"time"
)

// BenchmarkLease is the cost a renewal pays for the leadership check: mostly
// the answer from memory, plus its share of the rounds (each waits a round
// trip, simulated here as 200µs, and one starts every half lease).
func BenchmarkLease(b *testing.B) {
	f := &cluster{term: 5, leader: true, peers: map[string]uint64{"b": 5, "c": 5}}
	ask := func(ctx context.Context, peer string) (uint64, error) {
		time.Sleep(200 * time.Microsecond)
		return f.ask(ctx, peer)
	}
	c, err := New(Config{Leading: f.leading, Voters: f.voters, Ask: ask, Lease: 75 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Lease(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
