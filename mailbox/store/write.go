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
// pipelined sub-transactions bought no throughput and cost an fsync each. Concurrent Writes (one per Kafka
// partition claim) are committed together: the caller that gets the write lock takes every queued batch into
// its transaction, so claims waiting on each other share one fsync. Each batch stays all-or-nothing, and dedup
// runs across them in queue order. A group too big for one transaction falls back to one transaction per batch,
// and a batch too big on its own (beyond 15% of Badger's 64 MiB memtable: tens of thousands of items) is split
// in halves committed in turn; a crash between them leaves a prefix stored, which redelivery completes without
// duplicates.
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
	req := &writeReq{items: items}
	s.qmu.Lock()
	s.queue = append(s.queue, req)
	s.qmu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if !req.done {
		s.qmu.Lock()
		group := s.queue
		s.queue = nil
		s.qmu.Unlock()
		s.writeGroup(group)
	}
	return req.res, req.err
}

// writeReq is one queued Write; res, err and done are set by whichever Write commits it, with wmu held.
type writeReq struct {
	items []*mailboxv1.MailboxItem
	res   WriteResult
	err   error
	done  bool
}

func (s *Store) writeGroup(group []*writeReq) {
	batches := make([][]*mailboxv1.MailboxItem, len(group))
	for i, r := range group {
		batches[i] = r.items
	}
	res, err := s.writeTxn(batches)
	for i, r := range group {
		r.done = true
		switch {
		case err == nil:
			r.res = res[i]
		case errors.Is(err, badger.ErrTxnTooBig):
			r.res, r.err = s.writeChunk(r.items)
		default:
			r.err = err
		}
	}
}

func (s *Store) writeChunk(items []*mailboxv1.MailboxItem) (WriteResult, error) {
	res, err := s.writeTxn([][]*mailboxv1.MailboxItem{items})
	if err == nil {
		return res[0], nil
	}
	if !errors.Is(err, badger.ErrTxnTooBig) || len(items) < 2 {
		return WriteResult{}, err
	}
	half := len(items) / 2
	a, err := s.writeChunk(items[:half])
	if err != nil {
		return a, err
	}
	b, err := s.writeChunk(items[half:])
	return WriteResult{Stored: a.Stored + b.Stored, Duplicates: a.Duplicates + b.Duplicates}, err
}

// writeTxn writes batches in one transaction, in order, and counts each batch's items; it must be called with
// wmu held.
func (s *Store) writeTxn(batches [][]*mailboxv1.MailboxItem) ([]WriteResult, error) {
	res := make([]WriteResult, len(batches))
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	m := s.m // only writers change s.m, and wmu is held
	seen := map[string]struct{}{}
	stored := 0
	for b, items := range batches {
		for _, it := range items {
			id := it.GetMessageId()
			if _, dup := seen[id]; dup {
				res[b].Duplicates++
				continue
			}
			seen[id] = struct{}{}
			_, found, err := lookupMsgID(txn, id)
			if err != nil {
				return nil, fmt.Errorf("write: dedup %q: %w", id, err)
			}
			if found {
				res[b].Duplicates++
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
					return nil, fmt.Errorf("write %q: %w", id, err)
				}
			}
			m.events++
			m.bytes += int64(len(it.GetEnvelopeBlob()))
			res[b].Stored++
			stored++
		}
	}
	if stored == 0 {
		return res, nil
	}
	if err := txn.Set(metaKey, m.encode()); err != nil {
		return nil, fmt.Errorf("write counters: %w", err)
	}
	if err := txn.Commit(); err != nil {
		return nil, fmt.Errorf("write: commit: %w", err)
	}
	s.setMeta(m)
	return res, nil
}

func (s *Store) setMeta(m meta) {
	s.mmu.Lock()
	s.m = m
	s.mmu.Unlock()
}
