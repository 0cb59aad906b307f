package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/recovery"
	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Peer recovery (docs/architecture.md#peer-recovery), the runner's part. As a source, the runner serves
// MailboxRecovery (recovery.Server) for the mailboxes it holds under a live lease to the proxies the sidecar
// allows (AllowRecovery, from the admin's placement). As a destination, a mailbox opened with a RecoverySource
// while it holds nothing is served (empty) but not consumed while recover copies the source into an import; once
// the copy is whole its store is swapped for the copy's and ingest starts at the copied stored positions
// (ingest.Config.Start). A copy given up falls back to Kafka from the oldest offset, and the mailbox's recovery
// record says its history is incomplete. A mailbox closed or drained mid-copy keeps its import on disk, and the
// next open resumes it.

// RecoverySource is a live mailbox to seed a new one from, and its runner's query address.
type RecoverySource struct {
	MailboxID string
	Address   string
}

// RecoveryState is where a mailbox's seeding is.
type RecoveryState int

const (
	// RecoveryNone: none was asked, or the mailbox held data of its own.
	RecoveryNone RecoveryState = iota
	// RecoveryCopying: the copy is in progress; the mailbox is not consumed.
	RecoveryCopying
	// RecoveryCopied: the mailbox was seeded by a copy.
	RecoveryCopied
	// RecoveryIncomplete: no copy could be had; the mailbox was built from Kafka.
	RecoveryIncomplete
)

// RecoveryStatus is a mailbox's peer recovery and whether it holds its whole history.
type RecoveryStatus struct {
	State  RecoveryState
	Source string
	// Bytes and Events copied (so far, while copying).
	Bytes, Events     int64
	Started, Finished time.Time
	// HistoryComplete is false when the mailbox, or the one it was copied from, fell back to Kafka;
	// HistoryStartsAt is then its oldest event (zero while it holds none).
	HistoryComplete bool
	HistoryStartsAt time.Time
	// Err is the copy's last error, once given up.
	Err string
}

// recovering is a mailbox's recovery in progress, or given up. mu guards src (its address may change:
// UpdateRecovery) and st.
type recovering struct {
	mu  sync.Mutex
	src RecoverySource
	st  RecoveryStatus
}

func (rc *recovering) source() RecoverySource {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.src
}

func (rc *recovering) update(fn func(*RecoveryStatus)) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	fn(&rc.st)
}

func (rc *recovering) status() RecoveryStatus {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.st
}

// recoveryStatus is mb's recovery as of now: its copy while in progress, otherwise what its store records.
func (mb *mailbox) recoveryStatus() RecoveryStatus {
	if mb.recovery != nil {
		if rs := mb.recovery.status(); rs.State == RecoveryCopying {
			rs.HistoryComplete = false
			return rs
		}
	}
	st := mb.store.Load()
	rec := st.Recovery()
	rs := RecoveryStatus{State: RecoveryNone, Source: rec.Source, Bytes: rec.Bytes, Events: rec.Events,
		Started: rec.Started, Finished: rec.Finished, HistoryComplete: !rec.Incomplete}
	switch {
	case rec.Copied:
		rs.State = RecoveryCopied
	case rec.Incomplete:
		rs.State = RecoveryIncomplete
	}
	if mb.recovery != nil {
		rs.Err = mb.recovery.status().Err
	}
	if !rs.HistoryComplete {
		if ms, err := st.Stats(context.Background()); err == nil && ms.GetOldestEvent() != nil {
			rs.HistoryStartsAt = ms.GetOldestEvent().AsTime()
		}
	}
	return rs
}

// setHistory adds a mailbox's history completeness to its stats.
func setHistory(st *mailboxv1.MailboxStats, rs RecoveryStatus) {
	st.HistoryIncomplete = !rs.HistoryComplete
	if !rs.HistoryStartsAt.IsZero() {
		st.HistoryStartsAt = timestamppb.New(rs.HistoryStartsAt)
	}
}

// seedPositions are the stored positions st was seeded with, for its ingest to start from.
func seedPositions(st *store.Store) []ingest.Position {
	var out []ingest.Position
	for _, p := range st.Seed() {
		out = append(out, ingest.Position{Topic: p.Topic, Partition: p.Partition, Next: p.Next})
	}
	return out
}

// recoveryFor decides whether opening mc recovers it: only with a source and while its store holds nothing of its
// own, or an import of it is in progress. Without a source an import in progress is dropped: nothing will finish
// it.
func (r *Runner) recoveryFor(mc MailboxConfig, st *store.Store) (*recovering, error) {
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		return nil, err
	}
	importing, err := db.Importing(mc.ID)
	if err != nil {
		return nil, err
	}
	if mc.Recover == nil {
		if importing {
			im, err := db.Import(mc.ID)
			if err != nil {
				return nil, err
			}
			r.log.Warn("a copy in progress dropped: the mailbox was opened without a recovery source", "mailbox_id", mc.ID)
			return nil, im.Abort()
		}
		return nil, nil
	}
	if !importing && (st.Usage().Events > 0 || st.Recovery() != (store.Recovery{}) || st.Seed() != nil) {
		return nil, nil
	}
	return &recovering{src: *mc.Recover, st: RecoveryStatus{
		State: RecoveryCopying, Source: mc.Recover.MailboxID, Started: r.cfg.Clock.Now(),
	}}, nil
}

// markHistoryBefore records st's history incomplete when mc names the mailbox that held it before and st holds
// nothing of its own (no events, recovery record or seed): the mailbox is built from Kafka at once, and whatever
// Kafka deleted that the earlier mailbox held is gone (docs/architecture.md#moves). It is recorded before ingest
// starts, so the history never reads complete, and kept with the store, so a reopen keeps saying so.
func (r *Runner) markHistoryBefore(mc MailboxConfig, st *store.Store) error {
	if mc.HistoryBefore == "" || st.Usage().Events > 0 || st.Recovery() != (store.Recovery{}) || st.Seed() != nil {
		return nil
	}
	now := r.cfg.Clock.Now()
	if err := st.SetRecovery(store.Recovery{Source: mc.HistoryBefore, Incomplete: true, Started: now, Finished: now}); err != nil {
		return fmt.Errorf("record history incomplete after %s: %w", mc.HistoryBefore, err)
	}
	r.log.Warn("mailbox built from Kafka after its namespace's earlier mailbox was lost: its history is incomplete",
		"mailbox_id", mc.ID, "history_before", mc.HistoryBefore, "epoch", mc.Epoch)
	return nil
}

// recover seeds mb from its source, then starts its ingest and retention, until ctx is done.
func (r *Runner) recover(ctx context.Context, mb *mailbox, icfg ingest.Config) {
	rc := mb.recovery
	id := mb.cfg.ID
	src := rc.source().MailboxID
	log := r.log.With("mailbox_id", id, "source_mailbox_id", src, "epoch", mb.epoch.Load())
	copied, err := r.copyFrom(ctx, mb)
	if ctx.Err() != nil {
		// Closed or drained: the import stays, and the next open resumes it.
		return
	}
	now := r.cfg.Clock.Now()
	switch {
	case err != nil:
		log.Warn("peer recovery gave up: the mailbox is built from Kafka and its history is incomplete", "err", err)
		rec := store.Recovery{Source: src, Incomplete: true, Started: rc.status().Started, Finished: now}
		if err := mb.store.Load().SetRecovery(rec); err != nil {
			log.Error("record the mailbox's incomplete history", "err", err)
		}
		rc.update(func(s *RecoveryStatus) { s.State, s.Finished, s.Err = RecoveryIncomplete, now, err.Error() })
	default:
		if err := r.swapInCopy(mb, copied, now); err != nil {
			log.Error("peer recovery: the copy could not replace the mailbox's store; it consumes nothing until opened again", "err", err)
			rc.update(func(s *RecoveryStatus) { s.Err = err.Error() })
			return
		}
		rc.update(func(s *RecoveryStatus) { s.State, s.Finished = RecoveryCopied, now })
		log.Info("peer recovery complete: consuming from the copied positions",
			"events", copied.Done.GetEvents(), "bytes", copied.Done.GetBytes(), "took", now.Sub(rc.status().Started))
	}
	icfg.Start = seedPositions(mb.store.Load())
	delay := time.Second
	for {
		ing, err := ingest.Start(icfg, leaseWriter{mb: mb, clock: r.cfg.Clock})
		if err == nil {
			mb.ingest.Store(ing)
			break
		}
		log.Error("start ingest after peer recovery; retrying", "err", err, "in", delay)
		t := r.cfg.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		delay = min(2*delay, 30*time.Second)
	}
	r.retain(ctx, mb)
}

// errPeerRecoveryOff is every copy's failure on a runner with peer recovery off.
var errPeerRecoveryOff = errors.New("peer recovery is off on this runner (--peer-recovery=false)")

// copyFrom copies mb's source into an import of mb.
func (r *Runner) copyFrom(ctx context.Context, mb *mailbox) (*recovery.Copied, error) {
	if r.cfg.NoPeerRecovery {
		return nil, errPeerRecoveryOff
	}
	rc := mb.recovery
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		return nil, err
	}
	return recovery.Seed(ctx, recovery.SeedConfig{
		DB: db, MailboxID: mb.cfg.ID, SourceID: rc.source().MailboxID,
		Dial: func() (runnerv1.MailboxRecoveryClient, io.Closer, error) {
			cc, err := r.dialRecovery(rc.source())
			if err != nil {
				return nil, nil, err
			}
			return runnerv1.NewMailboxRecoveryClient(cc), cc, nil
		},
		GiveUp: r.cfg.RecoveryGiveUp, Clock: r.cfg.Clock, Logger: r.log,
		Progress: func(bytes, events int64) {
			rc.update(func(s *RecoveryStatus) { s.Bytes, s.Events = bytes, events })
		},
	})
}

// dialRecovery reaches src's runner: over mutual TLS as this runner's proxy identity, checking that the peer is
// the source's proxy.
func (r *Runner) dialRecovery(src RecoverySource) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if r.cfg.TLS != nil {
		m, err := mesh.ParseMailboxID(src.MailboxID)
		if err != nil {
			return nil, fmt.Errorf("recovery source: %w", err)
		}
		want := identity.Identity{TrustDomain: r.cfg.TLS.Identity().TrustDomain, Role: identity.Proxy, Name: m.Proxy}
		creds = credentials.NewTLS(r.cfg.TLS.ClientConfig(pki.Exactly(want)))
	}
	cc, err := grpc.NewClient(src.Address, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("recovery source %s at %s: %w", src.MailboxID, src.Address, err)
	}
	return cc, nil
}

// swapInCopy makes the copy mb's store: reads wait for the swap (those in progress finish on the empty store), and
// the empty store is dropped with it.
func (r *Runner) swapInCopy(mb *mailbox, copied *recovery.Copied, now time.Time) error {
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		return err
	}
	rc := mb.recovery
	mb.reads.close()
	defer mb.reads.reopen()
	if err := mb.store.Load().Close(); err != nil {
		return err
	}
	rec := store.Recovery{Source: rc.source().MailboxID, Copied: true, Bytes: copied.Done.GetBytes(), Events: copied.Done.GetEvents(),
		Started: rc.status().Started, Finished: now}
	errFinish := copied.Import.Finish(copied.Positions, rec)
	st, err := r.openView(db, r.storeOptions(mb.cfg))
	if err != nil {
		return errors.Join(errFinish, err)
	}
	mb.store.Store(st)
	return errFinish
}

// UpdateRecovery takes a new address for the source mailbox id is being seeded from (its runner restarted
// elsewhere); the copy's next try goes there. It does nothing for a mailbox not being seeded from that source.
func (r *Runner) UpdateRecovery(id string, src RecoverySource) {
	r.mu.RLock()
	mb, ok := r.mailboxes[id]
	r.mu.RUnlock()
	if !ok || mb.recovery == nil {
		return
	}
	mb.recovery.mu.Lock()
	defer mb.recovery.mu.Unlock()
	if mb.recovery.src.MailboxID == src.MailboxID && mb.recovery.src.Address != src.Address {
		r.log.Info("peer recovery source moved", "mailbox_id", id, "source_mailbox_id", src.MailboxID, "address", src.Address)
		mb.recovery.src.Address = src.Address
	}
}

// AllowRecovery sets which proxies' runners may copy mailbox id while this runner holds it (nil: none).
func (r *Runner) AllowRecovery(id string, proxies []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(proxies) == 0 {
		delete(r.allowed, id)
		return
	}
	r.allowed[id] = slices.Clone(proxies)
}

// RecoveryAllowed implements recovery.Source.
func (r *Runner) RecoveryAllowed(id, caller string) error {
	if r.cfg.NoPeerRecovery {
		return grpcstatus.Errorf(codes.Unavailable, "fetch %s: peer recovery is off on this runner", id)
	}
	r.mu.RLock()
	allowed := slices.Contains(r.allowed[id], caller)
	mb, ok := r.mailboxes[id]
	r.mu.RUnlock()
	if !allowed {
		return grpcstatus.Errorf(codes.PermissionDenied, "fetch %s: proxy %q is not allowed to copy it (the admin's placement names the proxies that may)", id, caller)
	}
	if !ok || mb.expired(r.cfg.Clock.Now()) {
		return grpcstatus.Errorf(codes.NotFound, "fetch %s: not held here under a live lease", id)
	}
	return nil
}

// RecoverySnapshot implements recovery.Source: the positions are read first, so the snapshot holds everything
// they cover.
func (r *Runner) RecoverySnapshot(id string) (*store.Snapshot, []store.Position, error) {
	r.mu.RLock()
	mb, ok := r.mailboxes[id]
	r.mu.RUnlock()
	if !ok {
		return nil, nil, grpcstatus.Errorf(codes.NotFound, "fetch %s: not held here under a live lease", id)
	}
	ing := mb.ingest.Load()
	if ing == nil {
		return nil, nil, grpcstatus.Errorf(codes.Unavailable, "fetch %s: it is being recovered itself; retry", id)
	}
	ps, known := ing.Positions()
	if !known {
		return nil, nil, grpcstatus.Errorf(codes.Unavailable, "fetch %s: its stored positions are not known yet (no consumer group session); retry", id)
	}
	sn, err := mb.store.Load().Snapshot()
	if err != nil {
		return nil, nil, grpcstatus.Errorf(codes.Unavailable, "fetch %s: %v", id, err)
	}
	out := make([]store.Position, len(ps))
	for i, p := range ps {
		out[i] = store.Position{Topic: p.Topic, Partition: p.Partition, Next: p.Next}
	}
	return sn, out, nil
}
