package runner

import (
	"context"

	"github.com/prism-mesh/prism/mailbox/ingest"
)

// Status is what the runner knows of one mailbox it serves, as its own
// goroutines last recorded it: the consumer's session, lag and stored
// positions, the store's totals and the queries answered.
type Status struct {
	// Consuming: in an active consumer group session.
	Consuming bool
	// Lag is the records the consumer is behind its topics' high
	// watermarks, summed over its partitions (ingest.Ingester.Lag);
	// LagKnown is false until it has reported every partition.
	Lag      int64
	LagKnown bool
	// Positions are the stored positions per topic-partition, the offset
	// after the last durably stored record (ingest.Ingester.Positions);
	// nil until every partition has reported.
	Positions []ingest.Position
	// Events and Bytes are the store's totals; StoreKnown is false for a
	// store closed meanwhile.
	Events, Bytes int64
	StoreKnown    bool
	QueriesServed int64
	// Recovery is the mailbox's peer recovery and whether it holds its
	// whole history.
	Recovery RecoveryStatus
}

// Statuses is the status of every mailbox the runner serves. It holds the
// runner's lock once for all of them and reads, per mailbox, only what the
// mailbox's goroutines keep up to date (atomics, and locks held only for a
// counter update), never waiting on a store opening or a consumer starting
// or stopping. The sidecar's probe of a runner with a thousand mailboxes is
// bounded by a timeout, and while the cores are busy opening stores every
// lock wait is a trip through the scheduler's queue: one wait for the
// whole probe keeps it within that bound where a wait per mailbox would not.
func (r *Runner) Statuses() map[string]Status {
	r.mu.RLock()
	mbs := make(map[string]*mailbox, len(r.mailboxes))
	for id, mb := range r.mailboxes {
		mbs[id] = mb
	}
	r.mu.RUnlock()
	out := make(map[string]Status, len(mbs))
	for id, mb := range mbs {
		out[id] = r.status(mb)
	}
	return out
}

// Status is mailbox id's status as Statuses reports it; false if the runner
// does not serve id.
func (r *Runner) Status(id string) (Status, bool) {
	r.mu.RLock()
	mb, ok := r.mailboxes[id]
	r.mu.RUnlock()
	if !ok {
		return Status{}, false
	}
	return r.status(mb), true
}

func (r *Runner) status(mb *mailbox) Status {
	st := Status{Consuming: mb.consuming(), QueriesServed: r.queryM.Served(mb.cfg.ID), Recovery: mb.recoveryStatus()}
	if ing := mb.ingest.Load(); ing != nil {
		st.Lag, st.LagKnown = ing.Lag()
		st.Positions, _ = ing.Positions()
	}
	// The store itself, not the guarded view: its totals are an in-memory
	// copy read under a lock held for a pointer swap, safe on a closed
	// store, whereas the read guard waits for the queries of a closing one.
	if ms, err := mb.store.Load().Stats(context.Background()); err == nil {
		st.Events, st.Bytes, st.StoreKnown = ms.GetTotalEvents(), ms.GetTotalBytes(), true
	}
	return st
}
