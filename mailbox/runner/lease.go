package runner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// The lease guard: the runner's own fencing of a mailbox by the lease it is
// served under, whatever its control API was told last. Its epoch is what
// queries and stats report (docs/architecture.md#fencing-epochs), and its
// deadline is checked at every query and every store write, not only by the
// timer of mailbox/control that fences: a runner paused past the deadline
// (SIGSTOP, a frozen container) serves the requests queued meanwhile, and
// writes what it had fetched, before its timers run
// (docs/architecture.md#client-side-stop).

// ErrDeadlinePassed refuses to move a mailbox's lease deadline once it has
// passed (SetValidFor).
var ErrDeadlinePassed = errors.New("lease deadline passed")

// lease is the lease a mailbox is served under.
type lease struct {
	epoch atomic.Uint64
	// until is the lease's deadline (SetValidFor); nil: none, served until
	// closed.
	until atomic.Pointer[time.Time]
}

// expired reports whether the lease's deadline has passed at now.
func (l *lease) expired(now time.Time) bool {
	until := l.until.Load()
	return until != nil && !now.Before(*until)
}

// extend moves the deadline to d after now, unless the one it holds has
// passed: that is final, since a call that would move it was late.
func (l *lease) extend(now time.Time, d time.Duration) error {
	if l.expired(now) {
		return fmt.Errorf("%w at %s", ErrDeadlinePassed, l.until.Load().Format(time.RFC3339Nano))
	}
	until := now.Add(d)
	l.until.Store(&until)
	return nil
}

// SetEpoch records the lease epoch mailbox id is served under; queries and
// stats then report it.
func (r *Runner) SetEpoch(id string, epoch uint64) error {
	var ok bool
	r.settled(id, func() {
		var mb *mailbox
		if mb, ok = r.mailboxes[id]; ok {
			mb.epoch.Store(epoch)
		}
	})
	if !ok {
		return fmt.Errorf("set epoch %s: %w", id, ErrNotOpen)
	}
	return nil
}

// SetValidFor has mailbox id served only for d from now, on the runner's
// clock: past that, queries find it not open and its ingest stores nothing
// more (leaseWriter), whether or not the fence that should follow has run.
// A deadline that has passed is final (ErrDeadlinePassed): a call that
// would move it was late, perhaps queued across a pause, and only a new
// Open serves the mailbox again.
func (r *Runner) SetValidFor(id string, d time.Duration) error {
	var err error
	r.settled(id, func() {
		mb, ok := r.mailboxes[id]
		if !ok {
			err = ErrNotOpen
			return
		}
		err = mb.extend(r.cfg.Clock.Now(), d)
	})
	if err != nil {
		return fmt.Errorf("set valid for %s: %w", id, err)
	}
	return nil
}

// leaseWriter is a mailbox's store as its ingest writes it: refused once the
// lease deadline has passed (SetValidFor), so that a runner paused past it
// stores, marks and commits nothing it fetched after: the next holder
// consumes that from the committed offsets. The refusal wraps
// context.DeadlineExceeded, which ingest takes for the store's failure, not
// the records' (never dead-lettered): the batch is retried until the fence
// closes the ingest, and left uncommitted.
type leaseWriter struct {
	mb    *mailbox
	clock clock.PassiveClock
}

func (w leaseWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	if w.mb.expired(w.clock.Now()) {
		return store.WriteResult{}, fmt.Errorf("mailbox %s: %w, nothing stored past it: %w", w.mb.cfg.ID, ErrDeadlinePassed, context.DeadlineExceeded)
	}
	return w.mb.store.Load().Write(ctx, items)
}
