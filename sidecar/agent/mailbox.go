package agent

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// State is where a mailbox's lease is, as the sidecar sees it.
type State string

const (
	// StateOpening: asking the runner to record the mailbox.
	StateOpening State = "opening"
	// StateAcquiring: the runner has the mailbox (not serving); no lease.
	StateAcquiring State = "acquiring"
	// StateActive: lease held, runner consuming and serving under Epoch.
	StateActive State = "active"
	// StateFenced: the lease may be lost; the runner was stopped and the
	// sidecar is acquiring again.
	StateFenced State = "fenced"
)

// LeaseView is one mailbox's lease as the sidecar holds it.
type LeaseView struct {
	MailboxID string
	Namespace string
	State     State
	// Epoch of the current (or, once fenced, the last) grant.
	Epoch uint64
	// LastAckSent is when the last acknowledged heartbeat (or the acquire)
	// was sent; FenceAt = LastAckSent + ttl.
	LastAckSent, FenceAt time.Time
	TTL                  time.Duration
	// SessionID is the session the lease belongs to; 0 for a lease held
	// on its own (LeaseModeMailbox).
	SessionID uint64
	// Role is what the assignment asks of the proxy (issue 15): serving,
	// catching up as a move's destination, or handing off as its source.
	// Every role holds the lease and serves the mailbox alike; only the
	// drain (drain.go) tells them apart.
	Role adminv1.AssignmentRole
	// OpenFailures counts the runner's consecutive refusals to open the
	// mailbox (its store would not open: damaged, out of space), OpenError
	// the last one; both are cleared by an open that succeeds. From
	// OpenFailuresReported on, the proxy heartbeat reports the namespace
	// open_failed, and the admin places it elsewhere for a while.
	OpenFailures int
	OpenError    string
}

// OpenFailuresReported is how many consecutive open failures of a mailbox
// the sidecar waits for before it reports the namespace open_failed: one
// may be a passing error, a few in a row under backoff are the store's.
const OpenFailuresReported = 3

// maxOpenErrorLen is the admin's bound on a reported open failure.
const maxOpenErrorLen = 1024

// storeOpenFailed reports whether err is the runner's answer that the
// mailbox's store failed to open (mailbox/control answers Internal), as
// opposed to the runner being unreachable or busy, which the runner probe
// judges.
func storeOpenFailed(err error) bool {
	return status.Code(err) == codes.Internal
}

// truncate cuts s to at most n bytes, still valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

type stopMode int

const (
	// The zero stopMode is running.
	_ stopMode = iota
	// stopUnassign: the runner drains and closes the mailbox, then the
	// lease goes.
	stopUnassign
	// stopShutdown: halt only; Agent.Shutdown drains and releases.
	stopShutdown
)

// worker owns one mailbox's lease; see the package doc.
type worker struct {
	a          *Agent
	id         string
	assignment *adminv1.NamespaceAssignment
	log        *slog.Logger
	ctx        context.Context
	cancel     context.CancelFunc
	done       chan struct{}
	assigned   time.Time
	prev       *worker // the previous worker of this mailbox, if still closing

	mu   sync.Mutex
	mode stopMode
	v    LeaseView
	// runnerUntil bounds the latest deadline (valid_for) the runner
	// confirmed taking, counted from its answer, or may have taken from an
	// extension that did not come back (unanswered); zero if none.
	runnerUntil time.Time
	// unansweredSent is when the last extension that did not come back
	// was sent; none is sent again until the runner has answered a call
	// since (mayExtend).
	unansweredSent time.Time
	// roleCh has a token when the role changed since the hold loop last
	// looked (followRole).
	roleCh chan struct{}
	// reopen is set when the runner was given up on (giveUp): the mailbox
	// is opened in it again before the next acquire.
	reopen bool
}

func newWorker(a *Agent, id string, as *adminv1.NamespaceAssignment) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	return &worker{
		a: a, id: id, assignment: as, ctx: ctx, cancel: cancel, done: make(chan struct{}), roleCh: make(chan struct{}, 1),
		log:      a.log.With("mailbox_id", id),
		assigned: a.cfg.Clock.Now(),
		v:        LeaseView{MailboxID: id, Namespace: as.GetNamespace(), State: StateOpening, Role: as.GetRole()},
	}
}

func (w *worker) view() LeaseView {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v
}

func (w *worker) update(f func(*LeaseView)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.v)
}

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
	return sent.IsZero() || !w.a.heard().Before(sent)
}

func (w *worker) runnerDeadline() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runnerUntil
}

func (w *worker) stop(m stopMode) {
	w.mu.Lock()
	w.mode = m
	w.mu.Unlock()
	w.cancel()
}

func (w *worker) stopMode() stopMode {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode
}

// run is the worker's whole life: open in the runner, then acquire and hold
// until stopped, re-acquiring after every loss.
func (w *worker) run() {
	defer close(w.done)
	defer w.a.sess.unexpect(w.id)
	if w.prev != nil {
		select {
		case <-w.prev.done:
		case <-w.ctx.Done():
		}
	}
	// A runner given up on (runnerGone) is opened again before the next
	// acquire: the lease is only asked for once the runner answers.
	for w.ctx.Err() == nil && w.openInRunner() {
		mode, ok := w.a.sess.leaseMode(w.ctx)
		for ok && w.ctx.Err() == nil {
			end := leaseEnded
			if mode == LeaseModeSession {
				var r acqResult
				if r, ok = w.acquireSession(); ok {
					end = w.holdSession(r)
				}
			} else {
				var l *adminv1.Lease
				var sentAt time.Time
				if l, sentAt, ok = w.acquire(); ok {
					end = w.hold(l, sentAt)
				}
			}
			// giveUp marks every way it was reached, a failed
			// activation's too; reading it also clears it.
			if gaveUp := w.reopening(); gaveUp || end == runnerGone {
				break
			}
		}
	}
	if w.stopMode() == stopUnassign && w.unassign() {
		w.a.closed(w)
	}
}

// reopening reports, once, that giveUp gave the lease back.
func (w *worker) reopening() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.reopen
	w.reopen = false
	return r
}

func (w *worker) runnerCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(w.ctx), w.a.cfg.RPCTimeout)
}

// openInRunner records the mailbox in the runner (not serving); false if
// the worker was stopped first.
func (w *worker) openInRunner() bool {
	bo := w.a.cfg.Backoff
	for {
		done, ok := w.a.startSlot(w.ctx)
		if !ok {
			return false
		}
		dialed := w.a.runnerDialed()
		ctx, cancel := context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
		_, err := w.a.cfg.Runner.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: w.id, Config: runnerConfig(w.assignment.GetConfig()), RecoverFrom: w.recoverFrom(), HistoryBefore: w.historyBefore()})
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
			_, err = w.a.cfg.Runner.CloseMailbox(cctx, &runnerv1.CloseMailboxRequest{MailboxId: w.id})
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
		w.a.sess.retrying(w.id)
		if !w.a.awaitRunner(w.ctx, bo.Step(), dialed) {
			return false
		}
	}
}

// runnerDialed is RunnerConn.Dialed, nil without a RunnerConn; taken before
// a call to the runner, for awaitRunner after it fails.
func (a *Agent) runnerDialed() <-chan struct{} {
	if a.cfg.RunnerConn == nil {
		return nil
	}
	return a.cfg.RunnerConn.Dialed()
}

// awaitRunner waits d before the next call to the runner after one failed,
// or less when the runner is gone: until a dial to it connects (it started
// again), so that its mailboxes are opened, acquired and served again as
// soon as it listens. dialed is runnerDialed from before the failed call,
// so a runner that started again since then is called again at once.
// False if ctx ended first.
func (a *Agent) awaitRunner(ctx context.Context, d time.Duration, dialed <-chan struct{}) bool {
	// Refusing first: a dial that connects clears it and closes dialed at
	// once, so one of the two is seen.
	refusing := a.runnerRefusing()
	select {
	case <-dialed:
		return ctx.Err() == nil
	default:
	}
	if !refusing {
		return sleep(ctx, a.cfg.Clock, d)
	}
	t := a.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
	case <-dialed:
	}
	return true
}

// acquire asks for the lease until granted; it returns the lease and when
// the granted request was sent, or false if the worker was stopped.
func (w *worker) acquire() (*adminv1.Lease, time.Time, bool) {
	bo := w.a.cfg.Backoff
	var lastRefusal adminv1.LeaseRefusalReason
	for {
		req := &adminv1.AcquireLeaseRequest{MailboxId: w.id, RunnerId: w.a.cfg.RunnerID, RunnerAddress: w.a.cfg.AdvertiseAddr}
		if w.a.cfg.LeaseTTL > 0 {
			req.Ttl = durationpb.New(w.a.cfg.LeaseTTL)
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
		sentAt := w.a.cfg.Clock.Now()
		resp, err := w.a.cfg.Admin.AcquireLease(ctx, req)
		cancel()
		switch {
		case err == nil && resp.GetGranted():
			w.a.m.acquires.WithLabelValues("granted").Inc()
			return resp.GetLease(), sentAt, true
		case err == nil:
			w.a.m.acquires.WithLabelValues("refused").Inc()
			r := resp.GetRefusal()
			if r.GetReason() != lastRefusal {
				w.log.Info("lease refused; retrying", "reason", r.GetReason().String(), "holder", r.GetCurrent().GetRunnerId(), "holder_epoch", r.GetCurrent().GetEpoch(), "message", r.GetMessage())
				lastRefusal = r.GetReason()
			}
		default:
			if w.ctx.Err() != nil {
				return nil, time.Time{}, false
			}
			w.a.m.acquires.WithLabelValues("error").Inc()
		}
		retry := w.a.retryWait("acquire", err, &bo)
		if err != nil {
			w.log.Warn("acquire failed; retrying", "err", err, "retry_in", retry)
		}
		if !sleep(w.ctx, w.a.cfg.Clock, retry) {
			return nil, time.Time{}, false
		}
	}
}

type hbResult struct {
	sentAt     time.Time
	resp       *adminv1.MailboxHeartbeatResponse
	err        error
	runnerLost bool // the runner no longer serves the mailbox actively
	// runnerErr is why the runner's control API did not answer the stats
	// probe (nil if it did, NotFound included).
	runnerErr error
	// silence is hold's judgment of the runner with this probe counted.
	silence silence
	// giveUp: the runner is given up on (givingUp); no heartbeat was sent.
	giveUp bool
}

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

// givingUp says whether a runner whose probe failed with err (nil: it
// answered), silent for down, is given up on: silent for deadAfter, or gone
// (its control API refuses connections: runnerconn.go), however short its
// silence. A runner that only does not answer (paused, slow) is never gone.
func (a *Agent) givingUp(err error, down, deadAfter time.Duration) bool {
	return err != nil && (down >= deadAfter || a.gone(err))
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
	clk := w.a.cfg.Clock
	log := w.log.With("epoch", epoch)
	reason := "runner_unreachable"
	w.mu.Lock()
	w.v.State, w.reopen = StateFenced, true
	w.mu.Unlock()
	if w.a.gone(cause) {
		reason = "runner_gone"
		log.Warn("runner gone (its control API refuses connections); renewing no more, releasing the lease at once",
			"down_for", down, "err", cause)
	} else {
		log.Warn("runner unreachable past the bound; renewing no more, releasing the lease once the runner is fenced",
			"down_for", down, "runner_dead_after", deadAfter, "err", cause)
	}
	w.a.m.losses.WithLabelValues(reason).Inc()
	// A confirmation after the runner's deadline would come too late to
	// matter: the release waits no longer than that deadline (at least a
	// probe's timeout, for a runner that is only slow).
	timeout := min(w.a.cfg.RPCTimeout, max(w.runnerDeadline().Sub(clk.Now()), w.a.probeTimeout(w.a.cfg.HeartbeatInterval)))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), timeout)
	_, err := w.a.cfg.Runner.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: w.id, Reason: reason})
	cancel()
	switch wait := w.runnerDeadline().Sub(clk.Now()); {
	case err == nil || status.Code(err) == codes.NotFound:
		log.Info("runner fenced", "reason", reason)
	case w.a.gone(err):
		log.Info("runner gone: it serves nothing, so the lease goes without waiting for its deadline", "deadline_in", wait)
	case wait > 0:
		log.Warn("runner did not confirm the fence; releasing once its own deadline has passed", "wait", wait, "err", err)
		// Counted from now, not from before the log: the release is
		// never later than the deadline.
		if !sleep(w.ctx, clk, w.runnerDeadline().Sub(clk.Now())) {
			return
		}
	}
	ctx, cancel = context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
	defer cancel()
	// release logs and counts every outcome; a lease it could not give
	// back expires on the admin, since nothing renews it any more.
	_ = w.release(ctx, reason, epoch)
	w.update(func(v *LeaseView) { v.Epoch, v.SessionID = 0, 0 })
}

// refused tells a lost lease from a failure to reach the leader.
func refused(r hbResult) (reason, detail string, lost bool) {
	ref := r.resp.GetRefusal()
	if r.err != nil {
		var ok bool
		if ref, ok = mesh.RefusalFrom(r.err); !ok {
			return "", "", false
		}
	}
	if ref == nil || ref.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER || ref.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNSPECIFIED {
		return "", "", false
	}
	return refusalReason(ref), ref.GetMessage(), true
}

// refusalReason is a refusal's reason as a metric label: "expired".
func refusalReason(ref *adminv1.LeaseRefusal) string {
	return strings.ToLower(strings.TrimPrefix(ref.GetReason().String(), "LEASE_REFUSAL_REASON_"))
}

// heartbeat sends one heartbeat with the runner's stats, in the background.
// A slow runner delays it by at most one interval: its stats are not worth
// the lease. A runner given up on (givingUp: it has failed its probes for
// deadAfter, this one counted into sil, hold's, handed over until the
// result comes back, or it is gone) gets no heartbeat: hold gives the lease
// up instead.
func (w *worker) heartbeat(epoch uint64, interval time.Duration, sil silence, deadAfter time.Duration) chan hbResult {
	ch := make(chan hbResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
		defer cancel()
		probeSent := w.a.cfg.Clock.Now()
		stats, lost, runnerErr := w.probe(ctx, epoch, interval)
		sentAt := w.a.cfg.Clock.Now()
		if down := sil.observe(probeSent, sentAt, runnerErr, w.a.heard()); w.a.givingUp(runnerErr, down, deadAfter) {
			ch <- hbResult{runnerErr: runnerErr, silence: sil, giveUp: true}
			return
		}
		resp, err := w.a.cfg.Admin.MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: w.id, RunnerId: w.a.cfg.RunnerID, Epoch: epoch, Stats: stats})
		ch <- hbResult{sentAt: sentAt, resp: resp, err: err, runnerLost: lost, runnerErr: runnerErr, silence: sil}
	}()
	return ch
}

// probeTimeout bounds one stats probe of the runner made every interval.
func (a *Agent) probeTimeout(interval time.Duration) time.Duration {
	return min(a.cfg.RPCTimeout/2, interval)
}

// probe asks the runner for the mailbox's stats: whether it still serves
// it actively under epoch (lost if not), and why its control API did not
// answer (nil if it did, NotFound included).
func (w *worker) probe(ctx context.Context, epoch uint64, interval time.Duration) (stats *adminv1.LeaseStats, lost bool, runnerErr error) {
	stats = &adminv1.LeaseStats{Health: adminv1.RunnerHealth_RUNNER_HEALTH_HEALTHY}
	rctx, rcancel := context.WithTimeout(ctx, w.a.probeTimeout(interval))
	sr, err := w.a.cfg.Runner.GetStats(rctx, &runnerv1.GetStatsRequest{MailboxId: w.id})
	rcancel()
	switch {
	case err == nil && len(sr.GetMailboxes()) == 1:
		st := sr.GetMailboxes()[0]
		stats.EventsStored, stats.QueriesServed, stats.StorageBytes = st.GetEventsStored(), st.GetQueriesServed(), st.GetStorageBytes()
		lost = st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || st.GetEpoch() != epoch
		if lost || !st.GetConsuming() {
			stats.Health = adminv1.RunnerHealth_RUNNER_HEALTH_DEGRADED
		}
	case status.Code(err) == codes.NotFound:
		lost = true
		stats.Health = adminv1.RunnerHealth_RUNNER_HEALTH_DEGRADED
	default:
		stats.Health = adminv1.RunnerHealth_RUNNER_HEALTH_DEGRADED
	}
	if err != nil && status.Code(err) != codes.NotFound {
		runnerErr = err
	}
	return stats, lost, runnerErr
}

// serving counts the mailbox as held from now (and how long it took from its
// assignment) until the returned func is called; it drops the count once
// however often it is called, so every way out of holding can call it (a
// fence drops it before the runner is told, the deferred call on return).
func (w *worker) serving() (unheld func()) {
	w.a.m.acqLatency.Observe(w.a.cfg.Clock.Since(w.assigned).Seconds())
	w.a.m.held.Inc()
	w.update(func(v *LeaseView) { v.State = StateActive })
	var once sync.Once
	return func() { once.Do(w.a.m.held.Dec) }
}

// activate lets the runner consume and serve under epoch until the lease's
// deadline, until(), read anew at each try, retrying until then, and
// records a bound on the deadline the runner took; false if the worker was
// stopped or the deadline came first (then the lease lapsed on this side
// and acquire starts over), or the runner is gone (then the lease is given
// back, giveUp, and the mailbox opened again first).
func (w *worker) activate(epoch uint64, until func() time.Time) bool {
	bo := w.a.cfg.Backoff
	for {
		now, fenceAt := w.a.cfg.Clock.Now(), until()
		if !now.Before(fenceAt) {
			w.fence(epoch, "ttl_elapsed", "the runner could not be activated before ttl ran out", fenceAt)
			return false
		}
		done, ok := w.a.startSlot(w.ctx)
		if !ok {
			return false
		}
		bound := w.a.runnerBound()
		if now, fenceAt = w.a.cfg.Clock.Now(), until(); !now.Before(fenceAt) {
			done()
			continue
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
		vf := durationpb.New(fenceAt.Sub(now))
		b := bound(vf.AsDuration())
		_, err := w.a.cfg.Runner.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: w.id, Epoch: epoch, ValidFor: vf, Bound: b})
		if status.Code(err) == codes.NotFound {
			// The runner restarted and forgot the mailbox: open and
			// activate in one call.
			_, err = w.a.cfg.Runner.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: w.id, Config: runnerConfig(w.assignment.GetConfig()), Epoch: epoch, ValidFor: vf, Bound: b, RecoverFrom: w.recoverFrom(), HistoryBefore: w.historyBefore()})
		}
		cancel()
		done()
		if err == nil {
			// The runner counts valid_for from when it got the call,
			// before it answered.
			w.handed(w.a.cfg.Clock.Now().Add(vf.AsDuration()))
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		if w.a.gone(err) {
			// Nothing to activate: the lease goes, and the mailbox is
			// opened again once the runner listens.
			w.giveUp(epoch, 0, 0, err)
			return false
		}
		w.log.Warn("runner activation failed; retrying", "epoch", epoch, "err", err)
		if !sleep(w.ctx, w.a.cfg.Clock, min(bo.Step(), fenceAt.Sub(now))) {
			return false
		}
	}
}

// extend hands the runner the new time left after an acknowledged heartbeat
// and records a bound on its new deadline, as activate does. A failure is
// only logged: the runner fences itself at the old deadline, and the next
// heartbeat's stats reveal it.
func (w *worker) extend(epoch uint64, fenceAt time.Time) {
	bound := w.a.runnerBound()
	sentAt := w.a.cfg.Clock.Now()
	vf := fenceAt.Sub(sentAt)
	if vf <= 0 || !w.mayExtend() {
		return
	}
	// An answer after vf confirms a deadline that has passed.
	ctx, cancel := context.WithTimeout(w.ctx, min(w.a.cfg.RPCTimeout, vf))
	defer cancel()
	before := w.runnerDeadline()
	if _, err := w.a.cfg.Runner.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: w.id, Epoch: epoch, ValidFor: durationpb.New(vf), Bound: bound(vf)}); err != nil {
		w.unanswered(before, sentAt, vf, err)
		w.log.Warn("runner did not take the extension", "epoch", epoch, "err", err)
		return
	}
	w.handed(w.a.cfg.Clock.Now().Add(vf))
}

// fence stops the runner on the mailbox at once and records the loss; it
// retries until the runner confirms, is gone (it serves nothing), or the
// worker is stopped (a stopped worker's runner is drained or closed next
// anyway).
func (w *worker) fence(epoch uint64, reason, detail string, lastAckSent time.Time) {
	w.a.m.losses.WithLabelValues(reason).Inc()
	w.update(func(v *LeaseView) { v.State = StateFenced })
	w.log.Warn("lease lost; fencing the runner", "epoch", epoch, "reason", reason, "detail", detail, "last_ack_sent", lastAckSent)
	bo := w.a.cfg.Backoff
	for {
		ctx, cancel := w.runnerCtx()
		_, err := w.a.cfg.Runner.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: w.id, Reason: reason})
		cancel()
		if err == nil || status.Code(err) == codes.NotFound {
			w.log.Info("runner fenced", "epoch", epoch, "reason", reason)
			return
		}
		if w.a.gone(err) {
			w.log.Info("runner gone (its control API refuses connections): it serves nothing", "epoch", epoch, "reason", reason)
			return
		}
		w.log.Error("runner did not confirm the fence; retrying", "epoch", epoch, "err", err)
		if !sleep(w.ctx, w.a.cfg.Clock, bo.Step()) {
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
	ctx, cancel := context.WithTimeout(context.Background(), w.a.cfg.StopTimeout)
	defer cancel()
	if _, err := w.a.cfg.Runner.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{w.id}}); err != nil {
		w.log.Warn("runner drain failed", "err", err)
	}
	closed := w.closeInRunner(ctx, "unassigned")
	v := w.view()
	if v.Epoch == 0 {
		return true
	}
	if !closed && !w.outwait(w.a.halt, "unassigned", v.Epoch) {
		return false
	}
	rctx, rcancel := context.WithTimeout(context.Background(), w.a.cfg.RPCTimeout)
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
	_, err := w.a.cfg.Runner.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: w.id})
	if err == nil {
		return true
	}
	w.log.Warn("runner close failed; fencing the mailbox instead", "err", err)
	_, err = w.a.cfg.Runner.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: w.id, Reason: cause})
	if err == nil || status.Code(err) == codes.NotFound {
		w.log.Info("runner fenced", "reason", cause)
		return true
	}
	if w.a.gone(err) {
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
	clk := w.a.cfg.Clock
	wait := w.runnerDeadline().Sub(clk.Now())
	if wait <= 0 {
		return true
	}
	log := w.log.With("epoch", epoch, "cause", cause)
	log.Warn("releasing the lease once the deadline the runner was handed has passed", "wait", wait)
	if sleep(ctx, clk, wait) {
		return true
	}
	w.a.m.releases.WithLabelValues(cause, "expiring").Inc()
	log.Error("lease not released: the runner may serve under it until its deadline; it expires after ttl + grace", "runner_deadline", w.runnerDeadline())
	return false
}

// release gives the lease back; every outcome is logged and counted.
// A lease of a session is released in it (ReleaseLeases), one on its own
// with ReleaseLease.
func (w *worker) release(ctx context.Context, cause string, epoch uint64) error {
	var (
		released bool
		refusal  *adminv1.LeaseRefusal
		index    uint64
		err      error
	)
	sessionID := w.view().SessionID
	if sessionID != 0 {
		var r *adminv1.MailboxLeaseResult
		r, index, err = w.a.sess.release(ctx, sessionID, w.id)
		released, refusal = r.GetOk(), r.GetRefusal()
	} else {
		var resp *adminv1.ReleaseLeaseResponse
		resp, err = w.a.cfg.Admin.ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: w.id, RunnerId: w.a.cfg.RunnerID, Epoch: epoch})
		released, refusal, index = resp.GetReleased(), resp.GetRefusal(), resp.GetIndex()
	}
	log := w.log.With("epoch", epoch, "cause", cause)
	if sessionID != 0 {
		log = log.With("session_id", sessionID)
	}
	switch {
	case err != nil:
		w.a.m.releases.WithLabelValues(cause, "error").Inc()
		log.Error("lease release failed; it expires after ttl + grace", "err", err)
		return err
	case released:
		w.a.m.releases.WithLabelValues(cause, "released").Inc()
		log.Info("lease released", "index", index)
	case refusal != nil:
		w.a.m.releases.WithLabelValues(cause, "refused").Inc()
		log.Warn("lease release refused: it was no longer ours", "reason", refusal.GetReason().String(), "message", refusal.GetMessage())
	default:
		w.a.m.releases.WithLabelValues(cause, "absent").Inc()
		log.Info("lease already gone at release")
	}
	w.update(func(v *LeaseView) { v.State = StateFenced })
	return nil
}

func runnerConfig(c *adminv1.NamespaceConfig) *runnerv1.MailboxConfig {
	return &runnerv1.MailboxConfig{
		Topics:          c.GetTopics(),
		ValidationMode:  runnerv1.ValidationMode(c.GetValidationMode()),
		MaxAgeMillis:    c.GetRetention().GetMaxAge().AsDuration().Milliseconds(),
		MaxSizeBytes:    c.GetRetention().GetMaxSizeBytes(),
		DeadLetterTopic: c.GetDeadLetterTopic(),
	}
}

// setRole records the assignment's role and returns the previous one.
func (w *worker) setRole(r adminv1.AssignmentRole) adminv1.AssignmentRole {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := w.v.Role
	w.v.Role = r
	if prev != r {
		select {
		case w.roleCh <- struct{}{}:
		default: // the loop has yet to look at the previous change
		}
	}
	return prev
}

// roleName is a role as a log value: "serving", "catching_up".
func roleName(r adminv1.AssignmentRole) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ASSIGNMENT_ROLE_"))
}
