package agent

import (
	"context"
	"sync/atomic"
)

// phase is how far the agent has come in starting.
type phase int32

const (
	// The zero phase is starting: the proxy is not registered yet.
	_ phase = iota
	// phaseRegistered: RegisterProxy was answered once; the sidecar is
	// alive (Healthy) from then on, even cut off from the admin, since it
	// fences by itself (docs/architecture.md#client-side-stop).
	phaseRegistered
	// phaseSynced: an assignment set was applied, so the workers are the
	// ones the admin asks for and Ready may judge their leases.
	phaseSynced
)

// lifecycle is the one owner of the agent's lifecycle state: the furthest
// phase it reached, and whether its stop (Shutdown) began. The stop is
// final and keeps the phase reached before it, so a stopping sidecar is
// still alive while it drains and releases.
type lifecycle struct {
	reached atomic.Int32
	// halt is done once the stop began: an unassigned mailbox waiting out
	// its runner's deadline, or a drain, stops waiting, and leaves the
	// rest to the stop.
	halt   context.Context
	halted context.CancelFunc
}

func newLifecycle() *lifecycle {
	l := &lifecycle{}
	l.halt, l.halted = context.WithCancel(context.Background())
	return l
}

// reach records that the agent came to p; true the first time.
func (l *lifecycle) reach(p phase) bool {
	for {
		cur := l.reached.Load()
		if phase(cur) >= p {
			return false
		}
		if l.reached.CompareAndSwap(cur, int32(p)) {
			return true
		}
	}
}

// has reports whether the agent came to p.
func (l *lifecycle) has(p phase) bool { return phase(l.reached.Load()) >= p }

// stop begins the stop; it is final.
func (l *lifecycle) stop() { l.halted() }

// stopping reports whether the stop began.
func (l *lifecycle) stopping() bool { return l.halt.Err() != nil }
