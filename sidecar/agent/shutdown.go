package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Shutdown halts every worker, drains the runner, has it stop serving each
// mailbox and then releases every lease the workers held; Run calls it when
// its context ends.
func (a *Agent) Shutdown(ctx context.Context) error {
	start := a.cfg.Clock.Now()
	a.life.stop()
	a.mu.Lock()
	for _, w := range a.workers {
		w.stop(stopShutdown)
		a.stopped = append(a.stopped, w)
	}
	a.workers = map[string]*worker{}
	stopped := a.stopped
	a.mu.Unlock()
	done := make(chan struct{})
	go func() { a.all.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		a.log.Error("workers did not halt in time; draining anyway", "err", ctx.Err())
	}

	var errs []error
	// The runner stops consuming and commits before any lease goes, and
	// keeps answering queries until each mailbox is closed. With nothing
	// held there is nothing to drain: after the preStop hook's drain has
	// handed every namespace off, the kubelet stops a native sidecar only
	// once the runner has exited, so asking it would only fail.
	if len(stopped) > 0 {
		dctx, cancel := context.WithTimeout(ctx, remaining(ctx)*2/3)
		resp, err := a.cfg.Runner.Drain(dctx, &runnerv1.DrainRequest{})
		cancel()
		switch {
		case a.rn.gone(err):
			// It stopped consuming as it stopped (a runner's own stop
			// drains and commits; a killed one committed only what it
			// stored), and serves nothing: its leases go at once.
			a.log.Info("runner gone (its control API refuses connections): nothing to drain; releasing its leases", "err", err)
		case err != nil:
			a.log.Warn("runner drain failed; closing and releasing anyway", "err", err)
			errs = append(errs, fmt.Errorf("drain runner: %w", err))
		default:
			a.log.Info("runner drained", "mailboxes", resp.GetDrained())
		}
	}
	// The runner alone decides what it serves, so a lease goes only once
	// the runner stopped serving its mailbox: it closed (or fenced) it, or
	// the deadline it was handed has passed. A lease on its own (or of a
	// session already lost) is released right after its mailbox; the
	// leases of the current session wait for every mailbox of it, then one
	// CloseSession ends them all.
	cur := a.sess.current()
	inSession := func(v LeaseView) bool { return cur != nil && v.SessionID == cur.id }
	settled := make([]bool, len(stopped))
	relErrs := make([]error, len(stopped))
	var wg sync.WaitGroup
	for i, w := range stopped {
		wg.Go(func() {
			closed := w.closeInRunner(ctx, "shutdown")
			v := w.view()
			if v.Epoch == 0 {
				return
			}
			switch settled[i] = closed || w.outwait(ctx, "shutdown", v.Epoch); {
			case !settled[i]:
				relErrs[i] = fmt.Errorf("lease of %s not released: the runner did not confirm it stopped serving, and its deadline is past the stop: %w", w.id, ctx.Err())
			case !inSession(v):
				relErrs[i] = w.release(ctx, "shutdown", v.Epoch)
			}
		})
	}
	wg.Wait()
	var unsettled []string
	for i, w := range stopped {
		if v := w.view(); inSession(v) && !settled[i] {
			unsettled = append(unsettled, w.id)
		}
	}
	a.mu.Lock()
	for _, w := range a.closing {
		if inSession(w.view()) {
			unsettled = append(unsettled, w.id)
		}
	}
	a.mu.Unlock()
	if len(unsettled) == 0 {
		if err := a.closeSession(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if cur != nil {
		a.log.Error("session not closed: the runner may still serve some of its mailboxes; the other leases are released, the session expires after ttl + grace",
			"session_id", cur.id, "mailboxes", unsettled)
	}
	for i, w := range stopped {
		if v := w.view(); inSession(v) && settled[i] {
			if len(unsettled) == 0 {
				w.update(func(v *LeaseView) { v.State = StateFenced })
			} else {
				wg.Go(func() { relErrs[i] = w.release(ctx, "shutdown", v.Epoch) })
			}
		}
	}
	wg.Wait()
	errs = append(errs, relErrs...)
	a.log.Info("sidecar stopped", "took", a.cfg.Clock.Since(start), "leases", len(stopped))
	return errors.Join(errs...)
}

// closeSession closes the current session, if any: its leases end with
// it, or expire after ttl + grace if the close failed.
func (a *Agent) closeSession(ctx context.Context) error {
	id, n, err := a.sess.close(ctx)
	switch {
	case id == 0:
	case err != nil:
		a.log.Error("session close failed; its leases expire after ttl + grace", "session_id", id, "err", err)
		a.m.releases.WithLabelValues("shutdown", "error").Inc()
	default:
		a.m.releases.WithLabelValues("shutdown", "released").Add(float64(n))
	}
	return err
}

// sessionLeases counts the leases active in the current session.
func (a *Agent) sessionLeases() float64 {
	st := a.sess.current()
	if st == nil {
		return 0
	}
	n := 0
	for _, v := range a.Leases() {
		if v.SessionID == st.id && v.State == StateActive {
			n++
		}
	}
	return float64(n)
}

func remaining(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return 5 * time.Second
}
