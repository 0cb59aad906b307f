package agent

import (
	"context"
	"slices"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// maxBatch is the most mailboxes one AcquireLeases may name (the admin's
// bulk quota).
const maxBatch = 10000

// batchLinger bounds how long queued acquires wait for the mailboxes
// expected with them whose runner open failed and is being retried.
const batchLinger = time.Second

// acqResult is one mailbox's answer in an AcquireLeases batch.
type acqResult struct {
	lease   *adminv1.Lease
	refusal *adminv1.LeaseRefusal
	st      *sessState
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
		s.queued = s.cfg.Clock.Now()
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

// batches sends the queued acquires, all of them in one AcquireLeases,
// once no mailbox expected to ask is still on its way; an acquire that
// fails is sent again with backoff, with whatever has queued meanwhile.
func (s *sessions) batches(ctx context.Context) {
	bo := s.cfg.Backoff
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
			if wait := queued.Add(batchLinger).Sub(s.cfg.Clock.Now()); retrying > 0 && wait > 0 {
				t := s.cfg.Clock.NewTimer(wait)
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
				bo = s.cfg.Backoff
				continue
			}
			if !sleep(ctx, s.cfg.Clock, s.m.retryWait("acquire_leases", err, &bo)) {
				return
			}
		}
	}
}

// send makes one AcquireLeases call in st of up to maxBatch queued
// mailboxes and hands each its answer; the call's error if it failed (the
// mailboxes stay queued).
func (s *sessions) send(ctx context.Context, st *sessState) error {
	if !s.cfg.Clock.Now().Before(st.window().until) {
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
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
	resp, err := s.cfg.Sessions.AcquireLeases(cctx, &adminv1.AcquireLeasesRequest{ProxyId: s.cfg.ProxyID, SessionId: st.id, MailboxIds: ids})
	cancel()
	s.m.batches.Inc()
	switch {
	case err != nil:
		s.m.acquires.WithLabelValues("error").Add(float64(len(ids)))
		if ctx.Err() == nil {
			s.log.Warn("acquire batch failed; retrying", "session_id", st.id, "mailboxes", len(ids), "err", err)
		}
		return err
	case resp.GetRefusal() != nil:
		s.m.acquires.WithLabelValues("refused").Add(float64(len(ids)))
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
	s.m.acquires.WithLabelValues("granted").Add(float64(granted))
	s.m.acquires.WithLabelValues("refused").Add(float64(len(resp.GetResults()) - granted))
	s.log.Info("leases acquired in one batch", "session_id", st.id, "asked", len(ids), "granted", granted, "still_expected", expected, "index", resp.GetIndex())
	if len(orphans) > 0 {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
		_, err := s.cfg.Sessions.ReleaseLeases(cctx, &adminv1.ReleaseLeasesRequest{ProxyId: s.cfg.ProxyID, SessionId: st.id, MailboxIds: orphans})
		cancel()
		s.log.Info("released the leases granted to mailboxes no longer asking", "session_id", st.id, "mailboxes", orphans, "err", err)
	}
	return nil
}

// acquireSession asks for the lease in the next batch until granted; false
// if the worker was stopped.
func (w *worker) acquireSession() (acqResult, bool) {
	bo := w.cfg.Backoff
	var lastRefusal adminv1.LeaseRefusalReason
	for {
		r, ok := w.sess.acquire(w.ctx, w.id)
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
		if !sleep(w.ctx, w.cfg.Clock, bo.Step()) {
			return acqResult{}, false
		}
	}
}
