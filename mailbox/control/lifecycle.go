package control

// The lifecycle of every mailbox on the runner is here, and only here: its
// states and the events each accepts (transitions), the entry that carries
// one mailbox's state with its epoch and lease deadline, what GetStats and
// Ready read of it (published), and the deadline that fences it, on the
// Server's injected clock. The runner (mailbox/runner) keeps no state of its
// own beyond what it hosts; the RPC handlers in control.go ask next, do the
// work on the runner, then store the new state under the entry's lock.

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/mailbox/runner"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// state is where one mailbox is in its lifecycle on this runner. The wire
// (runnerv1.MailboxState plus MailboxStatus.drained) shows a coarser view:
// see wire.
type state int

const (
	// stateOpening: recorded and its store opening. The entry is locked for
	// as long as it is in this state, so no other call ever sees it.
	stateOpening state = iota
	// stateOpen: store open, waiting for a lease epoch; neither consumed
	// nor served.
	stateOpen
	// stateActive: consumed and served under the entry's epoch.
	stateActive
	// stateDrained: served under its epoch, no longer consumed (offsets
	// committed); Close ends it, or an activation (a new sidecar that
	// re-acquired the lease) makes it consume again.
	stateDrained
	// stateFenced: neither consumed nor served because the lease may be
	// lost; the record and the data are kept for a re-activation.
	stateFenced
	// stateClosed: gone from the runner; a caller that waited on the
	// entry's lock finds it here and must not touch the host for it.
	stateClosed
	numStates
)

func (s state) String() string {
	switch s {
	case stateOpening:
		return "opening"
	case stateOpen:
		return "open"
	case stateActive:
		return "active"
	case stateDrained:
		return "drained"
	case stateFenced:
		return "fenced"
	case stateClosed:
		return "closed"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// wire is s as MailboxStatus reports it. A closed mailbox has no wire state:
// only a call that raced its close can report one.
func (s state) wire() (st runnerv1.MailboxState, drained bool) {
	switch s {
	case stateOpening, stateOpen:
		return runnerv1.MailboxState_MAILBOX_STATE_OPEN, false
	case stateActive:
		return runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, false
	case stateDrained:
		return runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, true
	case stateFenced:
		return runnerv1.MailboxState_MAILBOX_STATE_FENCED, false
	}
	return runnerv1.MailboxState_MAILBOX_STATE_UNSPECIFIED, false
}

// serving reports whether the runner answers queries for the mailbox.
func (s state) serving() bool { return s == stateActive || s == stateDrained }

// event is what happens to a mailbox: an RPC of the control API, the store
// opening, or the lease deadline passing (which fences).
type event int

const (
	evPrepared      event = iota // the store opened
	evPrepareFailed              // the store failed to open
	evOpen                       // OpenMailbox again, with the same config: a retry
	evActivate                   // ActivateMailbox, or OpenMailbox with an epoch
	evExtend                     // ExtendMailbox
	evFence                      // FenceMailbox, or the deadline passed
	evDrain                      // Drain
	evClose                      // CloseMailbox
	numEvents
)

func (e event) String() string {
	switch e {
	case evPrepared:
		return "prepared"
	case evPrepareFailed:
		return "prepare failed"
	case evOpen:
		return "open"
	case evActivate:
		return "activate"
	case evExtend:
		return "extend"
	case evFence:
		return "fence"
	case evDrain:
		return "drain"
	case evClose:
		return "close"
	}
	return fmt.Sprintf("event(%d)", int(e))
}

// transitions is the whole lifecycle: for each state, the events it accepts
// and the state each one leads to; any other pair is refused. The stopping
// events (fence, drain, close) are idempotent: where there is nothing to
// stop they lead back to the same state. The starting ones (open, activate,
// extend) need a mailbox that is still there.
var transitions = [numStates]map[event]state{
	stateOpening: {
		evPrepared:      stateOpen,
		evPrepareFailed: stateClosed,
	},
	stateOpen: {
		evOpen:     stateOpen,
		evActivate: stateActive,
		evFence:    stateOpen,
		evDrain:    stateOpen,
		evClose:    stateClosed,
	},
	stateActive: {
		evOpen:     stateActive,
		evActivate: stateActive, // a retry, or the same holder's newer epoch
		evExtend:   stateActive,
		evFence:    stateFenced,
		evDrain:    stateDrained,
		evClose:    stateClosed,
	},
	stateDrained: {
		evOpen:     stateDrained,
		evActivate: stateActive, // a new sidecar after a drain: consuming again
		evExtend:   stateDrained,
		evFence:    stateFenced,
		evDrain:    stateDrained,
		evClose:    stateClosed,
	},
	stateFenced: {
		evOpen:     stateFenced,
		evActivate: stateActive, // re-acquired: the same store reopens
		evFence:    stateFenced,
		evDrain:    stateFenced,
		evClose:    stateClosed,
	},
	stateClosed: {
		evFence: stateClosed,
		evDrain: stateClosed,
		evClose: stateClosed,
	},
}

// refusedError is a (state, event) pair the lifecycle does not allow.
type refusedError struct {
	from state
	on   event
}

func (r *refusedError) Error() string {
	return fmt.Sprintf("mailbox is %s, which refuses %s", r.from, r.on)
}

// next is the state event on leads to from state from, or a *refusedError.
// It only decides: the caller does the work the transition stands for and
// then stores the new state, under the entry's lock.
func next(from state, on event) (state, error) {
	if from >= 0 && from < numStates {
		if to, ok := transitions[from][on]; ok {
			return to, nil
		}
	}
	return from, &refusedError{from: from, on: on}
}

// entry is one mailbox; its mu orders the transitions of that mailbox
// without holding up the others.
type entry struct {
	mu  sync.Mutex
	id  string
	cfg *runnerv1.MailboxConfig
	// recover is the live mailbox to seed this one from (the last
	// OpenMailbox's recover_from), used when the runner opens it.
	recover *runnerv1.RecoverySource
	// historyBefore is the mailbox that held the namespace's history before
	// this one (the last OpenMailbox's history_before), used likewise.
	historyBefore string
	state         state
	epoch         uint64

	deadline    time.Time   // while serving: when the runner fences by itself
	timer       clock.Timer // fires at deadline
	gen         uint64      // tells a stale timer from the current one
	fenceReason string

	// pub is the lifecycle above as of the last transition, published
	// under mu before mu is released; never nil once e is in the map.
	pub atomic.Pointer[published]
}

// published is an entry's lifecycle as GetStats and Ready read it, without
// the entry's lock.
type published struct {
	state       state
	epoch       uint64
	fenceReason string
	deadline    time.Time
	// busy: a call on the runner that may take long (opening a store,
	// starting or stopping a consumer) is in progress under the entry's
	// lock; the rest is from before it.
	busy bool
}

// publishLocked publishes e's lifecycle and returns it; e.mu must be held.
func (e *entry) publishLocked(busy bool) *published {
	p := &published{state: e.state, epoch: e.epoch, fenceReason: e.fenceReason, deadline: e.deadline, busy: busy}
	e.pub.Store(p)
	return p
}

// slowLocked publishes e's present lifecycle as busy until the returned
// func publishes it anew, around a call on the runner that may take long;
// e.mu must be held throughout.
func (e *entry) slowLocked() (done func()) {
	e.publishLocked(true)
	return func() { e.publishLocked(false) }
}

// setDeadlineLocked moves e's deadline d from now, or to bound if that
// is earlier (validity), the runner's own check of it at every request and
// the self-fencing timer. A deadline the runner holds as passed is not
// moved, nor is one whose bound has passed: the call is late (queued while
// the process was paused past it, its timer yet to run), so e is fenced now
// instead.
func (s *Server) setDeadlineLocked(e *entry, d time.Duration, bound *runnerv1.BoottimeBound) error {
	var err error
	if d = s.validity(d, bound); d > 0 {
		err = s.host.SetValidFor(e.id, d)
	} else {
		err = fmt.Errorf("set valid for %s: %w: its bound on the boot clock passed %s ago", e.id, runner.ErrDeadlinePassed, -d)
	}
	if err != nil {
		if ferr := s.fenceLocked(e, "deadline_passed"); ferr != nil {
			s.log.Error("deadline passed", "mailbox_id", e.id, "err", ferr)
		}
		return err
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	e.gen++
	gen, id := e.gen, e.id
	e.deadline = s.clock.Now().Add(d)
	// The fake clock runs AfterFunc callbacks under its own lock, and
	// fencing reads the clock: hand the work to a goroutine.
	e.timer = s.clock.AfterFunc(d, func() { go s.deadlinePassed(id, gen) })
	return nil
}

// validity is how long from now the runner may act on a call granting d
// from its receipt: d, cut to the call's bound when the runner reads the
// same boot clock as the sender (the sidecar of the same pod). Without a
// bound, or under another boot, it is d. Not positive: the bound passed
// while the call waited (a paused runner).
func (s *Server) validity(d time.Duration, bound *runnerv1.BoottimeBound) time.Duration {
	if bound.GetBootId() == "" {
		return d
	}
	now, ok := s.boot()
	if !ok || now.BootID != bound.GetBootId() {
		return d
	}
	return min(d, time.Duration(bound.GetValidUntilBoottime())-now.Since)
}

func (s *Server) deadlinePassed(id string, gen uint64) {
	s.mu.Lock()
	e, ok := s.mailboxes[id]
	s.mu.Unlock()
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gen != gen {
		return
	}
	if err := s.fenceLocked(e, "deadline_passed"); err != nil {
		s.log.Error("deadline passed", "mailbox_id", id, "err", err)
	}
}

// fenceLocked stops serving and consuming e if it is served; fencing a
// mailbox that is not is a no-op.
func (s *Server) fenceLocked(e *entry, reason string) error {
	to, err := next(e.state, evFence)
	if err != nil || to == e.state {
		return err
	}
	defer e.slowLocked()()
	start := s.clock.Now()
	if e.timer != nil {
		e.timer.Stop()
	}
	closeErr := s.host.CloseMailbox(e.id)
	// Whatever the drain reported, the mailbox is no longer served or
	// consumed: CloseMailbox unpublishes it before anything else.
	e.state, e.fenceReason = to, reason
	s.fences.WithLabelValues(reasonLabel(reason)).Inc()
	s.log.Warn("mailbox fenced: stopped consuming and serving", "mailbox_id", e.id, "epoch", e.epoch, "reason", reason, "took", s.clock.Since(start), "err", closeErr)
	return nil
}
