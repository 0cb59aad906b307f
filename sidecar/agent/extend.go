package agent

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// heldMailbox is one mailbox the runner serves under a session's lease.
type heldMailbox struct {
	w     *worker
	st    *sessState
	epoch uint64
}

// probes asks the runner for the stats of every mailbox in one call every
// interval (jittered) and hands the answer to the workers: a probe of the
// runner's control API per sidecar, not per mailbox.
func (s *sessions) probes(ctx context.Context, interval time.Duration) {
	timeout := s.rn.probeTimeout(interval)
	// Until the first probe the runner counts as having answered now; each
	// worker counts from its own activation at the earliest.
	sil := newSilence(s.cfg.Clock.Now(), timeout, interval)
	for sleep(ctx, s.cfg.Clock, s.cfg.Jitter(interval)) {
		sentAt := s.cfg.Clock.Now()
		rctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := s.rn.GetStats(rctx, &runnerv1.GetStatsRequest{})
		cancel()
		if ctx.Err() != nil {
			return
		}
		sil.observe(sentAt, s.cfg.Clock.Now(), err, s.rn.heard())
		r := probeResult{sentAt: sentAt, silence: sil, err: err}
		if err == nil {
			r.mailboxes = make(map[string]*runnerv1.MailboxStatus, len(resp.GetMailboxes()))
			for _, m := range resp.GetMailboxes() {
				r.mailboxes[m.GetMailboxId()] = m
			}
		}
		s.board.publish(r)
	}
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
	bound := s.rn.bound()
	sentAt := s.cfg.Clock.Now()
	var vf time.Duration
	if len(held) > 0 {
		vf = st.window().until.Sub(sentAt)
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
	cctx, cancel := context.WithTimeout(ctx, min(s.cfg.RPCTimeout, vf))
	defer cancel()
	if !s.perMailboxExtend.Load() {
		resp, err := s.rn.ExtendMailboxes(cctx, &runnerv1.ExtendMailboxesRequest{Mailboxes: reqs})
		switch {
		case status.Code(err) == codes.Unimplemented:
			s.log.Info("the runner has no ExtendMailboxes (not upgraded); extending each mailbox on its own", "err", err)
			s.perMailboxExtend.Store(true)
		case err != nil:
			for i, h := range held {
				h.w.unanswered(before[i], sentAt, vf, err)
			}
			s.log.Warn("runner did not take the extensions", "session_id", st.id, "mailboxes", len(held), "err", err)
			return
		default:
			took := s.cfg.Clock.Now().Add(vf)
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
			if _, err := s.rn.ExtendMailbox(cctx, reqs[i]); err != nil {
				h.w.unanswered(before[i], sentAt, vf, err)
				h.w.log.Warn("runner did not take the extension", "epoch", h.epoch, "err", err)
				return
			}
			h.w.handed(s.cfg.Clock.Now().Add(vf))
		})
	}
	wg.Wait()
}

// sessionLease is a lease of a session (LeaseModeSession): valid as long
// as its session, renewed by the session's keepalives, judged by the
// session's probes, and extended in the runner with every other mailbox of
// the session after each keepalive (extendAll).
type sessionLease struct {
	s     *sessions
	st    *sessState
	w     *worker
	epoch uint64
}

var _ validity = sessionLease{}

func (l sessionLease) renewable() *renewable { return l.st.renewable }
func (l sessionLease) probes() *probeBoard   { return l.s.board }

// renewDue: the session's keepalives are its own loop's to send.
func (sessionLease) renewDue(time.Time) (time.Time, <-chan struct{}) { return time.Time{}, nil }

func (l sessionLease) serve() (unserve func()) {
	l.s.hold(l.w, l.st, l.epoch)
	return func() { l.s.unhold(l.w) }
}

// renewed: the session's extender extends every mailbox of it at once.
func (sessionLease) renewed(time.Time) {}
