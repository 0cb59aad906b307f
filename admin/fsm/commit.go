package fsm

import adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

// CommitObserver is told of every command that changed the state, on every
// replica, in log order, after the change is in the state and outside the
// FSM's lock; a refused command or one that changed nothing is not
// reported. It runs on Raft's apply path, so it must not block: the admin's
// audit trail (admin/audit) only queues what it is given. Everything it
// receives is shared and must not be modified.
type CommitObserver interface {
	Committed(c Commit)
}

// Commit is one applied command and what it did.
type Commit struct {
	Index   uint64
	Term    uint64
	Command *adminv1.Command
	// Result is the command's answer, as Apply returns it.
	Result any
	// Granted are the leases the command granted, Removed those it
	// released or expired (a reconnect that replaced an epoch is only a
	// grant), Moves the moves it switched or abandoned.
	Granted []*adminv1.Lease
	Removed []*adminv1.LeaseRef
	Moves   []MoveEnd
}

// MoveEnd is a move's switch (Switched, with Reason) or abandonment (with
// Abandon).
type MoveEnd struct {
	Namespace string
	Switched  bool
	Reason    adminv1.MoveReason
	Abandon   adminv1.MoveAbandonReason
}

// WithCommitObserver reports every state change to o.
func WithCommitObserver(o CommitObserver) Option { return func(f *FSM) { f.commits = o } }

// commitOf is what tx did as a Commit for the observer.
func commitOf(tx *txn, cmd *adminv1.Command, res any) Commit {
	c := Commit{Index: tx.index, Term: tx.term, Command: cmd, Result: res}
	for _, e := range tx.events {
		switch {
		case e.granted != nil:
			c.Granted = append(c.Granted, e.granted)
		case e.opened == nil && e.closed == 0:
			c.Removed = append(c.Removed, &adminv1.LeaseRef{MailboxId: e.mailboxID, Epoch: e.epoch})
		}
	}
	for _, m := range tx.moveEvents {
		c.Moves = append(c.Moves, MoveEnd{Namespace: m.namespace, Switched: m.switched, Reason: m.reason, Abandon: m.abandon})
	}
	return c
}
