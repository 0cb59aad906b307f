package runner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/store"
)

// mailbox is one mailbox the runner serves: its store, the ingest feeding
// it and its retention, under the lease it is served under (lease.go).
type mailbox struct {
	cfg MailboxConfig
	// store and ingest are swapped once, by a recovery that completes
	// (recovery.go): the copy's store replaces the empty one, and ingest,
	// nil until then, starts. Without recovery they are set before the
	// mailbox is published.
	store  atomic.Pointer[store.Store]
	reads  readGuard
	ingest atomic.Pointer[ingest.Ingester]
	lease
	// recovery is the peer recovery seeding the mailbox; nil when none
	// was asked or the mailbox held data of its own.
	recovery     *recovering
	stopRetain   context.CancelFunc
	retainExited chan struct{}
}

// Prepare opens mailbox mc's store ahead of Open, which then only starts
// consuming and serving: a lease-driven mailbox waits for the disk before
// its lease is acquired, not after. A prepared mailbox is neither consumed
// nor served; preparing it again does nothing.
func (r *Runner) Prepare(mc MailboxConfig) error {
	if err := validID(mc.ID); err != nil {
		return err
	}
	done, err := r.beginOpen(mc.ID)
	if err != nil {
		return fmt.Errorf("prepare %s: %w", mc.ID, err)
	}
	defer done()
	r.mu.RLock()
	_, prepared := r.prepared[mc.ID]
	_, open := r.mailboxes[mc.ID]
	r.mu.RUnlock()
	switch {
	case open:
		return fmt.Errorf("prepare %s: already open", mc.ID)
	case prepared:
		return nil
	}
	st, err := r.openMailboxStore(mc)
	if err != nil {
		return fmt.Errorf("prepare %s: %w", mc.ID, err)
	}
	if r.unlessClosed(func() { r.prepared[mc.ID] = st }) {
		// Before done: Close waits for this store too.
		return errors.Join(fmt.Errorf("prepare %s: %w", mc.ID, errRunnerClosed), st.Close())
	}
	return nil
}

// Discard closes the store of a prepared mailbox that will not be opened.
// Its data stays in the runner's store, as its consumer group's offsets stay
// in Kafka: a later open of the mailbox resumes where they both are.
func (r *Runner) Discard(id string) error {
	var st *store.Store
	var ok bool
	r.settled(id, func() {
		st, ok = r.prepared[id]
		delete(r.prepared, id)
		delete(r.failed, id)
	})
	if !ok {
		return nil
	}
	if err := st.Close(); err != nil {
		return fmt.Errorf("discard %s: %w", id, err)
	}
	return nil
}

// Open starts consuming mailbox mc's topics into its store (opening the
// store unless Prepare did) and serves it. Opening a mailbox that is already
// open is an error: its config might differ.
func (r *Runner) Open(mc MailboxConfig) error {
	if err := validID(mc.ID); err != nil {
		return err
	}
	if len(mc.Topics) == 0 {
		return fmt.Errorf("open %s: no topics", mc.ID)
	}
	done, err := r.beginOpen(mc.ID)
	if err != nil {
		return fmt.Errorf("open %s: %w", mc.ID, err)
	}
	defer done()
	r.mu.Lock()
	_, open := r.mailboxes[mc.ID]
	st := r.prepared[mc.ID]
	if !open {
		delete(r.prepared, mc.ID)
	}
	r.mu.Unlock()
	if open {
		return fmt.Errorf("open %s: already open", mc.ID)
	}
	mb, err := r.start(mc, st)
	if err != nil {
		return err
	}
	if r.unlessClosed(func() { r.mailboxes[mc.ID] = mb }) {
		// Before done: Close waits for this mailbox too.
		return errors.Join(fmt.Errorf("open %s: %w", mc.ID, errRunnerClosed), r.closeMailbox(mb))
	}
	r.log.Info("mailbox opened", "mailbox_id", mc.ID, "epoch", mc.Epoch, "topics", mc.Topics, "max_age", mc.MaxAge, "max_size", mc.MaxSize)
	return nil
}

// start opens mailbox mc's store unless st is the prepared one, starts its
// ingest and retention, and returns it unpublished.
func (r *Runner) start(mc MailboxConfig, st *store.Store) (*mailbox, error) {
	if st == nil {
		var err error
		if st, err = r.openMailboxStore(mc); err != nil {
			return nil, fmt.Errorf("open %s: %w", mc.ID, err)
		}
	}
	icfg := ingest.Config{
		MailboxID: mc.ID, Kafka: r.kafka, Topics: mc.Topics, Mode: mc.Mode, DeadLetterTopic: mc.DeadLetterTopic,
		BatchSize: r.cfg.BatchSize, BatchWait: r.cfg.BatchWait,
		DrainTimeout: r.cfg.ShutdownTimeout, Logger: r.log, Metrics: r.ingestM, Governor: r.governor,
	}
	if r.disk != nil {
		icfg.Space = r.disk
	}
	ctx, cancel := context.WithCancel(context.Background())
	mb := &mailbox{cfg: mc, stopRetain: cancel, retainExited: make(chan struct{})}
	mb.store.Store(st)
	mb.epoch.Store(mc.Epoch)
	rec, err := r.recoveryFor(mc, st)
	if err != nil {
		cancel()
		_ = st.Close()
		return nil, fmt.Errorf("open %s: %w", mc.ID, err)
	}
	if rec != nil {
		// Consumed only once the copy is in: recover starts ingest and
		// retention on the copy's store.
		mb.recovery = rec
		go func() {
			defer close(mb.retainExited)
			r.recover(ctx, mb, icfg)
		}()
		return mb, nil
	}
	if err := r.markHistoryBefore(mc, st); err != nil {
		cancel()
		_ = st.Close()
		return nil, fmt.Errorf("open %s: %w", mc.ID, err)
	}
	icfg.Start = seedPositions(st)
	ing, err := ingest.Start(icfg, leaseWriter{mb: mb, clock: r.cfg.Clock})
	if err != nil {
		cancel()
		_ = st.Close()
		return nil, fmt.Errorf("open %s: %w", mc.ID, err)
	}
	mb.ingest.Store(ing)
	go func() {
		defer close(mb.retainExited)
		r.retain(ctx, mb)
	}()
	return mb, nil
}

// retain runs mb's retention until ctx is done.
func (r *Runner) retain(ctx context.Context, mb *mailbox) {
	if mb.cfg.MaxAge > 0 || mb.cfg.MaxSize > 0 {
		mb.store.Load().RunRetention(ctx, r.cfg.RetentionInterval, r.cfg.Clock)
	}
}

// closeIngest stops mb's ingest, if it has one: a mailbox being recovered
// first ends its recovery, which may start one meanwhile (an import cut
// there resumes on the next open).
func (mb *mailbox) closeIngest() error {
	if mb.recovery != nil {
		mb.stopRetain()
		<-mb.retainExited
	}
	if ing := mb.ingest.Load(); ing != nil {
		return ing.Close()
	}
	return nil
}

// consuming reports whether mb's ingest is in a group session.
func (mb *mailbox) consuming() bool {
	ing := mb.ingest.Load()
	return ing != nil && ing.Consuming()
}

// CloseMailbox stops serving mailbox id at once (queries get NotFound from
// the moment it returns from the map), then stops consuming it, flushing and
// committing what was fetched, and closes its store. Serving stops first so a
// sidecar fencing a lost lease never has this runner answer for it again.
func (r *Runner) CloseMailbox(id string) error {
	var mb *mailbox
	var ok bool
	r.settled(id, func() {
		mb, ok = r.mailboxes[id]
		delete(r.mailboxes, id)
	})
	if !ok {
		return fmt.Errorf("close %s: %w", id, ErrNotOpen)
	}
	return r.closeMailbox(mb)
}

func (r *Runner) closeMailbox(mb *mailbox) error {
	errIngest := mb.closeIngest()
	mb.stopRetain()
	<-mb.retainExited
	mb.reads.close()
	errStore := mb.store.Load().Close()
	r.queryM.Forget(mb.cfg.ID)
	r.log.Info("mailbox closed", "mailbox_id", mb.cfg.ID, "epoch", mb.epoch.Load())
	if err := errors.Join(errIngest, errStore); err != nil {
		return fmt.Errorf("close %s: %w", mb.cfg.ID, err)
	}
	return nil
}

// Drain stops consuming mailbox id (stop fetching, flush, commit offsets, leave
// the consumer group) but keeps serving its queries; CloseMailbox ends it.
// A graceful shutdown drains before the lease is released.
func (r *Runner) Drain(id string) error {
	var mb *mailbox
	var ok bool
	r.settled(id, func() { mb, ok = r.mailboxes[id] })
	if !ok {
		return fmt.Errorf("drain %s: %w", id, ErrNotOpen)
	}
	if err := mb.closeIngest(); err != nil {
		return fmt.Errorf("drain %s: %w", id, err)
	}
	return nil
}
