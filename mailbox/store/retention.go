package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// retentionChunk is how many items one delete transaction removes at most. Each item is up to 6 keys; a chunk
// that still exceeds Badger's transaction limit is halved. Small chunks keep the reader and Badger's write
// goroutine busy at the same time (the first commit starts after 1k items are read, not 10k, and the last one
// trails the read by as little): deleting 100k items took 1.11-1.14 s with chunks of 1000 against 1.57-1.63 s
// with 10,000 and 1.82-1.93 s with 50,000 (2-core machine, paired runs), the extra fsyncs notwithstanding.
const retentionChunk = 1000

type victim struct {
	p     pos
	keys  [][]byte // every key of the item: primary, message id, index entries
	bytes int64
}

// RetainOnce runs one retention pass at time now: it deletes items older than MaxAge, then the oldest items
// until the stored envelope bytes are at most MaxSize, each with its index entries and its message-id entry, in
// transactions of up to retentionChunk items that also rewrite the counters.
//
// One read snapshot walks the items oldest first and hands chunks of victims to a committer, so reading the
// next chunk overlaps with Badger writing the tombstones of the previous one. The committer takes the write lock
// per chunk, not for the pass, so a long pass (a backlog after downtime, a lowered MaxAge) never stalls
// ingestion. The snapshot may miss items written during the pass; the next pass sees them. Deleting from it is
// safe because nothing but retention removes or changes a stored item.
//
// Dropping the message-id entry means a message redelivered after its item aged out is stored again. That is
// accepted: Kafka only redelivers what is still within its own retention, which for a mailbox that keeps data
// at least as long as its topic never happens, and the alternative (tombstones kept forever) would grow without
// bound.
func (s *Store) RetainOnce(ctx context.Context, now time.Time) (RetentionResult, error) {
	cutoff := int64(math.MinInt64)
	if s.opts.MaxAge > 0 {
		cutoff = ceilMillis(now.Add(-s.opts.MaxAge))
	}
	if cutoff == math.MinInt64 && s.opts.MaxSize <= 0 {
		return RetentionResult{}, nil
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	chunks := make(chan []victim, 1)
	var res RetentionResult
	var commitErr error
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		for vs := range chunks {
			if commitErr != nil {
				continue // the reader stops at its next chunk
			}
			s.wmu.Lock()
			commitErr = s.deleteChunk(vs)
			s.wmu.Unlock()
			if commitErr != nil {
				cancel()
				continue
			}
			res.Deleted += len(vs)
			for _, v := range vs {
				res.DeletedBytes += v.bytes
			}
		}
	}()
	readErr := s.collectVictims(ctx, cutoff, chunks)
	close(chunks)
	<-committed
	if commitErr != nil {
		return res, fmt.Errorf("retention: %w", commitErr)
	}
	if readErr != nil {
		return res, fmt.Errorf("retention: %w", readErr)
	}
	if res.Deleted > 0 {
		s.log.Info("retention pass", "deleted", res.Deleted, "deleted_bytes", res.DeletedBytes, "dir", s.opts.Dir)
	}
	if err := s.fixModes(); err != nil {
		return res, fmt.Errorf("retention: %w", err)
	}
	return res, nil
}

// collectVictims walks the primary order from the oldest item and sends, in chunks of s.chunk, the items that
// are older than cutoff or must go to get under MaxSize (as the store stood when the walk began).
func (s *Store) collectVictims(ctx context.Context, cutoff int64, out chan<- []victim) error {
	s.mmu.Lock()
	remaining := s.m.bytes
	s.mmu.Unlock()
	return s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Reverse: true, Prefix: []byte{prefixItem}, PrefetchValues: true, PrefetchSize: 256})
		defer it.Close()
		vs := make([]victim, 0, s.chunk)
		for it.Seek(afterLastItem); it.Valid(); it.Next() {
			item := it.Item()
			var p pos
			copy(p[:], item.Key()[1:])
			if p.ts() >= cutoff && (s.opts.MaxSize <= 0 || remaining <= s.opts.MaxSize) {
				break
			}
			v := victim{p: p}
			err := item.Value(func(rec []byte) error {
				x, err := parseIndexed(rec)
				if err != nil {
					return err
				}
				v.bytes = int64(x.blobLen)
				v.keys = itemKeys(p, x.msgID, x.topic, x.principal, x.corr, x.trace)
				return nil
			})
			if err != nil {
				return fmt.Errorf("read %x: %w", p, err)
			}
			remaining -= v.bytes
			vs = append(vs, v)
			if len(vs) == s.chunk {
				if err := ctx.Err(); err != nil {
					return err
				}
				out <- vs
				vs = make([]victim, 0, s.chunk)
			}
		}
		if len(vs) > 0 {
			out <- vs
		}
		return nil
	})
}

// deleteChunk deletes vs in one transaction, halving it while Badger finds it too big.
func (s *Store) deleteChunk(vs []victim) error {
	err := s.deleteTxn(vs)
	if !errors.Is(err, badger.ErrTxnTooBig) || len(vs) < 2 {
		return err
	}
	half := len(vs) / 2
	if err := s.deleteChunk(vs[:half]); err != nil {
		return err
	}
	return s.deleteChunk(vs[half:])
}

func (s *Store) deleteTxn(vs []victim) error {
	s.settle()
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	m := s.wm
	for _, v := range vs {
		for _, k := range v.keys {
			if err := txn.Delete(k); err != nil {
				return fmt.Errorf("delete %x: %w", v.p, err)
			}
		}
		m.events--
		m.bytes -= v.bytes
	}
	if err := txn.Set(metaKey, m.encode()); err != nil {
		return fmt.Errorf("write counters: %w", err)
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("commit deletes: %w", err)
	}
	s.wm = m
	s.setMeta(m)
	return nil
}

// RunRetention runs RetainOnce every interval until ctx ends, and after a pass that deleted something runs
// Badger's value-log GC until it finds nothing more to rewrite, so deleted envelopes give their disk space back.
// It returns once ctx is done and its pass has stopped; callers cancel ctx and wait for it before Close.
func (s *Store) RunRetention(ctx context.Context, interval time.Duration, now func() time.Time) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := s.RetainOnce(ctx, now())
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("retention pass failed", "dir", s.opts.Dir, "err", err)
			}
			continue
		}
		if res.Deleted > 0 {
			s.collectGarbage(ctx)
		}
	}
}

// maxGCRounds bounds one GC run; each round rewrites at most one value-log file.
const maxGCRounds = 100

func (s *Store) collectGarbage(ctx context.Context) {
	if s.opts.InMemory {
		return
	}
	for range maxGCRounds {
		if ctx.Err() != nil {
			return
		}
		err := s.db.RunValueLogGC(0.5)
		if errors.Is(err, badger.ErrNoRewrite) {
			return
		}
		if err != nil {
			s.log.Warn("value-log GC", "dir", s.opts.Dir, "err", err)
			return
		}
	}
}
