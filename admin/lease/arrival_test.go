package lease

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// primaryWith is a primary lessor holding a@p for r1 (epoch 7), granted at t0.
func primaryWith(t *testing.T) (*Lessor, interface{ Step(time.Duration) }) {
	t.Helper()
	l, clk := newLessor(t)
	l.Promote()
	l.LeaseGranted(lease("a@p", "r1", 7, t0))
	return l, clk
}

func expiredIDs(l *Lessor) []string {
	var out []string
	for _, r := range l.Expired() {
		out = append(out, r.GetMailboxId())
	}
	return out
}

// A heartbeat counts from its arrival: one that arrived before expires +
// grace and is processed long after still renews, from the arrival, and
// until it is processed the lease is not requested for expiry. One that
// arrived late is refused however soon it is processed, and a receipt
// closed unprocessed stops holding the lease off.
func TestRenewalCountsFromArrival(t *testing.T) {
	t.Parallel()
	// Granted at t0 on the primary: its deadline is t0 + due.
	due := ttl + grace
	for _, tc := range []struct {
		name    string
		arrive  time.Duration // after t0
		process time.Duration // after the arrival; <0: closed unprocessed
		renewed bool
		expired time.Duration // after t0, when Expired first names it
	}{
		{"on time, processed at once", due - time.Second, 0, true, due - time.Second + ttl + grace},
		{"on time, processed past the deadline", due - time.Second, 3 * time.Second, true, due - time.Second + ttl + grace},
		{"on time, processed past what it would give", due, ttl + grace + time.Second, false, due + ttl + grace},
		{"late, processed at once", due + time.Millisecond, 0, false, due + time.Millisecond},
		{"on time, never processed", due - time.Second, -1, false, due},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, clk := primaryWith(t)
			elapsed := time.Duration(0)
			step := func(d time.Duration) {
				clk.Step(d)
				elapsed += d
			}
			step(tc.arrive)
			rc := l.ReceiveHeartbeat("a@p")
			expiredAt := time.Duration(-1)
			scanUntil := func(until time.Duration) {
				for elapsed < until {
					step(10 * time.Millisecond)
					if ids := expiredIDs(l); len(ids) > 0 && expiredAt < 0 {
						expiredAt = elapsed
					}
				}
			}
			if tc.process >= 0 {
				scanUntil(tc.arrive + tc.process)
				res := l.Renew(rc, hb("a@p", "r1", 7))
				if res.GetRenewed() != tc.renewed {
					t.Fatalf("renewed = %v (%v), want %v", res.GetRenewed(), res.GetRefusal(), tc.renewed)
				}
				if tc.renewed && !res.GetExpiresAt().AsTime().Equal(t0.Add(tc.arrive+ttl)) {
					t.Fatalf("expires at %s, want arrival + ttl %s", res.GetExpiresAt().AsTime(), t0.Add(tc.arrive+ttl))
				}
			}
			rc.Close()
			rc.Close()
			scanUntil(tc.expired + time.Second)
			// Scans run every 10ms: the first that names the lease is the
			// first step past its deadline.
			if expiredAt <= tc.expired-10*time.Millisecond || expiredAt > tc.expired+10*time.Millisecond {
				t.Fatalf("first requested for expiry at t0+%s, want just after t0+%s", expiredAt, tc.expired)
			}
		})
	}
}

// Keepalives follow the same rule: one that arrived in time and waits past
// the session's deadline keeps it (and its leases) from expiring, then
// renews it from its arrival.
func TestKeepAliveCountsFromArrival(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.register("r1")
	n.l.Promote()
	sid := n.openWith()
	d := sessionTTL + 5*time.Second // ttl + the default grace
	n.clk.Step(d - time.Second)
	rc := n.l.ReceiveKeepAlive(sid)
	arrived := n.clk.Now()
	n.clk.Step(5 * time.Second)
	if ids := n.l.ExpiredSessions(); len(ids) != 0 {
		t.Fatalf("session with an on-time keepalive waiting requested for expiry: %v", ids)
	}
	res, err := n.l.KeepAlive(rc, keepAlive(sid))
	rc.Close()
	if err != nil || !res.GetRenewed() || !res.GetExpiresAt().AsTime().Equal(arrived.Add(sessionTTL)) {
		t.Fatalf("delayed keepalive: %v, %v; want renewed until %s", res, err, arrived.Add(sessionTTL))
	}
	if ids := n.l.ExpiredSessions(); len(ids) != 0 {
		t.Fatalf("renewed session requested for expiry: %v", ids)
	}
}

// Property: under any schedule of processing delays, out of order, longer
// than the ttl, a lease whose holder keeps sending a heartbeat every ttl/3
// is never requested for expiry, and every acknowledgement leaves the
// lessor's deadline after the holder's own validity (send + ttl). Once the
// holder falls silent the lease is requested within ttl + grace of its
// last heartbeat's arrival (plus the longest wait, if that one is processed
// last and so had held it off).
func TestNoOnTimeRenewalExpiresUnderDelays(t *testing.T) {
	t.Parallel()
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 20))
		l, clk := primaryWith(t)
		type pending struct {
			rc  *Receipt
			due time.Duration // processed at, after t0
		}
		maxDelay := time.Duration(rng.Int64N(int64(3 * ttl)))
		var (
			queue []pending
			last  time.Duration // the last heartbeat's arrival
		)
		const tick = 50 * time.Millisecond
		interval := 3 * time.Second // about ttl/3, a multiple of tick
		sendUntil := 30 * ttl
		expired := false
		for now := time.Duration(0); !expired && now < sendUntil+maxDelay+ttl+grace+time.Second; now += tick {
			if now < sendUntil && now%interval == 0 {
				queue = append(queue, pending{l.ReceiveHeartbeat("a@p"), now + time.Duration(rng.Int64N(int64(maxDelay)+1))})
				last = now
			}
			slices.SortStableFunc(queue, func(a, b pending) int { return int(a.due - b.due) })
			for len(queue) > 0 && queue[0].due <= now {
				p := queue[0]
				queue = queue[1:]
				res := l.Renew(p.rc, hb("a@p", "r1", 7))
				if !res.GetRenewed() {
					t.Fatalf("seed %d: heartbeat sent at t0+%s refused at t0+%s: %v", seed, p.rc.At().Sub(t0), now, res.GetRefusal())
				}
				if dl := res.GetExpiresAt().AsTime().Add(grace); !dl.After(p.rc.At().Add(ttl)) {
					t.Fatalf("seed %d: lessor's deadline %s not after the holder's validity %s", seed, dl, p.rc.At().Add(ttl))
				}
				p.rc.Close()
			}
			if ids := expiredIDs(l); len(ids) > 0 {
				expired = true
				if lo, hi := last+ttl+grace, last+ttl+grace+maxDelay+tick; now <= lo || now > hi {
					t.Fatalf("seed %d (max delay %s): lease requested for expiry at t0+%s, last heartbeat at t0+%s: want in (%s, %s]", seed, maxDelay, now, last, lo, hi)
				}
				continue
			}
			clk.Step(tick)
		}
		if !expired {
			t.Fatalf("seed %d: silent holder's lease never requested for expiry", seed)
		}
	}
}

// A receipt carries the holder's expiry and ttl as of its arrival, which
// the server orders waiting renewals by; one for a lease this lessor does
// not know carries none.
func TestReceiptDue(t *testing.T) {
	t.Parallel()
	l, _ := primaryWith(t)
	rc := l.ReceiveHeartbeat("a@p")
	defer rc.Close()
	if want := t0.Add(ttl); !rc.Due().Equal(want) || rc.TTL() != ttl {
		t.Fatalf("due %s, ttl %s; want %s, %s", rc.Due(), rc.TTL(), want, ttl)
	}
	other := l.ReceiveHeartbeat("b@p")
	defer other.Close()
	if !other.Due().IsZero() || other.TTL() != 0 || other.Key() == rc.Key() {
		t.Fatalf("unknown lease: due %s, ttl %s, key %v (a@p's %v)", other.Due(), other.TTL(), other.Key(), rc.Key())
	}
}
