package agent

import (
	"context"
	"strings"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"google.golang.org/protobuf/proto"
)

// watch follows WatchAssignments, reconnecting with backoff across the
// admin endpoints.
func (a *Agent) watch(ctx context.Context) {
	bo := a.cfg.Backoff
	for ctx.Err() == nil {
		a.m.watchConns.Inc()
		stream, err := a.cfg.Admin.WatchAssignments(ctx, &adminv1.WatchAssignmentsRequest{ProxyId: a.cfg.ProxyID})
		for err == nil {
			var msg *adminv1.WatchAssignmentsResponse
			if msg, err = stream.Recv(); err == nil {
				a.apply(msg)
				bo = a.cfg.Backoff
			}
		}
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("assignment watch broken; reconnecting", "err", err)
		if !sleep(ctx, a.cfg.Clock, bo.Step()) {
			return
		}
	}
}

// apply makes the workers match an assignment set. A set older than one
// already applied (from a lagging node after a reconnect) is ignored.
func (a *Agent) apply(msg *adminv1.WatchAssignmentsResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.life.stopping() {
		return
	}
	if msg.GetIndex() < a.lastIndex {
		a.log.Info("ignoring an older assignment set", "index", msg.GetIndex(), "applied_index", a.lastIndex)
		return
	}
	a.lastIndex = msg.GetIndex()
	a.nowhere = msg.GetNoPlaceableProxy()
	want := map[string]*adminv1.NamespaceAssignment{}
	for _, as := range msg.GetAssignments() {
		id := as.GetMailboxId()
		if id == "" {
			id = mesh.MailboxID{Namespace: as.GetNamespace(), Proxy: a.cfg.ProxyID}.String()
		}
		want[id] = as
	}
	a.allow.set(peersOf(want))
	for id, w := range a.workers {
		as, ok := want[id]
		if !ok || !proto.Equal(as.GetConfig(), w.assignment.GetConfig()) {
			a.log.Info("mailbox unassigned", "mailbox_id", id, "epoch", w.view().Epoch, "index", msg.GetIndex(), "reassigned_with_new_config", ok)
			w.stop(stopUnassign)
			delete(a.workers, id)
			a.closing[id] = w
			continue
		}
		// A role change alone (catching up to serving at a move's switch,
		// serving to handing off, back when a move is abandoned) keeps the
		// lease and the runner serving: the mailbox is what moves make
		// before they break.
		if prev := w.setRole(as.GetRole()); prev != as.GetRole() {
			a.log.Info("mailbox role changed", "mailbox_id", id, "from", roleName(prev), "to", roleName(as.GetRole()), "index", msg.GetIndex())
		}
	}
	var started []*worker
	for id, as := range want {
		if _, ok := a.workers[id]; ok {
			continue
		}
		a.log.Info("mailbox assigned", "mailbox_id", id, "namespace", as.GetNamespace(), "role", roleName(as.GetRole()), "index", msg.GetIndex())
		w := a.newWorker(id, as)
		// A worker still closing the same mailbox goes first: its close
		// and release must not land after this one's open and acquire.
		w.prev = a.closing[id]
		a.workers[id] = w
		started = append(started, w)
	}
	// The mailboxes assigned together are acquired together: one batch
	// waits for all of them but those still waiting for a close.
	for _, w := range started {
		if w.prev == nil {
			a.sess.expect(w.id)
		}
	}
	for _, w := range started {
		a.all.Go(w.run)
	}
	a.life.reach(phaseSynced)
	a.notifyLocked()
}

func runnerConfig(c *adminv1.NamespaceConfig) *runnerv1.MailboxConfig {
	return &runnerv1.MailboxConfig{
		Topics:          c.GetTopics(),
		ValidationMode:  runnerv1.ValidationMode(c.GetValidationMode()),
		MaxAgeMillis:    c.GetRetention().GetMaxAge().AsDuration().Milliseconds(),
		MaxSizeBytes:    c.GetRetention().GetMaxSizeBytes(),
		DeadLetterTopic: c.GetDeadLetterTopic(),
	}
}

// roleName is a role as a log value: "serving", "catching_up".
func roleName(r adminv1.AssignmentRole) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ASSIGNMENT_ROLE_"))
}

// newWorker makes the worker of mailbox id, assigned as as; its run starts
// it.
func (a *Agent) newWorker(id string, as *adminv1.NamespaceAssignment) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	return &worker{
		cfg: &a.cfg, m: a.m, rn: a.rn, sess: a.sess, halt: a.life.halt, closed: a.closed,
		id: id, assignment: as, ctx: ctx, cancel: cancel, done: make(chan struct{}), roleCh: make(chan struct{}, 1),
		log:      a.log.With("mailbox_id", id),
		assigned: a.cfg.Clock.Now(),
		v:        LeaseView{MailboxID: id, Namespace: as.GetNamespace(), State: StateOpening, Role: as.GetRole()},
	}
}
