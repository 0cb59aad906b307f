package agent

import (
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
	if d := w.a.cfg.RunnerDeadAfter; d > 0 {
		return d
	}
	return min(3*interval, ttl/2)
}

// hold activates the runner under l and heartbeats until the lease is lost
// (the runner is fenced before hold returns), the runner is given up on, or
// the worker is stopped.
func (w *worker) hold(l *adminv1.Lease, sentAt time.Time) holdEnd {
	clk := w.a.cfg.Clock
	epoch := l.GetEpoch()
	ttl := l.GetTtl().AsDuration()
	if ttl <= 0 {
		ttl = w.a.cfg.LeaseTTL
	}
	interval := w.a.cfg.HeartbeatInterval
	if li := l.GetHeartbeatInterval().AsDuration(); li > 0 && li < interval {
		interval = li
	}
	// At least two tries before the fence, whatever was configured.
	interval = min(interval, ttl/3)
	fenceAt := sentAt.Add(ttl)
	log := w.log.With("epoch", epoch)
	w.update(func(v *LeaseView) { v.Epoch, v.TTL, v.LastAckSent, v.FenceAt = epoch, ttl, sentAt, fenceAt })
	deadAfter := w.runnerDeadAfter(interval, ttl)
	log.Info("lease acquired", "ttl", ttl, "heartbeat_interval", interval, "runner_dead_after", deadAfter, "runner_address", l.GetRunnerAddress())

	until := func() time.Time { return fenceAt }
	if !w.activate(epoch, until) {
		return leaseEnded
	}
	// The activation was the runner's last answer.
	sil := newSilence(clk.Now(), w.a.probeTimeout(interval), interval)
	unheld := w.serving()
	defer unheld()
	log.Info("runner serving under the lease")
	var h handoff
	if !w.followRole(&h, epoch, until) {
		return leaseEnded
	}

	bo := w.a.cfg.Backoff
	nextHB := sentAt.Add(w.a.cfg.Jitter(interval))
	var inflight chan hbResult
	for {
		now := clk.Now()
		if !now.Before(fenceAt) {
			unheld()
			w.fence(epoch, "ttl_elapsed", "no heartbeat acknowledged for ttl since the last one was sent", fenceAt.Add(-ttl))
			return leaseEnded
		}
		if inflight == nil && !now.Before(nextHB) {
			inflight = w.heartbeat(epoch, interval, sil, deadAfter)
			continue
		}
		wake := fenceAt
		if inflight == nil && nextHB.Before(wake) {
			wake = nextHB
		}
		t := clk.NewTimer(wake.Sub(now))
		select {
		case <-w.ctx.Done():
			t.Stop()
			return leaseEnded
		case <-t.C():
			continue
		case <-w.roleChanged():
			t.Stop()
			if !w.followRole(&h, epoch, until) {
				return leaseEnded
			}
		case r := <-inflight:
			t.Stop()
			inflight = nil
			sil = r.silence
			if r.giveUp {
				unheld()
				w.giveUp(epoch, sil.down(), deadAfter, r.runnerErr)
				return runnerGone
			}
			if reason, detail, lost := refused(r); lost {
				w.a.m.heartbeats.WithLabelValues("refused").Inc()
				unheld()
				w.fence(epoch, reason, detail, fenceAt.Add(-ttl))
				return leaseEnded
			}
			if r.err != nil || !r.resp.GetRenewed() {
				w.a.m.heartbeats.WithLabelValues("error").Inc()
				retry := bo.Step()
				log.Warn("heartbeat failed; retrying", "err", r.err, "retry_in", retry, "fence_in", fenceAt.Sub(clk.Now()))
				nextHB = clk.Now().Add(retry)
				continue
			}
			w.a.m.heartbeats.WithLabelValues("renewed").Inc()
			w.a.m.hbLatency.Observe(clk.Since(r.sentAt).Seconds())
			bo = w.a.cfg.Backoff
			if d := r.resp.GetTtl().AsDuration(); d > 0 {
				ttl = d
			}
			if at := r.sentAt.Add(ttl); at.After(fenceAt) {
				fenceAt = at
			}
			nextHB = r.sentAt.Add(w.a.cfg.Jitter(interval))
			w.update(func(v *LeaseView) { v.LastAckSent, v.FenceAt, v.TTL = r.sentAt, fenceAt, ttl })
			if r.runnerLost {
				log.Warn("runner no longer serves the mailbox; activating it again")
				if !w.activate(epoch, until) {
					return leaseEnded
				}
				h = handoff{} // ingesting again: drained anew if still handing off
				if !w.followRole(&h, epoch, until) {
					return leaseEnded
				}
				continue
			}
			w.extend(epoch, fenceAt)
			if !w.followRole(&h, epoch, until) {
				return leaseEnded
			}
		}
	}
}

// holdSession is hold for a lease of a session: the runner is activated
// under the lease's own epoch and extended after every acknowledged
// keepalive of the session, and fenced once the session's validity runs
// out or the session is lost. The session's one stats probe of the runner
// per interval serves every worker, for the dead-runner bound and to
// reactivate a runner that forgot the mailbox.
func (w *worker) holdSession(r acqResult) holdEnd {
	clk := w.a.cfg.Clock
	st := r.st
	epoch, ttl := r.lease.GetEpoch(), st.ttl
	interval := min(w.a.cfg.HeartbeatInterval, ttl/3)
	lastAck, fenceAt, renewed, lost := w.a.sess.validity(st)
	log := w.log.With("epoch", epoch, "session_id", st.id)
	w.update(func(v *LeaseView) {
		v.Epoch, v.TTL, v.LastAckSent, v.FenceAt, v.SessionID = epoch, ttl, lastAck, fenceAt, st.id
	})
	deadAfter := w.runnerDeadAfter(interval, ttl)
	log.Info("lease acquired", "ttl", ttl, "probe_interval", interval, "runner_dead_after", deadAfter, "runner_address", r.lease.GetRunnerAddress())

	// The session's validity, read anew each time: an activation or a
	// drain may outlast a keepalive (a runner starting a thousand
	// mailboxes), and the renewals meanwhile count.
	until := func() time.Time {
		_, u, _, _ := w.a.sess.validity(st)
		return u
	}
	_, probed := w.a.sess.lastProbe()
	if !w.activate(epoch, until) {
		return leaseEnded
	}
	// The activation is the runner's latest answer the probes may not
	// have seen; a probe sent before it cannot show the mailbox active.
	activatedAt := clk.Now()
	serving := w.serving()
	w.a.sess.hold(w, st, epoch)
	unheld := func() {
		serving()
		w.a.sess.unhold(w)
	}
	defer unheld()
	log.Info("runner serving under the lease")
	var h handoff
	if !w.followRole(&h, epoch, until) {
		return leaseEnded
	}

	runnerLost := false
	// onRenewed follows an acknowledged keepalive; false if the lease
	// ended on this side.
	onRenewed := func() bool {
		lastAck, fenceAt, renewed, _ = w.a.sess.validity(st)
		w.update(func(v *LeaseView) { v.LastAckSent, v.FenceAt = lastAck, fenceAt })
		if runnerLost {
			log.Warn("runner no longer serves the mailbox; activating it again")
			if !w.activate(epoch, until) {
				return false
			}
			activatedAt, runnerLost = clk.Now(), false
			h = handoff{} // ingesting again: drained anew if still handing off
		}
		// The session's extender extends the runner's deadline.
		return w.followRole(&h, epoch, until)
	}
	for {
		now := clk.Now()
		if !now.Before(fenceAt) {
			select {
			case <-renewed:
				// Renewed while this worker was busy (a slow activation
				// or drain): the fence is the renewal's to decide.
				if !onRenewed() {
					return leaseEnded
				}
				continue
			default:
			}
			unheld()
			w.fence(epoch, "ttl_elapsed", "no session keepalive acknowledged for ttl since the last one was sent", fenceAt.Add(-ttl))
			return leaseEnded
		}
		t := clk.NewTimer(fenceAt.Sub(now))
		select {
		case <-w.ctx.Done():
			t.Stop()
			return leaseEnded
		case <-t.C():
			continue
		case <-w.roleChanged():
			t.Stop()
			if !w.followRole(&h, epoch, until) {
				return leaseEnded
			}
		case <-lost:
			t.Stop()
			unheld()
			reason, detail := w.a.sess.lostWhy(st)
			w.fence(epoch, reason, detail, lastAck)
			return leaseEnded
		case <-renewed:
			t.Stop()
			if !onRenewed() {
				return leaseEnded
			}
		case <-probed:
			t.Stop()
			var p probeResult
			p, probed = w.a.sess.lastProbe()
			if down := p.silence.since(activatedAt); w.a.givingUp(p.err, down, deadAfter) {
				unheld()
				w.giveUp(epoch, down, deadAfter, p.err)
				return runnerGone
			}
			if p.err == nil && !p.sentAt.Before(activatedAt) {
				st, ok := p.mailboxes[w.id]
				runnerLost = !ok || st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || st.GetEpoch() != epoch
			}
		}
	}
}
