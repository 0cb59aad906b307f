package agent

import (
	"log/slog"
	"sync"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// holdEnd is why hold returned.
type holdEnd int

const (
	// leaseEnded: lost (runner fenced) or the worker stopped; acquire again.
	leaseEnded holdEnd = iota
	// runnerGone: the runner stopped answering for longer than the
	// dead-runner bound, or is gone, and the lease was given back; open it
	// again first.
	runnerGone
)

// runnerDeadAfter is how long the runner may fail its probes before the
// lease is given up: Config.RunnerDeadAfter, or three heartbeat intervals
// but at most half the ttl.
func (w *worker) runnerDeadAfter(interval, ttl time.Duration) time.Duration {
	if d := w.cfg.RunnerDeadAfter; d > 0 {
		return d
	}
	return min(3*interval, ttl/2)
}

// holding is one hold of a granted lease: what the hold loop knows of it
// between its steps.
type holding struct {
	w         *worker
	v         validity
	g         *renewable
	epoch     uint64
	deadAfter time.Duration
	log       *slog.Logger
	// win is the lease's validity as last read: the runner is fenced at
	// win.until.
	win    window
	probed <-chan struct{}
	// activatedAt is when the runner last answered an activation: a probe
	// sent before it cannot show the mailbox active, and the runner's
	// silence counts from it at the earliest.
	activatedAt time.Time
	// runnerLost: a probe since the activation found the runner not
	// serving the mailbox under epoch; it is activated again at the next
	// renewal.
	runnerLost bool
	h          handoff
	unserve    func()
}

// hold activates the runner under l, valid as v says, and holds the lease
// until it is lost (the runner is fenced before hold returns), the runner
// is given up on (givingUp), or the worker is stopped. It is the one hold
// loop of both lease modes: v alone tells a lease held on its own from one
// of a session.
func (w *worker) hold(l *adminv1.Lease, v validity) holdEnd {
	g := v.renewable()
	hs := &holding{w: w, v: v, g: g, epoch: l.GetEpoch(), win: g.window()}
	hs.deadAfter = w.runnerDeadAfter(g.every, hs.win.ttl)
	hs.log = w.log.With("epoch", hs.epoch)
	if g.id != 0 {
		hs.log = hs.log.With("session_id", g.id)
	}
	w.update(func(lv *LeaseView) {
		lv.Epoch, lv.TTL, lv.LastAckSent, lv.FenceAt, lv.SessionID = hs.epoch, hs.win.ttl, hs.win.lastAckSent, hs.win.until, g.id
	})
	hs.log.Info("lease acquired", "ttl", hs.win.ttl, "renew_interval", g.every, "runner_dead_after", hs.deadAfter, "runner_address", l.GetRunnerAddress())

	_, hs.probed = v.probes().latest()
	if !w.activate(hs.epoch, hs.until) {
		return leaseEnded
	}
	hs.activatedAt = w.cfg.Clock.Now()
	served, unserve := w.serving(), v.serve()
	hs.unserve = sync.OnceFunc(func() {
		served()
		unserve()
	})
	defer hs.unserve()
	hs.log.Info("runner serving under the lease")
	if !w.followRole(&hs.h, hs.epoch, hs.until) {
		return leaseEnded
	}
	return hs.loop()
}

// until is the lease's deadline, read anew at each call: an activation or
// a drain may outlast a renewal (a runner starting a thousand mailboxes),
// and the renewals meanwhile count.
func (hs *holding) until() time.Time { return hs.g.window().until }

// loop waits for what happens to the lease next, on one timer of the
// worker's clock that is the fence's, independent of any call in flight
// (docs/architecture.md#client-side-stop), and starts each renewal that
// is the loop's to start.
func (hs *holding) loop() holdEnd {
	w, clk := hs.w, hs.w.cfg.Clock
	for {
		now := clk.Now()
		if !now.Before(hs.win.until) {
			select {
			case <-hs.win.renewed:
				// Renewed while this worker was busy (a slow activation
				// or drain): the fence is the renewal's to decide.
				if end, over := hs.renewed(); over {
					return end
				}
				continue
			default:
			}
			hs.unserve()
			w.fence(hs.epoch, "ttl_elapsed", "no "+hs.g.what()+" acknowledged for ttl since the last one was sent", hs.win.lastAckSent)
			return leaseEnded
		}
		wake := hs.win.until
		next, changed := hs.v.renewDue(now)
		if !next.IsZero() && next.Before(wake) {
			wake = next
		}
		t := clk.NewTimer(wake.Sub(now))
		select {
		case <-w.ctx.Done():
			t.Stop()
			return leaseEnded
		case <-t.C():
			continue
		case <-changed:
			t.Stop()
		case <-w.roleChanged():
			t.Stop()
			if !w.followRole(&hs.h, hs.epoch, hs.until) {
				return leaseEnded
			}
		case <-hs.win.lost:
			t.Stop()
			hs.unserve()
			reason, detail := hs.g.lostWhy()
			w.fence(hs.epoch, reason, detail, hs.win.lastAckSent)
			return leaseEnded
		case <-hs.win.renewed:
			t.Stop()
			if end, over := hs.renewed(); over {
				return end
			}
		case <-hs.probed:
			t.Stop()
			if end, over := hs.judge(); over {
				return end
			}
		}
	}
}

// renewed follows a renewal: the view takes the new deadline, and the
// runner is activated again if a probe found it not serving, else handed
// the new time left (validity.renewed). A probe that came in with the
// renewal is judged first, so that the runner it shows is the one the
// renewal acts on. over is true when the hold ended, with end.
func (hs *holding) renewed() (end holdEnd, over bool) {
	select {
	case <-hs.probed:
		if end, over := hs.judge(); over {
			return end, true
		}
	default:
	}
	w := hs.w
	hs.win = hs.g.window()
	w.update(func(lv *LeaseView) { lv.LastAckSent, lv.FenceAt, lv.TTL = hs.win.lastAckSent, hs.win.until, hs.win.ttl })
	if hs.runnerLost {
		hs.log.Warn("runner no longer serves the mailbox; activating it again")
		if !w.activate(hs.epoch, hs.until) {
			return leaseEnded, true
		}
		hs.activatedAt, hs.runnerLost = w.cfg.Clock.Now(), false
		hs.h = handoff{} // ingesting again: drained anew if still handing off
	} else {
		hs.v.renewed(hs.win.until)
	}
	if !w.followRole(&hs.h, hs.epoch, hs.until) {
		return leaseEnded, true
	}
	return 0, false
}

// judge takes the latest probe of the runner: a runner given up on
// (givingUp, or the probe's lease renews no more) has the lease given back
// (giveUp); one that answered since the activation without serving the
// mailbox under epoch is activated again at the next renewal.
func (hs *holding) judge() (end holdEnd, over bool) {
	var p probeResult
	p, hs.probed = hs.v.probes().latest()
	if down := p.silence.since(hs.activatedAt); p.final || hs.w.rn.givingUp(p.err, down, hs.deadAfter) {
		hs.unserve()
		hs.w.giveUp(hs.epoch, down, hs.deadAfter, p.err)
		return runnerGone, true
	}
	if p.err == nil && p.mailboxes != nil && !p.sentAt.Before(hs.activatedAt) {
		st, ok := p.mailboxes[hs.w.id]
		hs.runnerLost = !ok || st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || st.GetEpoch() != hs.epoch
	}
	return 0, false
}
