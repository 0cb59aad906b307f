package lease

import (
	"slices"
	"time"
)

// # Expiry follows the holder's silence, not the admin's queue
//
// A renewal counts from when it arrived at the primary, not from when the
// primary got round to it. The server takes a Receipt as soon as a
// heartbeat or keepalive reaches the leader, before it waits for the
// leadership confirmation, the lessor's lock or anything else, and Renew and
// KeepAlive judge and extend from the receipt's time: a renewal that arrived
// before expires + grace is not late, however long it queued, and extends
// to arrival + ttl. While a receipt is open (taken, not yet Closed), Expired
// and ExpiredSessions do not request the expiry of a lease or session it
// arrived in time for, until arrival + ttl + grace, the deadline the renewal
// would give it: so an overloaded leader answers late, but never turns an
// on-time renewal into an expiry. (That bound keeps a wedged handler from
// pinning a lease forever.) "In time" chains: a renewal that arrived before
// the deadline an earlier, still waiting one will set is in time too, so a
// holder that keeps sending is not cut off by a backlog longer than ttl.
//
// Why extending from arrival is safe: the holder computes its validity from
// its send time s, and the renewal cannot arrive before it was sent, so s <=
// arrival <= the time it is processed: the leader's view of the lease ends
// no later than it would have from processing, and never before the
// holder's (arrival + ttl + grace > s + ttl). The leadership argument above
// is unchanged: the confirmation is still taken after arrival. The receipt's
// time is read under the lessor's lock, so an expiry request and an on-time
// arrival are ordered: Expired requests a lease only when no on-time
// receipt is open, and a receipt taken after that request is late (its time
// is past the deadline Expired saw). A lease or session whose expiry was
// requested is therefore never renewed.
//
// # What a holder sees under overload
//
// Renewals are never refused for load; the server sheds new work (acquires,
// opens, registrations, namespace writes) with RESOURCE_EXHAUSTED and a
// retry hint instead (admin/server, admission.go), as soon as a renewal has
// waited longer than --shed-after-renewal-wait. Renewals have their own
// budget on the leader, the renewal gate (admin/server, renewalgate.go):
// past it they wait with their receipts open, in arrival order while the
// queue is young and, once the leader is behind, most urgent first (the
// lease or session whose expiry is nearest, its newest waiter). Let C be
// the renewals a second the leader can process (bench/adminbench -only
// overload measures it; BENCHMARKS.md has the figures). At the sidecar's
// defaults (ttl 15 s, a keepalive every 5 s) C keepalives a second keep 5C
// sidecars, whatever their mailboxes.
//
// At 2x C the leader still processes C a second and the rest wait at the
// gate. It renews every holder about once per 2/3 ttl (each sends three per
// ttl and half are processed, the most urgent holder's first), so a holder
// keeps a renewal it can count from within every ttl: it keeps serving,
// with answers late by up to its call's deadline and about half its calls
// timing out; no lease or session expires, and new acquires and opens are
// refused with the retry hint until the load falls.
//
// At 10x C, if the excess reaches the gate, the leader can renew each
// holder about once per 3 1/3 ttl: holders stop serving by their own clocks
// between renewals, and since the most urgent go first, about (ttl + grace)
// / ttl x 3/10 of them (40 % at the defaults) are renewed before ttl +
// grace and kept, the others expire. Where the CPU is the limit most of the
// excess waits before the gate instead, in gRPC's per-connection stream
// limit and the sockets, not yet received, and a renewal that never reaches
// the handler is silence. Load that high is for the callers to back off
// from (the sidecar's retry backoff), and sessions exist to keep it from
// arising: one renewal per proxy, not per mailbox.

// Receipt is a renewal's arrival at this node. Take it with
// ReceiveHeartbeat or ReceiveKeepAlive before waiting for anything, pass it
// to Renew or KeepAlive, and Close it when the call is done (answered or
// not): until then it holds off the expiry it arrived in time to prevent.
type Receipt struct {
	l   *Lessor
	key arrivalKey
	at  time.Time
	// due and ttl are the lease's or session's expiry and ttl as the
	// renewal found them on arrival (zero if this lessor has no entry).
	due    time.Time
	ttl    time.Duration
	closed bool // guarded by l.mu
}

// arrivalKey names a lease (mailbox) or a session (id), never both.
type arrivalKey struct {
	mailbox string
	session uint64
}

// At is when the renewal arrived, on the lessor's clock.
func (r *Receipt) At() time.Time { return r.at }

// Key names what the renewal renews (a lease or a session): receipts of
// the same key have equal keys.
func (r *Receipt) Key() any { return r.key }

// Due is when the holder's lease or session expired as of the renewal's
// arrival (expires, before grace: when its holder stops serving unless a
// renewal is answered), zero if unknown. A server ordering waiting
// renewals serves the most urgent first.
func (r *Receipt) Due() time.Time { return r.due }

// TTL is the lease's or session's ttl as of the arrival (see Due).
func (r *Receipt) TTL() time.Duration { return r.ttl }

// ReceiveHeartbeat records a heartbeat for mailboxID arriving now.
func (l *Lessor) ReceiveHeartbeat(mailboxID string) *Receipt {
	return l.receive(arrivalKey{mailbox: mailboxID})
}

// ReceiveKeepAlive records a keepalive for session id arriving now.
func (l *Lessor) ReceiveKeepAlive(id uint64) *Receipt {
	return l.receive(arrivalKey{session: id})
}

func (l *Lessor) receive(k arrivalKey) *Receipt {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &Receipt{l: l, key: k, at: l.cfg.Clock.Now()}
	if c, _ := l.lifetimeOf(k); c != nil {
		r.due, r.ttl = c.expires, c.ttl
	}
	l.arrivals[k] = append(l.arrivals[k], r.at)
	return r
}

// Close ends the receipt's hold on expiry; closing twice is a no-op.
func (r *Receipt) Close() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	ts := l.arrivals[r.key]
	if i := slices.Index(ts, r.at); i >= 0 {
		ts = slices.Delete(ts, i, i+1)
	}
	if len(ts) == 0 {
		delete(l.arrivals, r.key)
	} else {
		l.arrivals[r.key] = ts
	}
	// A hold this receipt set ends: the lifetime is due at its own deadline
	// again, and the next scan looks at the receipts still open.
	if c, q := l.lifetimeOf(r.key); c != nil {
		q.reschedule(c)
	}
}

// lifetimeOf is the lifetime k names and the queue it belongs in; nil if this
// lessor has none.
func (l *Lessor) lifetimeOf(k arrivalKey) (*lifetime, *lifetimeQueue) {
	if k.session != 0 {
		if e, ok := l.sessions[k.session]; ok {
			return &e.lifetime, &l.sessionQueue
		}
		return nil, nil
	}
	if e, ok := l.leases[k.mailbox]; ok {
		return &e.lifetime, &l.queue
	}
	return nil, nil
}

// deadlineWith is deadline as the open receipts for k that arrived before
// before (all of them if before is zero) will leave it once processed: each
// that arrived by the deadline so far moves it to its arrival + ttl +
// grace, in order of arrival, so a chain of renewals each sent in time is
// in time however many of them wait.
func (l *Lessor) deadlineWith(k arrivalKey, deadline, before time.Time, ttlGrace time.Duration) time.Time {
	ts := l.arrivals[k]
	if len(ts) > 1 {
		ts = slices.Clone(ts)
		slices.SortFunc(ts, time.Time.Compare)
	}
	for _, at := range ts {
		if !before.IsZero() && !at.Before(before) {
			break
		}
		if u := at.Add(ttlGrace); !at.After(deadline) && u.After(deadline) {
			deadline = u
		}
	}
	return deadline
}
