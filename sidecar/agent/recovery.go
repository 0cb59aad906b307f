package agent

import (
	"context"
	"maps"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Peer recovery (docs/architecture.md#peer-recovery), the sidecar's part:
// the admin's placement says who copies from whom, the runners copy. The
// sidecar
//
//   - opens a move's destination (CATCHING_UP) with recover_from, the
//     assignment's recovery source, so the runner seeds the new mailbox
//     from the source's store instead of Kafka alone (recoverFrom), and a
//     mailbox assigned after an unplanned reassignment with the lost
//     mailbox's id (historyBefore), so the runner says what it lacks;
//   - keeps the runner's set of proxies allowed to fetch each mailbox
//     equal to its assignment's recovery_peers (allower): set when a move
//     toward another proxy starts, cleared when it ends, and set again
//     after every open, since a runner keeps the set in memory only;
//   - reports each mailbox's recovery in the proxy heartbeat
//     (reportRecovery), and a mailbox still copying with neither a known
//     lag nor stored positions, so the admin never switches a move to it.

// recoverFrom is the mailbox the runner should seed this one from: the
// assignment's recovery source while the worker's role is CATCHING_UP or
// REPLICA (docs/architecture.md#replicas), else nil. The runner takes it
// only for a mailbox with nothing stored, so handing it on a reopen (the
// runner restarted) changes nothing for a mailbox that already holds its
// copy.
func (w *worker) recoverFrom() *runnerv1.RecoverySource {
	src := w.assignment.GetRecoverySource()
	if role := w.view().Role; src == nil || role != adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP && role != adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA {
		return nil
	}
	return &runnerv1.RecoverySource{MailboxId: src.GetMailboxId(), Address: src.GetAddress()}
}

// historyBefore is the mailbox whose history this one lacks unless it holds
// data of its own (docs/architecture.md#moves): the assignment's prior
// mailbox while the worker's role is SERVING, else empty. A move's
// destination is opened CATCHING_UP and copies its source (recoverFrom),
// or says its history is incomplete when it cannot.
func (w *worker) historyBefore() string {
	if w.view().Role != adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING {
		return ""
	}
	return w.assignment.GetPriorMailboxId()
}

// allower keeps the runner's recovery peers of every assigned mailbox
// (AllowRecovery) equal to what the assignments name. The runner forgets a
// mailbox's set when it closes or restarts, so every successful open of a
// mailbox (heardRunner.OpenMailbox) makes the set unknown and sends it
// again. A call that fails is retried after the backoff.
type allower struct {
	mu sync.Mutex
	// want holds each assigned mailbox's peers (nil: none).
	want map[string][]string
	// sent holds what the runner acknowledged since the mailbox's last
	// open; absent: nothing, which for a runner is an empty set.
	sent map[string][]string
	kick chan struct{}
}

func newAllower() *allower {
	return &allower{want: map[string][]string{}, sent: map[string][]string{}, kick: make(chan struct{}, 1)}
}

func (al *allower) wake() {
	select {
	case al.kick <- struct{}{}:
	default:
	}
}

// set takes an assignment set's peers, by mailbox id; a mailbox left out
// is no longer assigned (its runner forgets it as it closes).
func (al *allower) set(want map[string][]string) {
	al.mu.Lock()
	defer al.mu.Unlock()
	al.want = want
	maps.DeleteFunc(al.sent, func(id string, _ []string) bool { _, ok := want[id]; return !ok })
	al.wake()
}

// opened notes that the runner opened mailbox id afresh: it allows nobody.
func (al *allower) opened(id string) {
	al.mu.Lock()
	defer al.mu.Unlock()
	delete(al.sent, id)
	al.wake()
}

// pending is the set to send of every mailbox whose runner set differs
// from its assignment's, by mailbox id.
func (al *allower) pending() map[string][]string {
	al.mu.Lock()
	defer al.mu.Unlock()
	out := map[string][]string{}
	for id, want := range al.want {
		if !slices.Equal(al.sent[id], want) {
			out[id] = want
		}
	}
	return out
}

// acked records that the runner took peers for id, unless the assignment
// or an open changed it meanwhile (the next pass sends it again).
func (al *allower) acked(id string, peers []string) {
	al.mu.Lock()
	defer al.mu.Unlock()
	if want, ok := al.want[id]; ok && slices.Equal(want, peers) {
		al.sent[id] = peers
	}
}

// allowRecovery sends the runner every set that differs from the
// assignments', at once when they or an open change it, retrying failures
// after the backoff, until ctx ends.
func (a *Agent) allowRecovery(ctx context.Context) {
	bo := a.cfg.Backoff
	for {
		failed := false
		pending := a.allow.pending()
		for _, id := range slices.Sorted(maps.Keys(pending)) {
			peers := pending[id]
			cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
			_, err := a.cfg.Runner.AllowRecovery(cctx, &runnerv1.AllowRecoveryRequest{MailboxId: id, ProxyIds: peers})
			cancel()
			switch {
			case err == nil:
				a.log.Info("recovery peers set", "mailbox_id", id, "peers", peers)
				a.allow.acked(id, peers)
			case ctx.Err() != nil:
				return
			case status.Code(err) == codes.NotFound:
				// Not open yet: its open sends the set (opened).
			case status.Code(err) == codes.Unimplemented:
				// A runner older than peer recovery serves no copy to
				// anyone, so there is nothing to allow.
				a.log.Info("runner does not do peer recovery; its mailbox is copied by nobody", "mailbox_id", id, "peers", peers)
				a.allow.acked(id, peers)
			default:
				a.log.Warn("setting the mailbox's recovery peers failed; retrying", "mailbox_id", id, "peers", peers, "err", err)
				failed = true
			}
		}
		if !failed {
			bo = a.cfg.Backoff
			select {
			case <-ctx.Done():
				return
			case <-a.allow.kick:
			}
			continue
		}
		t := a.cfg.Clock.NewTimer(bo.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.allow.kick:
		case <-t.C():
		}
		t.Stop()
	}
}

// peersOf is each assignment's recovery peers, by mailbox id.
func peersOf(want map[string]*adminv1.NamespaceAssignment) map[string][]string {
	out := make(map[string][]string, len(want))
	for id, as := range want {
		out[id] = slices.Clone(as.GetRecoveryPeers())
	}
	return out
}

// reportRecovery puts the runner's word on a mailbox's recovery into its
// heartbeat report. A mailbox still copying has ingested nothing of its
// own: whatever lag or positions the runner gives, it is reported with
// neither, so the admin's switch rules (stored positions, else lag) can
// never take it for caught up.
func reportRecovery(nh *adminv1.NamespaceHealth, r *runnerv1.RecoveryStatus) {
	if r == nil {
		return
	}
	nh.Recovery = &adminv1.RecoveryStatus{
		State:           recoveryState(r.GetState()),
		SourceMailboxId: r.GetSourceMailboxId(),
		BytesCopied:     r.GetBytesCopied(),
		EventsCopied:    r.GetEventsCopied(),
		StartedAt:       validTime(r.GetStartedAt()),
		FinishedAt:      validTime(r.GetFinishedAt()),
		HistoryComplete: r.GetHistoryComplete(),
		HistoryStartsAt: validTime(r.GetHistoryStartsAt()),
		Error:           truncate(r.GetError(), maxOpenErrorLen),
	}
	if nh.Recovery.State == adminv1.RecoveryState_RECOVERY_STATE_COPYING {
		nh.Lag, nh.LagKnown, nh.StoredPositions = 0, false, nil
	}
}

// recoveryState maps the runner's state onto the admin's; the two enums
// mirror each other, and a value this sidecar does not know is reported
// as not reported.
func recoveryState(s runnerv1.RecoveryState) adminv1.RecoveryState {
	switch s {
	case runnerv1.RecoveryState_RECOVERY_STATE_NONE:
		return adminv1.RecoveryState_RECOVERY_STATE_NONE
	case runnerv1.RecoveryState_RECOVERY_STATE_COPYING:
		return adminv1.RecoveryState_RECOVERY_STATE_COPYING
	case runnerv1.RecoveryState_RECOVERY_STATE_COPIED:
		return adminv1.RecoveryState_RECOVERY_STATE_COPIED
	case runnerv1.RecoveryState_RECOVERY_STATE_INCOMPLETE:
		return adminv1.RecoveryState_RECOVERY_STATE_INCOMPLETE
	}
	return adminv1.RecoveryState_RECOVERY_STATE_UNSPECIFIED
}

// validTime is t, or nil when malformed: the admin refuses a heartbeat
// carrying a malformed time, and one bad field must not cost the report.
func validTime(t *timestamppb.Timestamp) *timestamppb.Timestamp {
	if t.CheckValid() != nil {
		return nil
	}
	return t
}
