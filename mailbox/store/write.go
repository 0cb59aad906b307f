package store

import (
	"context"
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Write stores items durably (synced to disk before it returns), so the caller may commit the Kafka offsets
// covering them. An item whose message_id is already stored (or repeated earlier in the same batch) is skipped
// and counted as a duplicate: redelivery never creates a second item.
//
// A batch is written as a sequence of Badger transactions of up to subBatchItems items: while one commits (and
// fsyncs), the next is prepared, and it is committed only after the previous one succeeded. A crash mid-batch
// leaves a prefix of it stored, with counters to match; the caller has not committed its offsets, so the
// redelivery completes it without duplicates.
func (s *Store) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (WriteResult, error) {
	for i, it := range items {
		if it == nil {
			return WriteResult{}, fmt.Errorf("write: item %d is nil", i)
		}
		if it.GetMessageId() == "" {
			return WriteResult{}, fmt.Errorf("write: item %d has no message_id", i)
		}
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := &batchWriter{s: s, m: s.m, seen: make(map[string]struct{}, len(items))}
	defer w.discard()
	for _, it := range items {
		if err := w.add(it); err != nil {
			return WriteResult{}, err
		}
	}
	if err := w.flush(); err != nil {
		return WriteResult{}, err
	}
	if err := w.wait(); err != nil {
		return WriteResult{}, err
	}
	return w.res, nil
}

// Sub-transaction bounds: small enough never to hit Badger's transaction limit (15% of the memtable), large
// enough that the per-commit fsync is amortized.
const (
	subBatchItems = 256
	subBatchBytes = 1 << 20
)

// batchWriter writes one Write call's items; it runs with wmu held.
type batchWriter struct {
	s     *Store
	m     meta // counters including everything added so far
	seen  map[string]struct{}
	res   WriteResult
	txn   *badger.Txn
	items int
	bytes int

	inflight     chan error // result of the commit in flight, if any
	inflightMeta meta       // counters once it is committed
}

func (w *batchWriter) add(it *mailboxv1.MailboxItem) error {
	id := it.GetMessageId()
	if _, dup := w.seen[id]; dup {
		w.res.Duplicates++
		return nil
	}
	w.seen[id] = struct{}{}
	if w.txn == nil {
		w.txn = w.s.db.NewTransaction(true)
	}
	// The transaction reads the committed store: items of this batch still in flight are caught by seen.
	_, stored, err := lookupMsgID(w.txn, id)
	if err != nil {
		return fmt.Errorf("write: dedup %q: %w", id, err)
	}
	if stored {
		w.res.Duplicates++
		return nil
	}
	rec := encodeRecord(it)
	w.m.seq++
	p := makePos(it.GetTimestamp(), w.m.seq)
	keys := itemKeys(p, id, it.GetTopic(), it.GetPrincipal(), it.GetCorrelationId(), it.GetTraceId())
	for i, k := range keys {
		var v []byte
		switch i {
		case 0:
			v = rec
		case 1:
			v = p[:]
		}
		if err := w.txn.Set(k, v); err != nil {
			return fmt.Errorf("write %q: %w", id, err)
		}
	}
	w.m.events++
	w.m.bytes += int64(len(it.GetEnvelopeBlob()))
	w.res.Stored++
	w.items++
	w.bytes += len(rec)
	if w.items >= subBatchItems || w.bytes >= subBatchBytes {
		return w.flush()
	}
	return nil
}

// flush starts committing the current transaction once the previous commit has succeeded.
func (w *batchWriter) flush() error {
	if w.txn == nil || w.items == 0 {
		return nil
	}
	if err := w.txn.Set(metaKey, w.m.encode()); err != nil {
		return fmt.Errorf("write counters: %w", err)
	}
	if err := w.wait(); err != nil {
		return err
	}
	done := make(chan error, 1)
	w.txn.CommitWith(func(err error) { done <- err })
	w.txn, w.items, w.bytes = nil, 0, 0
	w.inflight, w.inflightMeta = done, w.m
	return nil
}

// wait waits for the commit in flight and publishes its counters.
func (w *batchWriter) wait() error {
	if w.inflight == nil {
		return nil
	}
	err := <-w.inflight
	w.inflight = nil
	if err != nil {
		return fmt.Errorf("write: commit: %w", err)
	}
	w.s.setMeta(w.inflightMeta)
	return nil
}

// discard drops an unfinished transaction and waits for a commit in flight, so nothing outlives the call.
func (w *batchWriter) discard() {
	if w.txn != nil {
		w.txn.Discard()
	}
	_ = w.wait()
}

func (s *Store) setMeta(m meta) {
	s.mmu.Lock()
	s.m = m
	s.mmu.Unlock()
}
