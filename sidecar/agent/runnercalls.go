package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// handed records that the runner took a deadline no later than until.
func (w *worker) handed(until time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if until.After(w.runnerUntil) {
		w.runnerUntil = until
	}
}

// unanswered records what an extension of vf may have done that did not
// come back (err), sent while the runner's deadline was at most before: a
// call that timed out may have been taken all the same, by a runner that
// then stopped (SIGSTOP) before answering. The runner takes an extension
// only before its deadline has passed (runner.SetValidFor), so its deadline
// is then at most before + vf. A call the runner answered, refusing it, or
// that never reached it (Unavailable) moved nothing.
func (w *worker) unanswered(before, sentAt time.Time, vf time.Duration, err error) {
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Canceled:
		w.handed(before.Add(vf))
		w.mu.Lock()
		w.unansweredSent = sentAt
		w.mu.Unlock()
	}
}

// mayExtend says whether the runner may be sent an extension: not while an
// earlier one did not come back and the runner has answered nothing since.
// Each such extension could push the bound on its deadline (unanswered)
// further, so a stopped runner's lease would be released ever later.
func (w *worker) mayExtend() bool {
	w.mu.Lock()
	sent := w.unansweredSent
	w.mu.Unlock()
	return sent.IsZero() || !w.rn.heard().Before(sent)
}

func (w *worker) runnerDeadline() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runnerUntil
}

func (w *worker) runnerCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(w.ctx), w.cfg.RPCTimeout)
}

// openInRunner records the mailbox in the runner (not serving); false if
// the worker was stopped first.
func (w *worker) openInRunner() bool {
	bo := w.cfg.Backoff
	for {
		done, ok := w.rn.startSlot(w.ctx)
		if !ok {
			return false
		}
		dialed := w.rn.dialed()
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RPCTimeout)
		_, err := w.rn.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: w.id, Config: runnerConfig(w.assignment.GetConfig()), RecoverFrom: w.recoverFrom(), HistoryBefore: w.historyBefore()})
		cancel()
		done()
		if err == nil {
			w.update(func(v *LeaseView) { v.State, v.OpenFailures, v.OpenError = StateAcquiring, 0, "" })
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		if status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "different config") {
			// A record left by an earlier assignment: replace it.
			w.log.Warn("runner holds the mailbox with another config; closing it first", "err", err)
			cctx, cancel := w.runnerCtx()
			_, err = w.rn.CloseMailbox(cctx, &runnerv1.CloseMailboxRequest{MailboxId: w.id})
			cancel()
			if err == nil {
				continue
			}
		}
		if storeOpenFailed(err) {
			w.update(func(v *LeaseView) {
				v.OpenFailures++
				v.OpenError = truncate(status.Convert(err).Message(), maxOpenErrorLen)
			})
		}
		w.log.Warn("runner could not open the mailbox; retrying", "err", err, "consecutive_store_failures", w.view().OpenFailures)
		w.sess.retrying(w.id)
		if !w.rn.await(w.ctx, bo.Step(), dialed) {
			return false
		}
	}
}

// giveUp ends a lease whose runner is given up on (givingUp): no more
// renewals, so it cannot hold the mailbox for a runner that is gone. The
// lease is released once the runner cannot serve under it: at once if it
// confirms the fence or is gone (a runner that starts again serves nothing
// until activated under a lease), else when the deadline it was last
// handed (runnerDeadline) has passed, since a paused runner that resumes
// fences itself by that deadline. A stop meanwhile leaves the release to
// Shutdown or unassign. Either way the loss is counted (runner_gone or
// runner_unreachable) and released with that cause.
func (w *worker) giveUp(epoch uint64, down, deadAfter time.Duration, cause error) {
	clk := w.cfg.Clock
	log := w.log.With("epoch", epoch)
	reason := "runner_unreachable"
	w.mu.Lock()
	w.v.State, w.reopen = StateFenced, true
	w.mu.Unlock()
	if w.rn.gone(cause) {
		reason = "runner_gone"
		log.Warn("runner gone (its control API refuses connections); renewing no more, releasing the lease at once",
			"down_for", down, "err", cause)
	} else {
		log.Warn("runner unreachable past the bound; renewing no more, releasing the lease once the runner is fenced",
			"down_for", down, "runner_dead_after", deadAfter, "err", cause)
	}
	w.m.losses.WithLabelValues(reason).Inc()
	// A confirmation after the runner's deadline would come too late to
	// matter: the release waits no longer than that deadline (at least a
	// probe's timeout, for a runner that is only slow).
	timeout := min(w.cfg.RPCTimeout, max(w.runnerDeadline().Sub(clk.Now()), w.rn.probeTimeout(w.cfg.HeartbeatInterval)))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), timeout)
	_, err := w.rn.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: w.id, Reason: reason})
	cancel()
	switch wait := w.runnerDeadline().Sub(clk.Now()); {
	case err == nil || status.Code(err) == codes.NotFound:
		log.Info("runner fenced", "reason", reason)
	case w.rn.gone(err):
		log.Info("runner gone: it serves nothing, so the lease goes without waiting for its deadline", "deadline_in", wait)
	case wait > 0:
		log.Warn("runner did not confirm the fence; releasing once its own deadline has passed", "wait", wait, "err", err)
		// Counted from now, not from before the log: the release is
		// never later than the deadline.
		if !sleep(w.ctx, clk, w.runnerDeadline().Sub(clk.Now())) {
			return
		}
	}
	ctx, cancel = context.WithTimeout(w.ctx, w.cfg.RPCTimeout)
	defer cancel()
	// release logs and counts every outcome; a lease it could not give
	// back expires on the admin, since nothing renews it any more.
	_ = w.release(ctx, reason, epoch)
	w.update(func(v *LeaseView) { v.Epoch, v.SessionID = 0, 0 })
}

// probe asks the runner for the mailbox's stats: the heartbeat's stats, the
// runner's status of the mailbox by id (empty when the runner does not
// have it, nil when its answer tells nothing of it), and why its control
// API did not answer (nil if it did, NotFound included).
func (w *worker) probe(ctx context.Context, epoch uint64, interval time.Duration) (stats *adminv1.LeaseStats, mailboxes map[string]*runnerv1.MailboxStatus, runnerErr error) {
	stats = &adminv1.LeaseStats{Health: adminv1.RunnerHealth_RUNNER_HEALTH_HEALTHY}
	rctx, rcancel := context.WithTimeout(ctx, w.rn.probeTimeout(interval))
	sr, err := w.rn.GetStats(rctx, &runnerv1.GetStatsRequest{MailboxId: w.id})
	rcancel()
	switch {
	case err == nil && len(sr.GetMailboxes()) == 1:
		st := sr.GetMailboxes()[0]
		stats.EventsStored, stats.QueriesServed, stats.StorageBytes = st.GetEventsStored(), st.GetQueriesServed(), st.GetStorageBytes()
		mailboxes = map[string]*runnerv1.MailboxStatus{w.id: st}
		if st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || st.GetEpoch() != epoch || !st.GetConsuming() {
			stats.Health = adminv1.RunnerHealth_RUNNER_HEALTH_DEGRADED
		}
	case status.Code(err) == codes.NotFound:
		mailboxes = map[string]*runnerv1.MailboxStatus{}
		stats.Health = adminv1.RunnerHealth_RUNNER_HEALTH_DEGRADED
	default:
		stats.Health = adminv1.RunnerHealth_RUNNER_HEALTH_DEGRADED
	}
	if err != nil && status.Code(err) != codes.NotFound {
		runnerErr = err
	}
	return stats, mailboxes, runnerErr
}

// serving counts the mailbox as held from now (and how long it took from its
// assignment) until the returned func is called; it drops the count once
// however often it is called, so every way out of holding can call it (a
// fence drops it before the runner is told, the deferred call on return).
func (w *worker) serving() (unheld func()) {
	w.m.acqLatency.Observe(w.cfg.Clock.Since(w.assigned).Seconds())
	w.m.held.Inc()
	w.update(func(v *LeaseView) { v.State = StateActive })
	var once sync.Once
	return func() { once.Do(w.m.held.Dec) }
}

// activate lets the runner consume and serve under epoch until the lease's
// deadline, until(), read anew at each try, retrying until then, and
// records a bound on the deadline the runner took; false if the worker was
// stopped or the deadline came first (then the lease lapsed on this side
// and acquire starts over), or the runner is gone (then the lease is given
// back, giveUp, and the mailbox opened again first).
func (w *worker) activate(epoch uint64, until func() time.Time) bool {
	bo := w.cfg.Backoff
	for {
		now, fenceAt := w.cfg.Clock.Now(), until()
		if !now.Before(fenceAt) {
			w.fence(epoch, "ttl_elapsed", "the runner could not be activated before ttl ran out", fenceAt)
			return false
		}
		done, ok := w.rn.startSlot(w.ctx)
		if !ok {
			return false
		}
		bound := w.rn.bound()
		if now, fenceAt = w.cfg.Clock.Now(), until(); !now.Before(fenceAt) {
			done()
			continue
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RPCTimeout)
		vf := durationpb.New(fenceAt.Sub(now))
		b := bound(vf.AsDuration())
		_, err := w.rn.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: w.id, Epoch: epoch, ValidFor: vf, Bound: b})
		if status.Code(err) == codes.NotFound {
			// The runner restarted and forgot the mailbox: open and
			// activate in one call.
			_, err = w.rn.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: w.id, Config: runnerConfig(w.assignment.GetConfig()), Epoch: epoch, ValidFor: vf, Bound: b, RecoverFrom: w.recoverFrom(), HistoryBefore: w.historyBefore()})
		}
		cancel()
		done()
		if err == nil {
			// The runner counts valid_for from when it got the call,
			// before it answered.
			w.handed(w.cfg.Clock.Now().Add(vf.AsDuration()))
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		if w.rn.gone(err) {
			// Nothing to activate: the lease goes, and the mailbox is
			// opened again once the runner listens.
			w.giveUp(epoch, 0, 0, err)
			return false
		}
		w.log.Warn("runner activation failed; retrying", "epoch", epoch, "err", err)
		if !sleep(w.ctx, w.cfg.Clock, min(bo.Step(), fenceAt.Sub(now))) {
			return false
		}
	}
}

// extend hands the runner the new time left after an acknowledged heartbeat
// and records a bound on its new deadline, as activate does. A failure is
// only logged: the runner fences itself at the old deadline, and the next
// heartbeat's stats reveal it.
func (w *worker) extend(epoch uint64, fenceAt time.Time) {
	bound := w.rn.bound()
	sentAt := w.cfg.Clock.Now()
	vf := fenceAt.Sub(sentAt)
	if vf <= 0 || !w.mayExtend() {
		return
	}
	// An answer after vf confirms a deadline that has passed.
	ctx, cancel := context.WithTimeout(w.ctx, min(w.cfg.RPCTimeout, vf))
	defer cancel()
	before := w.runnerDeadline()
	if _, err := w.rn.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: w.id, Epoch: epoch, ValidFor: durationpb.New(vf), Bound: bound(vf)}); err != nil {
		w.unanswered(before, sentAt, vf, err)
		w.log.Warn("runner did not take the extension", "epoch", epoch, "err", err)
		return
	}
	w.handed(w.cfg.Clock.Now().Add(vf))
}

// fence stops the runner on the mailbox at once and records the loss; it
// retries until the runner confirms, is gone (it serves nothing), or the
// worker is stopped (a stopped worker's runner is drained or closed next
// anyway).
func (w *worker) fence(epoch uint64, reason, detail string, lastAckSent time.Time) {
	w.m.losses.WithLabelValues(reason).Inc()
	w.update(func(v *LeaseView) { v.State = StateFenced })
	w.log.Warn("lease lost; fencing the runner", "epoch", epoch, "reason", reason, "detail", detail, "last_ack_sent", lastAckSent)
	bo := w.cfg.Backoff
	for {
		ctx, cancel := w.runnerCtx()
		_, err := w.rn.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: w.id, Reason: reason})
		cancel()
		if err == nil || status.Code(err) == codes.NotFound {
			w.log.Info("runner fenced", "epoch", epoch, "reason", reason)
			return
		}
		if w.rn.gone(err) {
			w.log.Info("runner gone (its control API refuses connections): it serves nothing", "epoch", epoch, "reason", reason)
			return
		}
		w.log.Error("runner did not confirm the fence; retrying", "epoch", epoch, "err", err)
		if !sleep(w.ctx, w.cfg.Clock, bo.Step()) {
			return
		}
	}
}

// unassign drains the mailbox in the runner (stop fetching, flush, commit),
// has the runner stop serving it, and only then releases the lease: the
// offsets are committed before the lease goes, queries in flight are
// answered, and the runner never serves a mailbox whose lease it no longer
// holds (routes are per proxy, so nothing else stops queries reaching it).
// A runner that does not confirm is waited out: the lease goes once the
// deadline it was handed has passed. It returns false if the stop came
// first: the lease was left to expire, the runner perhaps still serving.
func (w *worker) unassign() bool {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.StopTimeout)
	defer cancel()
	if _, err := w.rn.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{w.id}}); err != nil {
		w.log.Warn("runner drain failed", "err", err)
	}
	closed := w.closeInRunner(ctx, "unassigned")
	v := w.view()
	if v.Epoch == 0 {
		return true
	}
	if !closed && !w.outwait(w.halt, "unassigned", v.Epoch) {
		return false
	}
	rctx, rcancel := context.WithTimeout(context.Background(), w.cfg.RPCTimeout)
	defer rcancel()
	// release logs and counts every outcome; an unassignment has no
	// caller to hand its error to.
	_ = w.release(rctx, "unassigned", v.Epoch)
	return true
}

// closeInRunner has the runner stop serving the mailbox and forget it
// (queries in flight are answered first); true once the runner confirmed
// it no longer serves it, or is gone (runnerconn.go: a runner that exited
// serves nothing, and one started again nothing it was not activated for).
// A failed close is followed by a fence, which a runner that closed with
// errors answers NotFound.
func (w *worker) closeInRunner(ctx context.Context, cause string) bool {
	_, err := w.rn.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: w.id})
	if err == nil {
		return true
	}
	w.log.Warn("runner close failed; fencing the mailbox instead", "err", err)
	_, err = w.rn.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: w.id, Reason: cause})
	if err == nil || status.Code(err) == codes.NotFound {
		w.log.Info("runner fenced", "reason", cause)
		return true
	}
	if w.rn.gone(err) {
		w.log.Info("runner gone (its control API refuses connections): it serves nothing", "cause", cause)
		return true
	}
	w.log.Warn("runner did not confirm it stopped serving the mailbox", "err", err)
	return false
}

// outwait waits until the deadline the runner was last handed has passed,
// for a runner that did not confirm it stopped serving: by then it fences
// itself, so the lease may go. False if ctx ended first; the lease is then
// not released and expires on the admin (after ttl + grace, past that
// deadline) once nothing renews it.
func (w *worker) outwait(ctx context.Context, cause string, epoch uint64) bool {
	clk := w.cfg.Clock
	wait := w.runnerDeadline().Sub(clk.Now())
	if wait <= 0 {
		return true
	}
	log := w.log.With("epoch", epoch, "cause", cause)
	log.Warn("releasing the lease once the deadline the runner was handed has passed", "wait", wait)
	if sleep(ctx, clk, wait) {
		return true
	}
	w.m.releases.WithLabelValues(cause, "expiring").Inc()
	log.Error("lease not released: the runner may serve under it until its deadline; it expires after ttl + grace", "runner_deadline", w.runnerDeadline())
	return false
}
