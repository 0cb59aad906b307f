package leadership

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

const lease = 100 * time.Millisecond

// cluster is a fake node: its own term and leadership, and each peer's term
// (0 for a peer that does not answer).
type cluster struct {
	mu     sync.Mutex
	term   uint64
	leader bool
	peers  map[string]uint64
	asks   atomic.Int64
	// gate, when set, holds every Ask until it is closed, after telling
	// arrived.
	gate    chan struct{}
	arrived chan struct{}
}

func (f *cluster) leading() (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.term, f.leader
}

func (f *cluster) voters() ([]string, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.peers {
		ids = append(ids, id)
	}
	return ids, (len(ids)+1)/2 + 1, nil
}

func (f *cluster) ask(ctx context.Context, peer string) (uint64, error) {
	f.asks.Add(1)
	f.mu.Lock()
	gate, arrived := f.gate, f.arrived
	f.mu.Unlock()
	if gate != nil {
		arrived <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.peers[peer]; t != 0 {
		return t, nil
	}
	return 0, errors.New("unreachable")
}

func (f *cluster) set(fn func(*cluster)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func newChecker(t *testing.T, f *cluster) (*Checker, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	c, err := New(Config{Leading: f.leading, Voters: f.voters, Ask: f.ask, Lease: lease, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

func TestLeaseQuorum(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		peers  map[string]uint64
		leader bool
		ok     bool
	}{
		{"single voter", map[string]uint64{}, true, true},
		{"single voter, not leading", map[string]uint64{}, false, false},
		{"3 voters, both peers in term", map[string]uint64{"b": 5, "c": 5}, true, true},
		{"3 voters, one peer down", map[string]uint64{"b": 5, "c": 0}, true, true},
		{"3 voters, both peers down", map[string]uint64{"b": 0, "c": 0}, true, false},
		{"3 voters, a peer behind counts", map[string]uint64{"b": 4, "c": 0}, true, true},
		{"3 voters, the other peer down, one in a later term", map[string]uint64{"b": 0, "c": 6}, true, false},
		{"3 voters, both peers in a later term", map[string]uint64{"b": 6, "c": 6}, true, false},
		{"5 voters, two down", map[string]uint64{"b": 5, "c": 5, "d": 0, "e": 0}, true, true},
		{"5 voters, three down", map[string]uint64{"b": 5, "c": 0, "d": 0, "e": 0}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &cluster{term: 5, leader: tc.leader, peers: tc.peers}
			c, _ := newChecker(t, f)
			err := c.Lease(context.Background())
			if tc.ok && err != nil {
				t.Fatalf("Lease: %v, want confirmed", err)
			}
			if !tc.ok && !errors.Is(err, ErrNotLeader) {
				t.Fatalf("Lease: %v, want ErrNotLeader", err)
			}
		})
	}
}

// A confirmation is reused while it is younger than the lease and never after:
// the case of a leader paused past the election timeout and resumed after a
// successor was elected. The pause is the fake clock moving on.
func TestResumedLeaderIsNotConfirmed(t *testing.T) {
	t.Parallel()
	f, c, clk := confirmed(t)
	ctx := context.Background()
	asked := f.asks.Load()
	clk.Step(lease/2 - time.Millisecond)
	if err := c.Lease(ctx); err != nil {
		t.Fatalf("within the lease: %v", err)
	}
	if n := f.asks.Load(); n != asked {
		t.Fatalf("a fresh confirmation asked the peers again (%d asks, want %d)", n, asked)
	}
	// Paused for three leases; meanwhile b and c elected c in term 6, and
	// raft on this node has not noticed yet.
	clk.Step(3 * lease)
	f.set(func(f *cluster) { f.peers["b"], f.peers["c"] = 6, 6 })
	if err := c.Lease(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("resumed deposed leader: Lease = %v, want ErrNotLeader", err)
	}
	if f.asks.Load() == asked {
		t.Fatal("the stale confirmation was used without asking")
	}
}

// Past half the lease a caller is still answered from the last round and
// starts the next one without waiting for it.
func TestLeaseRefreshesEarly(t *testing.T) {
	t.Parallel()
	f, c, clk := confirmed(t)
	ctx := context.Background()
	f.set(func(f *cluster) { f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 16) })
	clk.Step(lease * 3 / 4)
	if err := c.Lease(ctx); err != nil {
		t.Fatalf("with the next round held: %v", err)
	}
	waitAsks(f, 2)
	close(f.gate)
}

// Since is the ReadIndex rule: only a round that started at or after t counts,
// however recent the last one.
func TestSinceNeedsARoundStartedAfter(t *testing.T) {
	t.Parallel()
	f, c, clk := confirmed(t)
	ctx := context.Background()
	asked := f.asks.Load()
	clk.Step(time.Millisecond)
	if err := c.Since(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if f.asks.Load() == asked {
		t.Fatal("Since(now) used a round that started before now")
	}
}

// A term change during the round fails it, even when the peers confirmed the
// old term.
func TestTermChangeDuringRound(t *testing.T) {
	t.Parallel()
	f := gated(map[string]uint64{"b": 5, "c": 5})
	c, _ := newChecker(t, f)
	done := make(chan error, 1)
	go func() { done <- c.Lease(context.Background()) }()
	waitAsks(f, 2)
	f.set(func(f *cluster) { f.term = 7 })
	close(f.gate)
	if err := <-done; !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Lease = %v, want ErrNotLeader", err)
	}
}

// Callers that arrive while a round runs share it, so the cost per renewal
// falls as load grows.
func TestConcurrentCallersShareARound(t *testing.T) {
	t.Parallel()
	f := gated(map[string]uint64{"b": 5, "c": 5})
	c, _ := newChecker(t, f)
	const callers = 50
	errs := make(chan error, callers)
	for range callers {
		go func() { errs <- c.Lease(context.Background()) }()
	}
	waitAsks(f, 2)
	close(f.gate)
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := f.asks.Load(); n != 2 {
		t.Fatalf("%d callers made %d asks, want one round of 2", callers, n)
	}
}

func TestLeaseHonoursContext(t *testing.T) {
	t.Parallel()
	f := gated(map[string]uint64{"b": 5, "c": 5})
	defer close(f.gate)
	c, _ := newChecker(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Lease(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lease = %v, want context.Canceled", err)
	}
}

// confirmed returns a 3-voter cluster whose checker has just had its first
// round confirmed, at the fake clock's start.
func confirmed(t *testing.T) (*cluster, *Checker, *clocktesting.FakeClock) {
	t.Helper()
	f := &cluster{term: 5, leader: true, peers: map[string]uint64{"b": 5, "c": 5}}
	c, clk := newChecker(t, f)
	if err := c.Lease(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, c, clk
}

// gated returns a cluster whose Asks wait for its gate.
func gated(peers map[string]uint64) *cluster {
	return &cluster{term: 5, leader: true, peers: peers, gate: make(chan struct{}), arrived: make(chan struct{}, 16)}
}

func waitAsks(f *cluster, n int) {
	for range n {
		<-f.arrived
	}
}
