package server

import (
	"container/heap"
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prism-mesh/prism/admin/lease"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// renewalGate is the renewals' own budget on the leader: at most max of
// them are past it at once (waiting for the leadership confirmation or in
// the lessor), at most perSecond a second if set, and the rest wait here
// with their receipts open, so the wait costs them nothing (they count from
// their arrival).
//
// While the queue is young (its oldest waiter has waited at most
// staleAfter) it serves in arrival order. Past that the leader is behind
// and the order is by urgency: the lease or session whose holder's expiry
// is nearest goes first (earliest deadline first), with that key's newest
// waiter, the one whose answer extends furthest and whose caller is most
// likely still waiting; the key's urgency then moves to that arrival +
// ttl, so a busy holder's many keepalives do not crowd out a quiet one's
// single keepalive. So when the leader can renew only some of what
// arrives, it renews every holder once before any twice, and the ones it
// leaves waiting are the ones that can wait; the rest run into their
// callers' deadlines. The age of the oldest waiter is what admission
// sheds new work by.
type renewalGate struct {
	clock      clock.PassiveClock
	max        int
	staleAfter time.Duration
	limit      *rate.Limiter // nil: no rate bound

	mu      sync.Mutex
	busy    int
	waiting list.List // *renewalWaiter, in arrival order
	keys    map[any]*gateKey
	urgent  keyHeap // the keys with waiters, nearest due first
}

type renewalWaiter struct {
	rc      *lease.Receipt
	ready   chan struct{}
	granted bool // guarded by renewalGate.mu
	elem    *list.Element
	key     *gateKey
	keyElem *list.Element
}

// gateKey is one lease's or session's waiters.
type gateKey struct {
	id      any
	due     time.Time
	waiting list.List // *renewalWaiter, in arrival order
	idx     int
}

type keyHeap []*gateKey

func (h keyHeap) Len() int           { return len(h) }
func (h keyHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h keyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *keyHeap) Push(x any)        { k := x.(*gateKey); k.idx = len(*h); *h = append(*h, k) }
func (h *keyHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	*h = old[:len(old)-1]
	k.idx = -1
	return k
}

func newRenewalGate(a Admission, clk clock.PassiveClock) *renewalGate {
	g := &renewalGate{clock: clk, max: a.MaxRenewalsInFlight, staleAfter: a.ShedAfterRenewalWait, keys: map[any]*gateKey{}}
	if a.MaxRenewalsPerSecond > 0 {
		g.limit = rate.NewLimiter(rate.Limit(a.MaxRenewalsPerSecond), max(1, int(a.MaxRenewalsPerSecond/100)))
	}
	return g
}

// enter waits for rc's renewal's turn and returns the leave that gives the
// turn back, or ctx's error if the caller gave up first.
func (g *renewalGate) enter(ctx context.Context, rc *lease.Receipt) (leave func(), err error) {
	g.mu.Lock()
	if g.busy < g.max && g.waiting.Len() == 0 {
		g.busy++
		g.mu.Unlock()
	} else {
		w := g.push(rc)
		g.mu.Unlock()
		select {
		case <-w.ready:
		case <-ctx.Done():
			g.mu.Lock()
			granted := w.granted
			if !granted {
				g.remove(w)
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

// push queues a waiter for rc; g.mu is held.
func (g *renewalGate) push(rc *lease.Receipt) *renewalWaiter {
	w := &renewalWaiter{rc: rc, ready: make(chan struct{})}
	w.elem = g.waiting.PushBack(w)
	k, ok := g.keys[rc.Key()]
	if !ok {
		k = &gateKey{id: rc.Key(), due: rc.Due()}
		g.keys[k.id] = k
		heap.Push(&g.urgent, k)
	}
	w.key, w.keyElem = k, k.waiting.PushBack(w)
	return w
}

// remove takes w out of the queue; g.mu is held.
func (g *renewalGate) remove(w *renewalWaiter) {
	g.waiting.Remove(w.elem)
	k := w.key
	k.waiting.Remove(w.keyElem)
	if k.waiting.Len() == 0 {
		heap.Remove(&g.urgent, k.idx)
		delete(g.keys, k.id)
	}
}

// leave ends a turn and hands it on (see renewalGate for the order).
func (g *renewalGate) leave() {
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy--
	for g.busy < g.max && g.waiting.Len() > 0 {
		w := g.waiting.Front().Value.(*renewalWaiter)
		if now.Sub(w.rc.At()) > g.staleAfter {
			w = g.urgent[0].waiting.Back().Value.(*renewalWaiter)
		}
		k := w.key
		g.remove(w)
		if k.idx >= 0 {
			// The key's holder is good until this renewal's arrival + ttl
			// once it is processed.
			if d := w.rc.At().Add(w.rc.TTL()); d.After(k.due) {
				k.due = d
				heap.Fix(&g.urgent, k.idx)
			}
		}
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
	return now.Sub(g.waiting.Front().Value.(*renewalWaiter).rc.At()), g.waiting.Len()
}
