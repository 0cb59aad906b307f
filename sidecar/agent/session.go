package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/util/wait"
)

// sessState is one opened session as the sidecar holds it: its grant,
// valid as a lease's is, until ttl after the send of the last acknowledged
// keepalive (or the open); every lease of the session is valid as long.
type sessState struct {
	*renewable
}

// sessions holds the sidecar's one session: it opens it, keeps it alive,
// and sends the workers' acquires in batches (docs/architecture.md#sessions).
type sessions struct {
	cfg *Config
	log *slog.Logger
	m   *metrics
	rn  *runnerClient

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
	// board has the session's one probe of the runner per interval, which
	// every worker of the session judges the runner by.
	board *probeBoard
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

func newSessions(cfg *Config, log *slog.Logger, m *metrics, rn *runnerClient) *sessions {
	s := &sessions{
		cfg: cfg, log: log, m: m, rn: rn, decided: make(chan struct{}), opened: make(chan struct{}), wake: make(chan struct{}, 1),
		pending: map[string]chan acqResult{}, expected: map[string]bool{}, board: newProbeBoard(),
		holding: map[string]heldMailbox{}, extendWake: make(chan struct{}, 1),
	}
	if cfg.LeaseMode == LeaseModeMailbox {
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
		return s.cfg.LeaseMode == LeaseModeSession
	}
}

func (s *sessions) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// current is the open session, nil if none.
func (s *sessions) current() *sessState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// lose ends st once: every worker holding a lease in it fences at once.
func (s *sessions) lose(st *sessState, reason, detail string) {
	if s.end(st, reason, detail) {
		s.log.Warn("session lost; its leases are fenced and acquired again in a new one", "session_id", st.id, "reason", reason, "detail", detail)
	}
}

// end marks st lost; false if it already was.
func (s *sessions) end(st *sessState, reason, detail string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !st.lose(reason, detail) {
		return false
	}
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
	if s.cfg.LeaseMode != LeaseModeSession {
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
			wg.Go(func() { s.probes(ctx, st.every) })
			wg.Go(func() { s.extender(ctx) })
		}
		s.keepAlive(ctx, st)
	}
}

// open retries OpenSession until it succeeds; nil, true when the admin has
// no Sessions service (the mode is then mailbox); false if ctx ended.
func (s *sessions) open(ctx context.Context) (*sessState, bool) {
	bo := s.cfg.Backoff
	for {
		req := &adminv1.OpenSessionRequest{ProxyId: s.cfg.ProxyID, RunnerId: s.cfg.RunnerID, RunnerAddress: s.cfg.AdvertiseAddr}
		if s.cfg.LeaseTTL > 0 {
			req.Ttl = durationpb.New(s.cfg.LeaseTTL)
		}
		cctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
		sentAt := s.cfg.Clock.Now()
		resp, err := s.cfg.Sessions.OpenSession(cctx, req)
		cancel()
		switch {
		case err == nil && resp.GetSession() != nil:
			ttl := resp.GetSession().GetTtl().AsDuration()
			if ttl <= 0 {
				ttl = s.cfg.LeaseTTL
			}
			// At least two keepalives before the fence, whatever was
			// configured.
			st := &sessState{newRenewable(resp.GetSession().GetId(), sentAt, ttl, min(s.cfg.HeartbeatInterval, ttl/3))}
			s.m.sessionsOpened.Inc()
			s.log.Info("session opened", "session_id", st.id, "ttl", ttl, "index", resp.GetIndex())
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
				s.log.Warn("the admin cluster has no Sessions service (not upgraded); holding each lease on its own (--lease-mode=mailbox)", "err", err)
				s.decide(LeaseModeMailbox)
				return nil, true
			}
		case err == nil:
			s.log.Warn("session refused; retrying", "reason", resp.GetRefusal().GetReason().String(), "message", resp.GetRefusal().GetMessage())
		default:
			if ctx.Err() != nil {
				return nil, false
			}
			s.log.Warn("open session failed; retrying", "err", err)
		}
		if !sleep(ctx, s.cfg.Clock, s.m.retryWait("open_session", err, &bo)) {
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
	clk := s.cfg.Clock
	interval := st.every
	bo := s.cfg.Backoff
	next := st.window().lastAckSent.Add(s.cfg.Jitter(interval))
	for {
		win := st.window()
		if until := win.until; !clk.Now().Before(until) {
			s.lose(st, "ttl_elapsed", "no session keepalive acknowledged for ttl since the last one was sent")
			return
		}
		wake := next
		if win.until.Before(wake) {
			wake = win.until
		}
		t := clk.NewTimer(wake.Sub(clk.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-win.lost:
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
	clk := s.cfg.Clock
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
	sentAt := clk.Now()
	resp, err := s.cfg.Sessions.KeepAliveSession(cctx, &adminv1.KeepAliveSessionRequest{ProxyId: s.cfg.ProxyID, SessionId: st.id})
	cancel()
	ref := resp.GetRefusal()
	if r, ok := mesh.RefusalFrom(err); ok {
		ref = r
	}
	switch {
	case ctx.Err() != nil:
	case err == nil && resp.GetRenewed():
		s.m.keepalives.WithLabelValues("renewed").Inc()
		s.m.kaLatency.Observe(clk.Since(sentAt).Seconds())
		*bo = s.cfg.Backoff
		st.renew(sentAt, resp.GetTtl().AsDuration())
		select {
		case s.extendWake <- struct{}{}:
		default:
		}
		return sentAt.Add(s.cfg.Jitter(interval))
	case sessionRefused(ref), status.Code(err) == codes.PermissionDenied:
		s.m.keepalives.WithLabelValues("refused").Inc()
		reason, detail := refusalReason(ref), ref.GetMessage()
		if ref == nil {
			reason, detail = "permission_denied", err.Error()
		}
		s.lose(st, reason, detail)
	default:
		s.m.keepalives.WithLabelValues("error").Inc()
		// The admin never sheds keepalives (admission.go); should one
		// ask anyway, its delay is honoured: the fence below does not
		// depend on it.
		retry := s.m.retryWait("keepalive", err, bo)
		s.log.Warn("session keepalive failed; retrying", "session_id", st.id, "err", errors.Join(err, refusalErr(ref)), "retry_in", retry, "fence_in", st.window().until.Sub(clk.Now()))
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

// release gives back one lease of session id.
func (s *sessions) release(ctx context.Context, sessionID uint64, mailboxID string) (*adminv1.MailboxLeaseResult, uint64, error) {
	resp, err := s.cfg.Sessions.ReleaseLeases(ctx, &adminv1.ReleaseLeasesRequest{ProxyId: s.cfg.ProxyID, SessionId: sessionID, MailboxIds: []string{mailboxID}})
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
	resp, err := s.cfg.Sessions.CloseSession(ctx, &adminv1.CloseSessionRequest{ProxyId: s.cfg.ProxyID, SessionId: st.id})
	if err != nil {
		return st.id, 0, fmt.Errorf("close session %d: %w", st.id, err)
	}
	s.end(st, "closed", "closed at shutdown")
	s.log.Info("session closed", "session_id", st.id, "closed", resp.GetClosed(), "leases", resp.GetLeasesReleased(), "index", resp.GetIndex())
	return st.id, resp.GetLeasesReleased(), nil
}
