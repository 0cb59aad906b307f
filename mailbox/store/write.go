package store

import (
	"context"
	"errors"
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Write stores items atomically and durably (synced to disk before it returns), so the caller may commit the Kafka
// offsets covering them. An item whose message_id is already stored (or repeated earlier in the same batch) is
// skipped and counted as a duplicate: redelivery never creates a second item.
//
// A batch is one Badger transaction and so one fsync; measured on the 2-core bench machine, splitting it into
// pipelined sub-transactions bought no throughput and cost an fsync each. A batch too big for one transaction
// (beyond 15% of Badger's 64 MiB memtable, i.e. tens of thousands of items) is split in halves committed in
// turn; a crash between them leaves a prefix stored, which redelivery completes without duplicates.
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
	return s.writeChunk(items)
}

func (s *Store) writeChunk(items []*mailboxv1.MailboxItem) (WriteResult, error) {
	res, err := s.writeTxn(items)
	if !errors.Is(err, badger.ErrTxnTooBig) || len(items) < 2 {
		return res, err
	}
	half := len(items) / 2
	a, err := s.writeChunk(items[:half])
	if err != nil {
		return a, err
	}
	b, err := s.writeChunk(items[half:])
	return WriteResult{Stored: a.Stored + b.Stored, Duplicates: a.Duplicates + b.Duplicates}, err
}

// writeTxn writes items in one transaction; it must be called with wmu held.
func (s *Store) writeTxn(items []*mailboxv1.MailboxItem) (WriteResult, error) {
	var res WriteResult
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	m := s.m // only writers change s.m, and wmu is held
	seen := make(map[string]struct{}, len(items))
	for _, it := range items {
		id := it.GetMessageId()
		if _, dup := seen[id]; dup {
			res.Duplicates++
			continue
		}
		seen[id] = struct{}{}
		_, stored, err := lookupMsgID(txn, id)
		if err != nil {
			return WriteResult{}, fmt.Errorf("write: dedup %q: %w", id, err)
		}
		if stored {
			res.Duplicates++
			continue
		}
		m.seq++
		p := makePos(it.GetTimestamp(), m.seq)
		keys := itemKeys(p, id, it.GetTopic(), it.GetPrincipal(), it.GetCorrelationId(), it.GetTraceId())
		for i, k := range keys {
			var v []byte
			switch i {
			case 0:
				v = encodeRecord(it)
			case 1:
				v = p[:]
			}
			if err := txn.Set(k, v); err != nil {
				return WriteResult{}, fmt.Errorf("write %q: %w", id, err)
			}
		}
		m.events++
		m.bytes += int64(len(it.GetEnvelopeBlob()))
		res.Stored++
	}
	if res.Stored == 0 {
		return res, nil
	}
	if err := txn.Set(metaKey, m.encode()); err != nil {
		return WriteResult{}, fmt.Errorf("write counters: %w", err)
	}
	if err := txn.Commit(); err != nil {
		return WriteResult{}, fmt.Errorf("write: commit: %w", err)
	}
	s.setMeta(m)
	return res, nil
}

func (s *Store) setMeta(m meta) {
	s.mmu.Lock()
	s.m = m
	s.mmu.Unlock()
}
