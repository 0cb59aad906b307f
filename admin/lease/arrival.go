package lease

import (
	"container/heap"
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
// retry hint instead (admin/server, admission). Let C be the renewals per
// second the leader can process.
//
// At 2x C the leader still processes C a second and the rest wait in its
// handlers (a receipt is taken on entry, so each waits as an open receipt).
// Answers come back late, by up to the caller's deadline; a renewal whose
// caller gave up is still counted from its arrival when it is processed.
// New acquires and opens are refused with the retry hint. The admin expires
// no lease or session that received a renewal in time. A holder (heartbeat
// every ttl/3) keeps serving while one renewal per ttl is acknowledged
// within ttl of its sending; one whose acknowledgements all come later stops
// serving by its own clock and resumes on the next timely answer, its
// lease still held at the admin, so nothing moves.
//
// At 10x C the same holds for every renewal that reaches a handler, but
// most of the excess waits before it: in gRPC's per-connection stream limit
// and the sockets, where it is not yet received, and callers give up on
// much of it there. A renewal that never reaches the handler is silence. So
// holders mostly stop serving by their own clocks, and a lease whose holder
// got no renewal into the process for ttl + grace expires; the rest are
// kept. Load that high is for the callers to back off from (the sidecar's
// retry backoff), and sessions exist to keep it from arising: one renewal
// per proxy, not per mailbox.

// Receipt is a renewal's arrival at this node. Take it with
// ReceiveHeartbeat or ReceiveKeepAlive before waiting for anything, pass it
// to Renew or KeepAlive, and Close it when the call is done (answered or
// not): until then it holds off the expiry it arrived in time to prevent.
type Receipt struct {
	l      *Lessor
	key    arrivalKey
	at     time.Time
	closed bool // guarded by l.mu
}

// arrivalKey names a lease (mailbox) or a session (id), never both.
type arrivalKey struct {
	mailbox string
	session uint64
}

// At is when the renewal arrived, on the lessor's clock.
func (r *Receipt) At() time.Time { return r.at }

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
	// A hold this receipt set ends: the entry is due at its own deadline
	// again, and the next scan looks at the receipts still open.
	if r.key.session != 0 {
		if e, ok := l.sessions[r.key.session]; ok && e.idx >= 0 && e.requested.IsZero() {
			e.next = e.deadline()
			heap.Fix(&l.sessionQueue, e.idx)
		}
		return
	}
	if e, ok := l.leases[r.key.mailbox]; ok && e.idx >= 0 && e.requested.IsZero() {
		e.next = e.deadline()
		heap.Fix(&l.queue, e.idx)
	}
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
