package agent

import (
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// handoff is what a hold loop did to the runner for the worker's role: at a
// move's switch the source's mailbox becomes HANDING_OFF and stops ingesting
// (the runner drains it: flushes, commits, keeps serving), so its answers
// during the tail never hold records stored after the switch, which the
// destination, ingesting on, passes within a batch (the trade-off is in
// docs/architecture.md#moves). If the tail's proxy gets
// the namespace back (an unplanned reassignment: HANDING_OFF to SERVING),
// the mailbox is activated again and ingests.
type handoff struct {
	drained bool // this hold drained the mailbox for a handoff tail
}

// followRole brings the runner in line with the worker's role; false if the
// activation it needed did not happen before until() or the worker stopped
// (the lease is then over on this side, as for any activation). A drain the
// runner refuses is logged and tried again at the next call: the mailbox
// then keeps ingesting, as a serving mailbox does.
func (w *worker) followRole(h *handoff, epoch uint64, until func() time.Time) bool {
	handingOff := w.view().Role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF
	switch {
	case handingOff && !h.drained:
		ctx, cancel := w.runnerCtx()
		_, err := w.rn.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{w.id}})
		cancel()
		if err != nil {
			w.log.Warn("runner did not stop ingesting for the handoff tail; it ingests on", "epoch", epoch, "err", err)
			return true
		}
		h.drained = true
		w.log.Info("handing off: the runner stopped ingesting the mailbox and serves it until the tail ends", "epoch", epoch)
	case !handingOff && h.drained:
		w.log.Info("the namespace is back from its handoff tail: ingesting again", "epoch", epoch)
		if !w.activate(epoch, until) {
			return false
		}
		h.drained = false
	}
	return true
}
