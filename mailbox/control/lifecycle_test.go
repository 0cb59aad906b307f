package control

import (
	"errors"
	"testing"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// TestTransitions pins the whole lifecycle: every (state, event) pair is
// either one of these transitions or refused, so a transition added or
// dropped by accident fails here.
func TestTransitions(t *testing.T) {
	t.Parallel()
	type pair struct {
		from state
		on   event
	}
	allowed := map[pair]state{
		{stateOpening, evPrepared}:      stateOpen,
		{stateOpening, evPrepareFailed}: stateClosed,

		{stateOpen, evOpen}:     stateOpen,
		{stateOpen, evActivate}: stateActive,
		{stateOpen, evFence}:    stateOpen,
		{stateOpen, evDrain}:    stateOpen,
		{stateOpen, evClose}:    stateClosed,

		{stateActive, evOpen}:     stateActive,
		{stateActive, evActivate}: stateActive,
		{stateActive, evExtend}:   stateActive,
		{stateActive, evFence}:    stateFenced,
		{stateActive, evDrain}:    stateDrained,
		{stateActive, evClose}:    stateClosed,

		{stateDrained, evOpen}:     stateDrained,
		{stateDrained, evActivate}: stateActive,
		{stateDrained, evExtend}:   stateDrained,
		{stateDrained, evFence}:    stateFenced,
		{stateDrained, evDrain}:    stateDrained,
		{stateDrained, evClose}:    stateClosed,

		{stateFenced, evOpen}:     stateFenced,
		{stateFenced, evActivate}: stateActive,
		{stateFenced, evFence}:    stateFenced,
		{stateFenced, evDrain}:    stateFenced,
		{stateFenced, evClose}:    stateClosed,

		{stateClosed, evFence}: stateClosed,
		{stateClosed, evDrain}: stateClosed,
		{stateClosed, evClose}: stateClosed,
	}
	for from := range numStates {
		for on := range numEvents {
			t.Run(from.String()+"/"+on.String(), func(t *testing.T) {
				to, err := next(from, on)
				want, ok := allowed[pair{from, on}]
				if !ok {
					var refused *refusedError
					if !errors.As(err, &refused) || refused.from != from || refused.on != on {
						t.Fatalf("next = %v, %v; want refused", to, err)
					}
					if to != from {
						t.Fatalf("refused, yet moved to %v", to)
					}
					return
				}
				if err != nil || to != want {
					t.Fatalf("next = %v, %v; want %v", to, err, want)
				}
			})
		}
	}
	for _, bad := range []pair{{-1, evOpen}, {numStates, evClose}, {stateOpen, numEvents}} {
		if _, err := next(bad.from, bad.on); err == nil {
			t.Errorf("next(%v, %v) accepted an unknown state or event", bad.from, bad.on)
		}
	}
}

// TestWireStates: what MailboxStatus reports for each state, the rule the
// sidecar reads (only ACTIVE at the lease's epoch counts as held).
func TestWireStates(t *testing.T) {
	t.Parallel()
	want := map[state]struct {
		st      runnerv1.MailboxState
		drained bool
		serving bool
	}{
		stateOpening: {runnerv1.MailboxState_MAILBOX_STATE_OPEN, false, false},
		stateOpen:    {runnerv1.MailboxState_MAILBOX_STATE_OPEN, false, false},
		stateActive:  {runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, false, true},
		stateDrained: {runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, true, true},
		stateFenced:  {runnerv1.MailboxState_MAILBOX_STATE_FENCED, false, false},
		stateClosed:  {runnerv1.MailboxState_MAILBOX_STATE_UNSPECIFIED, false, false},
	}
	for s := range numStates {
		w, ok := want[s]
		if !ok {
			t.Errorf("state %v: no expected wire state; add it here", s)
			continue
		}
		st, drained := s.wire()
		if st != w.st || drained != w.drained || s.serving() != w.serving {
			t.Errorf("%v: wire %v drained=%v serving=%v, want %v %v %v", s, st, drained, s.serving(), w.st, w.drained, w.serving)
		}
	}
}
