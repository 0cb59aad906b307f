package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

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

// worker owns one mailbox's lease (docs/architecture.md#the-sidecar). It
// knows the agent only through what it is handed: the settings, the
// metrics, the runner's client and the session.
type worker struct {
	cfg  *Config
	m    *metrics
	rn   *runnerClient
	sess *sessions
	// halt is done once the agent's stop began (lifecycle).
	halt context.Context
	// closed tells the agent that the worker finished closing its mailbox.
	closed func(*worker)

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
	defer w.sess.unexpect(w.id)
	if w.prev != nil {
		select {
		case <-w.prev.done:
		case <-w.ctx.Done():
		}
	}
	// A runner given up on (runnerGone) is opened again before the next
	// acquire: the lease is only asked for once the runner answers.
	for w.ctx.Err() == nil && w.openInRunner() {
		mode, ok := w.sess.leaseMode(w.ctx)
		for ok && w.ctx.Err() == nil {
			end := leaseEnded
			var l *adminv1.Lease
			var v validity
			if l, v, ok = w.acquireLease(mode); ok {
				end = w.hold(l, v)
			}
			// giveUp marks every way it was reached, a failed
			// activation's too; reading it also clears it.
			if gaveUp := w.reopening(); gaveUp || end == runnerGone {
				break
			}
		}
	}
	if w.stopMode() == stopUnassign && w.unassign() {
		w.closed(w)
	}
}

// acquireLease asks for the lease in mode until granted: the lease and
// what it is valid by; false if the worker was stopped first.
func (w *worker) acquireLease(mode LeaseMode) (*adminv1.Lease, validity, bool) {
	if mode == LeaseModeSession {
		r, ok := w.acquireSession()
		if !ok {
			return nil, nil, false
		}
		return r.lease, sessionLease{s: w.sess, st: r.st, w: w, epoch: r.lease.GetEpoch()}, true
	}
	l, sentAt, ok := w.acquire()
	if !ok {
		return nil, nil, false
	}
	return l, newMailboxLease(w, l, sentAt), true
}

// reopening reports, once, that giveUp gave the lease back.
func (w *worker) reopening() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.reopen
	w.reopen = false
	return r
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

// roleChanged wakes the worker's hold loop after setRole changed the role.
func (w *worker) roleChanged() <-chan struct{} { return w.roleCh }
