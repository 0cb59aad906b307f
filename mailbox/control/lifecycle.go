package control

import (
	"fmt"

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
