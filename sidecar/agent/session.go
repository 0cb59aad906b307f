package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// LeaseMode is how the sidecar holds its leases.
type LeaseMode string

const (
	// LeaseModeSession holds every lease in one session
	// (docs/architecture.md#sessions): one keepalive renews them all,
	// acquires and releases are batched.
	LeaseModeSession LeaseMode = "session"
	// LeaseModeMailbox acquires and heartbeats each lease on its own, for
	// an admin cluster without the Sessions service.
	LeaseModeMailbox LeaseMode = "mailbox"
)

// maxBatch is the most mailboxes one AcquireLeases may name (the admin's
// bulk quota).
const maxBatch = 10000

// batchLinger bounds how long queued acquires wait for the mailboxes
// expected with them whose runner open failed and is being retried.
const batchLinger = time.Second

// sessState is one opened session as the sidecar holds it. Its validity is
// computed as a lease's is: ttl after the send of the last acknowledged
// keepalive (or the open). renewed is closed and replaced on every
// acknowledged keepalive, lost is closed once when the session is lost:
// the workers holding leases in it wait on both.
type sessState struct {
	id  uint64
	ttl time.Duration

	// Guarded by sessions.mu.
	lastAckSent, validUntil time.Time
	renewed                 chan struct{}
	lost                    chan struct{}
	lostReason, lostDetail  string
}

// acqResult is one mailbox's answer in an AcquireLeases batch.
type acqResult struct {
	lease   *adminv1.Lease
	refusal *adminv1.LeaseRefusal
	st      *sessState
}

// sessions holds the sidecar's one session: it opens it, keeps it alive,
// and sends the workers' acquires in batches (see the package doc).
type sessions struct {
	a *Agent

	decided chan struct{} // closed once the lease mode is known
	mode    LeaseMode     // set before decided is closed

	mu      sync.Mutex
	cur     *sessState // nil until opened, or once lost
	opened  chan struct{}
	wake    chan struct{}
	pending map[string]chan acqResult
	queued  time.Time // when pending last became non-empty
	// expected mailboxes are about to ask for their leases; true once
	// their first runner open failed.
	expected map[string]bool
	probe    probeResult
	probed   chan struct{} // closed and replaced by every probe
	// holding are the mailboxes the runner serves under a lease of the
	// session, extended together after every acknowledged keepalive.
	holding map[string]heldMailbox

	// extendWake asks the extender for one ExtendMailboxes; extending is
	// the one in flight (nil if none), so that a worker that stops holding
	// waits for the extension in flight that names it (unhold) before it
	// fences or gives the lease back, and is named in no later one.
	extendWake chan struct{}
	extending  *extension
	// perMailboxExtend is set once the runner answered ExtendMailboxes
	// Unimplemented (an older runner): one ExtendMailbox per mailbox.
	perMailboxExtend atomic.Bool
}

// heldMailbox is one mailbox the runner serves under a session's lease.
type heldMailbox struct {
	w     *worker
	st    *sessState
	epoch uint64
}

// probeResult is one stats probe of every mailbox of the runner, and the
// runner's silence with it counted (nil err: it answered).
type probeResult struct {
	sentAt    time.Time
	silence   silence
	mailboxes map[string]*runnerv1.MailboxStatus
	err       error
}

func newSessions(a *Agent) *sessions {
	s := &sessions{
		a: a, decided: make(chan struct{}), opened: make(chan struct{}), wake: make(chan struct{}, 1),
		pending: map[string]chan acqResult{}, expected: map[string]bool{}, probed: make(chan struct{}),
		holding: map[string]heldMailbox{}, extendWake: make(chan struct{}, 1),
	}
	if a.cfg.LeaseMode == LeaseModeMailbox {
		s.decide(LeaseModeMailbox)
	}
	return s
}

func (s *sessions) decide(m LeaseMode) {
	s.mode = m
	close(s.decided)
}

// leaseMode waits until the mode is known; false if ctx ended first.
func (s *sessions) leaseMode(ctx context.Context) (LeaseMode, bool) {
	select {
	case <-s.decided:
		return s.mode, true
	case <-ctx.Done():
		return "", false
	}
}

func (s *sessions) sessionMode() bool {
	select {
	case <-s.decided:
		return s.mode == LeaseModeSession
	default:
		return s.a.cfg.LeaseMode == LeaseModeSession
	}
}

func (s *sessions) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// expect names mailboxes about to ask for their leases: a batch waits
// until each has asked or was stopped (unexpect), and for those whose
// runner open failed (retrying) at most batchLinger, so the assignments
// known together are acquired in one call even when the runner is slow.
func (s *sessions) expect(ids ...string) {
	if !s.sessionMode() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.expected[id] = false
	}
}

// retrying marks an expected mailbox whose runner open failed.
func (s *sessions) retrying(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.expected[id]; ok {
		s.expected[id] = true
		s.kick()
	}
}

func (s *sessions) unexpect(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.expected[id]; ok {
		delete(s.expected, id)
		s.kick()
	}
}

// acquire queues id for the next batch and waits for its answer.
func (s *sessions) acquire(ctx context.Context, id string) (acqResult, bool) {
	ch := make(chan acqResult, 1)
	s.mu.Lock()
	delete(s.expected, id)
	if len(s.pending) == 0 {
		s.queued = s.a.cfg.Clock.Now()
	}
	s.pending[id] = ch
	s.mu.Unlock()
	s.kick()
	select {
	case r := <-ch:
		return r, true
	case <-ctx.Done():
		s.mu.Lock()
		if s.pending[id] == ch {
			delete(s.pending, id)
		}
		s.mu.Unlock()
		select {
		case r := <-ch:
			// Granted as we gave up: the lease stays in the session
			// until released at the unassign or shutdown, or ended
			// with the session.
			return r, true
		default:
			return acqResult{}, false
		}
	}
}

// current is the open session, nil if none.
func (s *sessions) current() *sessState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// validity is when st's last acknowledged keepalive was sent, its deadline,
// and the channels to wait on for its next renewal and its loss.
func (s *sessions) validity(st *sessState) (lastAckSent, until time.Time, renewed, lost <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.lastAckSent, st.validUntil, st.renewed, st.lost
}

func (s *sessions) lostWhy(st *sessState) (reason, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.lostReason, st.lostDetail
}

// lose ends st once: every worker holding a lease in it fences at once.
func (s *sessions) lose(st *sessState, reason, detail string) {
	if s.end(st, reason, detail) {
		s.a.log.Warn("session lost; its leases are fenced and acquired again in a new one", "session_id", st.id, "reason", reason, "detail", detail)
	}
}

// end marks st lost; false if it already was.
func (s *sessions) end(st *sessState, reason, detail string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-st.lost:
		return false
	default:
	}
	st.lostReason, st.lostDetail = reason, detail
	close(st.lost)
	if s.cur == st {
		s.cur = nil
		s.opened = make(chan struct{})
	}
	return true
}

// run opens the session and keeps it alive until ctx ends; the batches
// go out from their own goroutine so that a long grant never delays a
// keepalive. An admin without the Sessions service switches the sidecar
// to per-mailbox leases.
func (s *sessions) run(ctx context.Context) {
	if s.a.cfg.LeaseMode != LeaseModeSession {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		st, ok := s.open(ctx)
		if !ok {
			return
		}
		if st == nil {
			return // fell back to mailbox mode
		}
		select {
		case <-s.decided:
		default:
			s.decide(LeaseModeSession)
			wg.Go(func() { s.batches(ctx) })
			wg.Go(func() { s.probes(ctx, min(s.a.cfg.HeartbeatInterval, st.ttl/3)) })
			wg.Go(func() { s.extender(ctx) })
		}
		s.keepAlive(ctx, st)
	}
}

// open retries OpenSession until it succeeds; nil, true when the admin has
// no Sessions service (the mode is then mailbox); false if ctx ended.
func (s *sessions) open(ctx context.Context) (*sessState, bool) {
	a := s.a
	bo := a.cfg.Backoff
	for {
		req := &adminv1.OpenSessionRequest{ProxyId: a.cfg.ProxyID, RunnerId: a.cfg.RunnerID, RunnerAddress: a.cfg.AdvertiseAddr}
		if a.cfg.LeaseTTL > 0 {
			req.Ttl = durationpb.New(a.cfg.LeaseTTL)
		}
		cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
		sentAt := a.cfg.Clock.Now()
		resp, err := a.cfg.Sessions.OpenSession(cctx, req)
		cancel()
		switch {
		case err == nil && resp.GetSession() != nil:
			ttl := resp.GetSession().GetTtl().AsDuration()
			if ttl <= 0 {
				ttl = a.cfg.LeaseTTL
			}
			st := &sessState{
				id: resp.GetSession().GetId(), ttl: ttl, lastAckSent: sentAt, validUntil: sentAt.Add(ttl),
				renewed: make(chan struct{}), lost: make(chan struct{}),
			}
			a.m.sessionsOpened.Inc()
			a.log.Info("session opened", "session_id", st.id, "ttl", ttl, "index", resp.GetIndex())
			s.mu.Lock()
			s.cur = st
			close(s.opened)
			s.mu.Unlock()
			s.kick()
			return st, true
		case status.Code(err) == codes.Unimplemented:
			select {
			case <-s.decided:
				// Already on sessions: an old node answered. Try again;
				// the leases in flight stay per session.
			default:
				a.log.Warn("the admin cluster has no Sessions service (not upgraded); holding each lease on its own (--lease-mode=mailbox)", "err", err)
				s.decide(LeaseModeMailbox)
				return nil, true
			}
		case err == nil:
			a.log.Warn("session refused; retrying", "reason", resp.GetRefusal().GetReason().String(), "message", resp.GetRefusal().GetMessage())
		default:
			if ctx.Err() != nil {
				return nil, false
			}
			a.log.Warn("open session failed; retrying", "err", err)
		}
		if !sleep(ctx, a.cfg.Clock, a.retryWait("open_session", err, &bo)) {
			return nil, false
		}
	}
}

// keepAlive renews st every interval (jittered) until it is lost or ctx
// ends. One keepalive is in flight at a time; the workers fence by st's
// validity on their own timers, so a blackholed admin cannot delay that.
// A session whose validity ran out is lost too: its leases' validity is
// its own (an acquire does not renew it), so only a new session serves
// again.
func (s *sessions) keepAlive(ctx context.Context, st *sessState) {
	a := s.a
	clk := a.cfg.Clock
	// At least two tries before the fence, whatever was configured.
	interval := min(a.cfg.HeartbeatInterval, st.ttl/3)
	bo := a.cfg.Backoff
	next := st.lastAckSent.Add(a.cfg.Jitter(interval))
	for {
		_, until, _, lost := s.validity(st)
		if !clk.Now().Before(until) {
			s.lose(st, "ttl_elapsed", "no session keepalive acknowledged for ttl since the last one was sent")
			return
		}
		wake := next
		if until.Before(wake) {
			wake = until
		}
		t := clk.NewTimer(wake.Sub(clk.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-lost:
			t.Stop()
			return
		case <-t.C():
		}
		if !clk.Now().Before(next) {
			next = s.keepAliveOnce(ctx, st, &bo, interval)
		}
	}
}

// keepAliveOnce sends one keepalive and returns when the next one is due
// (the session is lost instead on a refusal).
func (s *sessions) keepAliveOnce(ctx context.Context, st *sessState, bo *wait.Backoff, interval time.Duration) time.Time {
	a := s.a
	clk := a.cfg.Clock
	cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
	sentAt := clk.Now()
	resp, err := a.cfg.Sessions.KeepAliveSession(cctx, &adminv1.KeepAliveSessionRequest{ProxyId: a.cfg.ProxyID, SessionId: st.id})
	cancel()
	ref := resp.GetRefusal()
	if r, ok := mesh.RefusalFrom(err); ok {
		ref = r
	}
	switch {
	case ctx.Err() != nil:
	case err == nil && resp.GetRenewed():
		a.m.keepalives.WithLabelValues("renewed").Inc()
		a.m.kaLatency.Observe(clk.Since(sentAt).Seconds())
		*bo = a.cfg.Backoff
		ttl := st.ttl
		if d := resp.GetTtl().AsDuration(); d > 0 {
			ttl = d
		}
		s.mu.Lock()
		st.lastAckSent = sentAt
		if at := sentAt.Add(ttl); at.After(st.validUntil) {
			st.validUntil = at
		}
		close(st.renewed)
		st.renewed = make(chan struct{})
		s.mu.Unlock()
		select {
		case s.extendWake <- struct{}{}:
		default:
		}
		return sentAt.Add(a.cfg.Jitter(interval))
	case sessionRefused(ref), status.Code(err) == codes.PermissionDenied:
		a.m.keepalives.WithLabelValues("refused").Inc()
		reason, detail := refusalReason(ref), ref.GetMessage()
		if ref == nil {
			reason, detail = "permission_denied", err.Error()
		}
		s.lose(st, reason, detail)
	default:
		a.m.keepalives.WithLabelValues("error").Inc()
		// The admin never sheds keepalives (admission.go); should one
		// ask anyway, its delay is honoured: the fence below does not
		// depend on it.
		retry := a.retryWait("keepalive", err, bo)
		_, until, _, _ := s.validity(st)
		a.log.Warn("session keepalive failed; retrying", "session_id", st.id, "err", errors.Join(err, refusalErr(ref)), "retry_in", retry, "fence_in", until.Sub(clk.Now()))
		return clk.Now().Add(retry)
	}
	return clk.Now()
}

// sessionRefused is a refusal that ends the session (not NOT_LEADER).
func sessionRefused(ref *adminv1.LeaseRefusal) bool {
	r := ref.GetReason()
	return ref != nil && r != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER && r != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNSPECIFIED
}

func refusalErr(ref *adminv1.LeaseRefusal) error {
	if ref == nil {
		return nil
	}
	return fmt.Errorf("%s: %s", ref.GetReason(), ref.GetMessage())
}

// batches sends the queued acquires, all of them in one AcquireLeases,
// once no mailbox expected to ask is still on its way; an acquire that
// fails is sent again with backoff, with whatever has queued meanwhile.
func (s *sessions) batches(ctx context.Context) {
	a := s.a
	bo := a.cfg.Backoff
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			st, opened := s.cur, s.opened
			pending, queued := len(s.pending), s.queued
			opening, retrying := 0, 0
			for _, r := range s.expected {
				if r {
					retrying++
				} else {
					opening++
				}
			}
			s.mu.Unlock()
			if pending == 0 || opening > 0 {
				// Every runner open ends within RPCTimeout, then asks
				// or retries: either wakes this loop.
				break
			}
			if wait := queued.Add(batchLinger).Sub(a.cfg.Clock.Now()); retrying > 0 && wait > 0 {
				t := a.cfg.Clock.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-s.wake:
				case <-t.C():
				}
				t.Stop()
				continue
			}
			if st == nil {
				select {
				case <-ctx.Done():
					return
				case <-opened:
					continue
				}
			}
			err := s.send(ctx, st)
			if err == nil {
				bo = a.cfg.Backoff
				continue
			}
			if !sleep(ctx, a.cfg.Clock, a.retryWait("acquire_leases", err, &bo)) {
				return
			}
		}
	}
}

// send makes one AcquireLeases call in st of up to maxBatch queued
// mailboxes and hands each its answer; the call's error if it failed (the
// mailboxes stay queued).
func (s *sessions) send(ctx context.Context, st *sessState) error {
	a := s.a
	if _, until, _, _ := s.validity(st); !a.cfg.Clock.Now().Before(until) {
		// Its leases would be fenced as soon as granted.
		s.lose(st, "ttl_elapsed", "no session keepalive acknowledged for ttl since the last one was sent")
		return nil
	}
	s.mu.Lock()
	ids := make([]string, 0, min(len(s.pending), maxBatch))
	for id := range s.pending {
		ids = append(ids, id)
	}
	expected := len(s.expected)
	s.mu.Unlock()
	slices.Sort(ids)
	ids = ids[:min(len(ids), maxBatch)]
	cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
	resp, err := a.cfg.Sessions.AcquireLeases(cctx, &adminv1.AcquireLeasesRequest{ProxyId: a.cfg.ProxyID, SessionId: st.id, MailboxIds: ids})
	cancel()
	a.m.batches.Inc()
	switch {
	case err != nil:
		a.m.acquires.WithLabelValues("error").Add(float64(len(ids)))
		if ctx.Err() == nil {
			a.log.Warn("acquire batch failed; retrying", "session_id", st.id, "mailboxes", len(ids), "err", err)
		}
		return err
	case resp.GetRefusal() != nil:
		a.m.acquires.WithLabelValues("refused").Add(float64(len(ids)))
		s.lose(st, refusalReason(resp.GetRefusal()), resp.GetRefusal().GetMessage())
		return nil
	}
	granted := 0
	var orphans []string
	s.mu.Lock()
	for _, r := range resp.GetResults() {
		ch, ok := s.pending[r.GetMailboxId()]
		if !ok {
			// Its worker stopped meanwhile (unassigned): nothing would
			// release the lease, and the session would keep it alive.
			if r.GetOk() {
				orphans = append(orphans, r.GetMailboxId())
			}
			continue
		}
		delete(s.pending, r.GetMailboxId())
		if r.GetOk() {
			granted++
		}
		ch <- acqResult{lease: r.GetLease(), refusal: r.GetRefusal(), st: st}
	}
	s.mu.Unlock()
	a.m.acquires.WithLabelValues("granted").Add(float64(granted))
	a.m.acquires.WithLabelValues("refused").Add(float64(len(resp.GetResults()) - granted))
	a.log.Info("leases acquired in one batch", "session_id", st.id, "asked", len(ids), "granted", granted, "still_expected", expected, "index", resp.GetIndex())
	if len(orphans) > 0 {
		cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
		_, err := a.cfg.Sessions.ReleaseLeases(cctx, &adminv1.ReleaseLeasesRequest{ProxyId: a.cfg.ProxyID, SessionId: st.id, MailboxIds: orphans})
		cancel()
		a.log.Info("released the leases granted to mailboxes no longer asking", "session_id", st.id, "mailboxes", orphans, "err", err)
	}
	return nil
}

// release gives back one lease of session id.
func (s *sessions) release(ctx context.Context, sessionID uint64, mailboxID string) (*adminv1.MailboxLeaseResult, uint64, error) {
	a := s.a
	resp, err := a.cfg.Sessions.ReleaseLeases(ctx, &adminv1.ReleaseLeasesRequest{ProxyId: a.cfg.ProxyID, SessionId: sessionID, MailboxIds: []string{mailboxID}})
	if err != nil {
		return nil, 0, err
	}
	if ref := resp.GetRefusal(); ref != nil {
		return &adminv1.MailboxLeaseResult{MailboxId: mailboxID, Refusal: ref}, resp.GetIndex(), nil
	}
	for _, r := range resp.GetResults() {
		if r.GetMailboxId() == mailboxID {
			return r, resp.GetIndex(), nil
		}
	}
	return &adminv1.MailboxLeaseResult{MailboxId: mailboxID}, resp.GetIndex(), nil
}

// close ends the current session and with it every lease it holds, in one
// call; it returns the session's id (0 if none was open) and how many
// leases ended.
func (s *sessions) close(ctx context.Context) (uint64, uint32, error) {
	st := s.current()
	if st == nil {
		return 0, 0, nil
	}
	a := s.a
	resp, err := a.cfg.Sessions.CloseSession(ctx, &adminv1.CloseSessionRequest{ProxyId: a.cfg.ProxyID, SessionId: st.id})
	if err != nil {
		return st.id, 0, fmt.Errorf("close session %d: %w", st.id, err)
	}
	s.end(st, "closed", "closed at shutdown")
	a.log.Info("session closed", "session_id", st.id, "closed", resp.GetClosed(), "leases", resp.GetLeasesReleased(), "index", resp.GetIndex())
	return st.id, resp.GetLeasesReleased(), nil
}

// acquireSession asks for the lease in the next batch until granted; false
// if the worker was stopped.
func (w *worker) acquireSession() (acqResult, bool) {
	bo := w.a.cfg.Backoff
	var lastRefusal adminv1.LeaseRefusalReason
	for {
		r, ok := w.a.sess.acquire(w.ctx, w.id)
		if !ok {
			return acqResult{}, false
		}
		if r.lease != nil {
			return r, true
		}
		if r.refusal.GetReason() != lastRefusal {
			w.log.Info("lease refused; retrying", "session_id", r.st.id, "reason", r.refusal.GetReason().String(), "holder", r.refusal.GetCurrent().GetRunnerId(), "holder_epoch", r.refusal.GetCurrent().GetEpoch(), "message", r.refusal.GetMessage())
			lastRefusal = r.refusal.GetReason()
		}
		if !sleep(w.ctx, w.a.cfg.Clock, bo.Step()) {
			return acqResult{}, false
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

// probes asks the runner for the stats of every mailbox in one call every
// interval (jittered) and hands the answer to the workers: a probe of the
// runner's control API per sidecar, not per mailbox.
func (s *sessions) probes(ctx context.Context, interval time.Duration) {
	a := s.a
	timeout := a.probeTimeout(interval)
	// Until the first probe the runner counts as having answered now; each
	// worker counts from its own activation at the earliest.
	sil := newSilence(a.cfg.Clock.Now(), timeout, interval)
	for sleep(ctx, a.cfg.Clock, a.cfg.Jitter(interval)) {
		sentAt := a.cfg.Clock.Now()
		rctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := a.cfg.Runner.GetStats(rctx, &runnerv1.GetStatsRequest{})
		cancel()
		if ctx.Err() != nil {
			return
		}
		sil.observe(sentAt, a.cfg.Clock.Now(), err, a.heard())
		r := probeResult{sentAt: sentAt, silence: sil, err: err}
		if err == nil {
			r.mailboxes = make(map[string]*runnerv1.MailboxStatus, len(resp.GetMailboxes()))
			for _, m := range resp.GetMailboxes() {
				r.mailboxes[m.GetMailboxId()] = m
			}
		}
		s.mu.Lock()
		s.probe = r
		close(s.probed)
		s.probed = make(chan struct{})
		s.mu.Unlock()
	}
}

// lastProbe is the latest probe and the channel closed by the next one.
func (s *sessions) lastProbe() (probeResult, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probe, s.probed
}

// hold adds w's mailbox, served under epoch in st, to the next extensions.
func (s *sessions) hold(w *worker, st *sessState, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holding[w.id] = heldMailbox{w: w, st: st, epoch: epoch}
}

// extension is one ExtendMailboxes in flight: the mailboxes it names, and
// done, closed once it ended and its outcome is recorded (handed).
type extension struct {
	ids  map[string]bool
	done chan struct{}
}

// unhold takes w's mailbox out of the extensions, then waits for the one in
// flight if it names w: after it returns the runner is extended for w no
// more, and runnerDeadline bounds every deadline it was sent. It never
// waits for a later extension (a keepalive acknowledged meanwhile), which
// would hold a worker giving up on a stopped runner for another call's
// timeout.
func (s *sessions) unhold(w *worker) {
	s.mu.Lock()
	if h, ok := s.holding[w.id]; ok && h.w == w {
		delete(s.holding, w.id)
	}
	ext := s.extending
	s.mu.Unlock()
	if ext != nil && ext.ids[w.id] {
		<-ext.done
	}
}

// extender extends the runner's deadline of every mailbox held in the
// session after each acknowledged keepalive, in its own goroutine so that
// a slow runner never delays a keepalive.
func (s *sessions) extender(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.extendWake:
		}
		s.extendAll(ctx)
	}
}

// extendAll hands the runner the session's time left for every mailbox
// held in it: one ExtendMailboxes, or one ExtendMailbox per mailbox on a
// runner without it. A failure is only logged, as for a single extend: the
// runner fences itself at the old deadline, and the next probe shows it.
func (s *sessions) extendAll(ctx context.Context) {
	a := s.a
	s.mu.Lock()
	st := s.cur
	var held []heldMailbox
	if st != nil {
		for _, id := range slices.Sorted(maps.Keys(s.holding)) {
			if h := s.holding[id]; h.st == st && h.w.mayExtend() {
				held = append(held, h)
			}
		}
	}
	bound := a.runnerBound()
	sentAt := a.cfg.Clock.Now()
	var vf time.Duration
	if len(held) > 0 {
		vf = st.validUntil.Sub(sentAt)
	}
	if vf <= 0 {
		s.mu.Unlock()
		return
	}
	ext := &extension{ids: make(map[string]bool, len(held)), done: make(chan struct{})}
	for _, h := range held {
		ext.ids[h.w.id] = true
	}
	s.extending = ext
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.extending = nil
		s.mu.Unlock()
		close(ext.done)
	}()
	reqs := make([]*runnerv1.ExtendMailboxRequest, len(held))
	before := make([]time.Time, len(held))
	for i, h := range held {
		reqs[i] = &runnerv1.ExtendMailboxRequest{MailboxId: h.w.id, Epoch: h.epoch, ValidFor: durationpb.New(vf), Bound: bound(vf)}
		before[i] = h.w.runnerDeadline()
	}
	// An answer after vf confirms a deadline that has passed: waiting for
	// it would only hold back a worker giving the lease up (unhold).
	cctx, cancel := context.WithTimeout(ctx, min(a.cfg.RPCTimeout, vf))
	defer cancel()
	if !s.perMailboxExtend.Load() {
		resp, err := a.cfg.Runner.ExtendMailboxes(cctx, &runnerv1.ExtendMailboxesRequest{Mailboxes: reqs})
		switch {
		case status.Code(err) == codes.Unimplemented:
			a.log.Info("the runner has no ExtendMailboxes (not upgraded); extending each mailbox on its own", "err", err)
			s.perMailboxExtend.Store(true)
		case err != nil:
			for i, h := range held {
				h.w.unanswered(before[i], sentAt, vf, err)
			}
			a.log.Warn("runner did not take the extensions", "session_id", st.id, "mailboxes", len(held), "err", err)
			return
		default:
			took := a.cfg.Clock.Now().Add(vf)
			byID := make(map[string]heldMailbox, len(held))
			for _, h := range held {
				byID[h.w.id] = h
			}
			for _, r := range resp.GetResults() {
				h, ok := byID[r.GetMailboxId()]
				if !ok {
					continue
				}
				if c := codes.Code(r.GetCode()); c != codes.OK {
					h.w.log.Warn("runner did not take the extension", "epoch", h.epoch, "code", c, "err", r.GetMessage())
					continue
				}
				h.w.handed(took)
			}
			return
		}
	}
	var wg sync.WaitGroup
	for i, h := range held {
		wg.Go(func() {
			if _, err := a.cfg.Runner.ExtendMailbox(cctx, reqs[i]); err != nil {
				h.w.unanswered(before[i], sentAt, vf, err)
				h.w.log.Warn("runner did not take the extension", "epoch", h.epoch, "err", err)
				return
			}
			h.w.handed(a.cfg.Clock.Now().Add(vf))
		})
	}
	wg.Wait()
}
