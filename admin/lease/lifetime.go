package lease

import (
	"container/heap"
	"iter"
	"time"
)

// # One lifetime for leases and sessions
//
// The primary renews and expires two kinds of holder: a lease held on its
// own, renewed by MailboxHeartbeat, and a session, renewed by
// KeepAliveSession and with it every lease attached to it (session.go). Both
// are a lifetime here, kept by the same rules, so the safety argument of the
// package documentation is made once for both
// (docs/architecture.md#heartbeat, docs/architecture.md#sessions):
//
//   - renew: a renewal that arrived by expires + grace (as the open receipts
//     leave it, arrival.go) sets expires = arrival + ttl; a later one, or one
//     after an expiry was requested, changes nothing.
//   - refill: promotion and restore give every lifetime a full ttl plus
//     ExtendOnPromote from now, whatever the old leader knew.
//   - due: expiry is requested past expires + grace, rate-limited, and
//     offered again after ExpiryRetry until the FSM removes it.

// lifetime is the primary's view of one holder's renewals: a lease of no
// session, or a session. The leases of a session have a lifetime too, which is
// never queued: they live as long as their session.
type lifetime struct {
	// key names the lease (mailbox) or the session; receipts use it.
	key arrivalKey
	ttl time.Duration
	// grace is how long after expires the holder may be ended: the lease's
	// own, or for a session the largest of its leases' (session.go).
	grace   time.Duration
	expires time.Time
	// last is the arrival of the last renewal counted, else the time of the
	// grant or open as the FSM holds it.
	last time.Time
	// counted is the arrival of the latest renewal counted on this node.
	counted time.Time
	// requested is when an expiry was last requested; zero if never.
	requested time.Time
	// next is the queue key: the deadline, or when an expiry request is
	// retried; idx is its place in its queue, -1 when not queued.
	next time.Time
	idx  int
}

func (c *lifetime) deadline() time.Time { return c.expires.Add(c.grace) }

// life gives the lifetime of an entry that embeds one.
func (c *lifetime) life() *lifetime { return c }

// lifetimes iterates the lifetimes of m's entries.
func lifetimes[K comparable, E interface{ life() *lifetime }](m map[K]E) iter.Seq[*lifetime] {
	return func(yield func(*lifetime) bool) {
		for _, e := range m {
			if !yield(e.life()) {
				return
			}
		}
	}
}

// renew counts a renewal of c, queued in q, that arrived at `at`. It reports
// false, changing nothing, when the renewal came after c's deadline or after
// an expiry was requested, which may commit whatever arrives now (a receipt
// that arrived in time held the request off: arrival.go). Receipts may be
// processed out of order: one older than a receipt already counted would
// shorten c below what its holder was told, so it moves nothing.
func (l *Lessor) renew(q *lifetimeQueue, c *lifetime, at time.Time) bool {
	if at.After(l.deadlineWith(c.key, c.deadline(), at, c.ttl+c.grace)) || !c.requested.IsZero() {
		return false
	}
	if !at.Before(c.counted) {
		c.expires, c.last, c.counted = at.Add(c.ttl), at, at
	}
	c.requested = time.Time{}
	c.next = c.deadline()
	heap.Fix(q, c.idx)
	return true
}

// due takes the lifetimes of q past their deadline at now, oldest deadline
// first, at most as many as the rate limit allows, except those a renewal
// arrived in time for and is still being processed (arrival.go). Each is
// marked requested and offered again after ExpiryRetry unless the FSM
// removes it before then.
func (l *Lessor) due(q *lifetimeQueue, now time.Time) []*lifetime {
	var out []*lifetime
	for q.Len() > 0 {
		c := (*q)[0]
		if !now.After(c.next) {
			break
		}
		if d := l.deadlineWith(c.key, c.deadline(), time.Time{}, c.ttl+c.grace); !now.After(d) {
			c.next = d
			heap.Fix(q, 0)
			continue
		}
		if !l.limiter.AllowN(now, 1) {
			break
		}
		out = append(out, c)
		c.requested = now
		c.next = now.Add(l.cfg.ExpiryRetry)
		heap.Fix(q, 0)
	}
	return out
}

// lifetimeQueue is a container/heap min-heap of lifetimes on next, ties
// broken by key so the order of expiry requests is deterministic.
type lifetimeQueue []*lifetime

func (q lifetimeQueue) Len() int { return len(q) }
func (q lifetimeQueue) Less(i, j int) bool {
	a, b := q[i], q[j]
	if !a.next.Equal(b.next) {
		return a.next.Before(b.next)
	}
	if a.key.mailbox != b.key.mailbox {
		return a.key.mailbox < b.key.mailbox
	}
	return a.key.session < b.key.session
}
func (q lifetimeQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx, q[j].idx = i, j
}
func (q *lifetimeQueue) Push(x any) {
	c := x.(*lifetime)
	c.idx = len(*q)
	*q = append(*q, c)
}
func (q *lifetimeQueue) Pop() any {
	old := *q
	c := old[len(old)-1]
	old[len(old)-1] = nil
	c.idx = -1
	*q = old[:len(old)-1]
	return c
}

// track queues c at its deadline, no expiry requested.
func (q *lifetimeQueue) track(c *lifetime) {
	c.requested = time.Time{}
	c.next = c.deadline()
	heap.Push(q, c)
}

// remove takes c out of q if it is queued.
func (q *lifetimeQueue) remove(c *lifetime) {
	if c.idx >= 0 {
		heap.Remove(q, c.idx)
	}
}

// reschedule moves c, if queued and no expiry is requested, to its
// deadline: after its grace changed, or a receipt's hold on it ended.
func (q *lifetimeQueue) reschedule(c *lifetime) {
	if c.idx >= 0 && c.requested.IsZero() {
		c.next = c.deadline()
		heap.Fix(q, c.idx)
	}
}

// refill replaces q's lifetimes with cs, each given a full ttl plus extend from
// now. The queue is built whole and heapified once, O(n), rather than pushed
// one by one, so a leader promoted over many leases answers sooner; its
// order does not depend on how it was built (ties break by key).
func (q *lifetimeQueue) refill(cs iter.Seq[*lifetime], now time.Time, extend time.Duration) {
	*q = (*q)[:0]
	for c := range cs {
		c.expires = now.Add(c.ttl + extend)
		c.requested = time.Time{}
		c.next = c.deadline()
		c.idx = len(*q)
		*q = append(*q, c)
	}
	heap.Init(q)
}

// clear forgets every queued lifetime.
func (q *lifetimeQueue) clear() {
	for _, c := range *q {
		c.idx = -1
	}
	*q = nil
}
