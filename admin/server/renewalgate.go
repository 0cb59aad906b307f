package server

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// renewalGate is the renewals' own budget on the leader: at most max of
// them are past it at once (waiting for the leadership confirmation or in
// the lessor), at most perSecond a second if set, and the rest wait here
// with their receipts open, so the wait costs them nothing (they count from
// their arrival). It serves the oldest waiter first while the queue is
// young; once the oldest has waited longer than lifoAfter, the newest:
// under sustained overload the renewals served are the fresh ones, which
// keep every sending holder's lease going, and the old ones run into their
// callers' deadlines instead of being served after them (the adaptive LIFO
// of Facebook's "Fail at Scale"). The age of the oldest waiter is what
// admission sheds new work by.
type renewalGate struct {
	clock     clock.PassiveClock
	max       int
	lifoAfter time.Duration
	limit     *rate.Limiter // nil: no rate bound

	mu      sync.Mutex
	busy    int
	waiting list.List // *renewalWaiter, in arrival order
}

type renewalWaiter struct {
	at      time.Time
	ready   chan struct{}
	granted bool // guarded by renewalGate.mu
}

func newRenewalGate(a Admission, clk clock.PassiveClock) *renewalGate {
	g := &renewalGate{clock: clk, max: a.MaxRenewalsInFlight, lifoAfter: a.ShedAfterRenewalWait}
	if a.MaxRenewalsPerSecond > 0 {
		g.limit = rate.NewLimiter(rate.Limit(a.MaxRenewalsPerSecond), max(1, int(a.MaxRenewalsPerSecond/100)))
	}
	return g
}

// enter waits for the turn of a renewal that arrived at and returns the
// leave that gives the turn back, or ctx's error if the caller gave up
// first.
func (g *renewalGate) enter(ctx context.Context, at time.Time) (leave func(), err error) {
	g.mu.Lock()
	if g.busy < g.max && g.waiting.Len() == 0 {
		g.busy++
		g.mu.Unlock()
	} else {
		w := &renewalWaiter{at: at, ready: make(chan struct{})}
		e := g.waiting.PushBack(w)
		g.mu.Unlock()
		select {
		case <-w.ready:
		case <-ctx.Done():
			g.mu.Lock()
			granted := w.granted
			if !granted {
				g.waiting.Remove(e)
			}
			g.mu.Unlock()
			if granted {
				g.leave()
			}
			return nil, fmt.Errorf("wait for the renewals' turn: %w", ctx.Err())
		}
	}
	if g.limit != nil {
		// Not limit.Wait: it gives up at once, with an error of its own,
		// when the wait would pass ctx's deadline, and the caller would
		// hear Unavailable instead of its deadline.
		r := g.limit.Reserve()
		if d := r.Delay(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				r.Cancel()
				g.leave()
				return nil, fmt.Errorf("wait for the renewals' rate: %w", ctx.Err())
			}
		}
	}
	return sync.OnceFunc(g.leave), nil
}

// leave ends a turn and hands it to the next waiter: the oldest, or the
// newest once the oldest has waited longer than lifoAfter.
func (g *renewalGate) leave() {
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy--
	for g.busy < g.max && g.waiting.Len() > 0 {
		e := g.waiting.Front()
		if now.Sub(e.Value.(*renewalWaiter).at) > g.lifoAfter {
			e = g.waiting.Back()
		}
		w := g.waiting.Remove(e).(*renewalWaiter)
		w.granted = true
		close(w.ready)
		g.busy++
	}
}

// oldestWait is how long the oldest waiting renewal has waited by now, and
// how many wait.
func (g *renewalGate) oldestWait(now time.Time) (time.Duration, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiting.Len() == 0 {
		return 0, 0
	}
	return now.Sub(g.waiting.Front().Value.(*renewalWaiter).at), g.waiting.Len()
}
