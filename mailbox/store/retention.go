package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"k8s.io/utils/clock"
)

// retentionChunk is how many items one sweep transaction removes at most. Each item is 2 keys, plus the
// posting blocks it is the first below the floor to be in; a chunk that still exceeds Badger's transaction
// limit is halved. Small chunks keep the reader and Badger's write
// goroutine busy at the same time (the first commit starts after 1k items are read, not 10k, and the last one
// trails the read by as little): removing 100k items took 1.11-1.14 s with chunks of 1000 against 1.57-1.63 s
// with 10,000 and 1.82-1.93 s with 50,000 (2-core machine, paired runs), the extra fsyncs notwithstanding.
const retentionChunk = 1000

type victim struct {
	p     pos
	keys  [2][]byte // the item's own keys: primary, message id
	index [][]byte  // the prefixes of the posting lists it is in
}

// RetainOnce runs one retention pass at time now: it deletes every item older than MaxAge and then the oldest
// items until the stored envelope bytes are at most MaxSize, by raising the store's retention floor, the
// timestamp below which items are deleted. Like Kafka's log start offset, the floor deletes at once: from the
// commit on, queries, Get and Stats skip everything below it and writes drop items older than it, while the
// keys themselves are removed by Sweep (which RunRetention calls right after) at Badger's pace. The pass costs
// one read of the deleted items (their sizes, for the counters) and one small transaction; the sweep writes a
// tombstone for each of their keys, as deleting them in the pass did.
//
// The floor is raised for writes first, under the write lock, so nothing lands below it while the pass counts
// what it deletes; the count and the new floor are then committed together with the counters.
//
// Deleting an item also frees its message id: a message redelivered after its item aged out is dropped as
// expired (it is as old as the item was) and, once the sweep has removed the id, would be stored again only if
// it came with a newer timestamp. Kafka only redelivers what is still within its own retention, which for a
// mailbox that keeps data at least as long as its topic never happens, and the alternative (ids kept forever)
// would grow without bound.
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
	old := s.meta().floor()
	floor := max(cutoff, old)
	if s.opts.MaxSize > 0 {
		f, err := s.sizeFloor(ctx, old, cutoff)
		if err != nil {
			return RetentionResult{}, fmt.Errorf("retention: %w", err)
		}
		floor = max(floor, f)
	}
	if floor <= old {
		return RetentionResult{}, nil
	}

	s.wmu.Lock()
	s.settle()
	s.wfloor = max(s.wfloor, floor)
	s.wmu.Unlock()
	// Every write below floor is now applied and no other can come, so this count is exact.
	res, err := s.countBetween(ctx, old, floor)
	if err != nil {
		return RetentionResult{}, fmt.Errorf("retention: %w", err)
	}
	if err := s.commitFloor(floor, res); err != nil {
		return RetentionResult{}, fmt.Errorf("retention: %w", err)
	}
	s.deleted.Add(int64(res.Deleted))
	s.deletedBytes.Add(res.DeletedBytes)
	if res.Deleted > 0 {
		s.log.Info("retention pass", "deleted", res.Deleted, "deleted_bytes", res.DeletedBytes, "floor", floor)
	}
	return res, nil
}

func (s *Store) commitFloor(floor int64, res RetentionResult) error {
	if err := s.ready(); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.settle()
	m := s.wm
	m.events -= int64(res.Deleted)
	m.bytes -= res.DeletedBytes
	m.setFloor(floor)
	txn, done, err := s.begin(true)
	if err != nil {
		return err
	}
	defer done()
	// Nothing is in flight and the commit below changes no item, so txn reads the items as they will stand.
	m.setBounds(txn, s.box)
	if err := txn.Set(s.box.metaKey(), m.encode()); err != nil {
		return fmt.Errorf("write floor: %w", err)
	}
	ts := s.owner.nextTs()
	if err := txn.CommitAt(ts, nil); err != nil {
		return fmt.Errorf("commit floor: %w", err)
	}
	s.wm = m
	s.publish(m, ts)
	return nil
}

// walkOldest calls fn with the items from the oldest not older than from, oldest first, and their records,
// until fn returns false. It reads the current snapshot: every commit of the store applied when it starts.
func (s *Store) walkOldest(ctx context.Context, from int64, fn func(p pos, v itemValue) (bool, error)) error {
	dict := s.dict.Load()
	return s.view(func(txn *badger.Txn, _ meta) error {
		it := txn.NewIterator(badger.IteratorOptions{Reverse: true, Prefix: s.box.itemPrefix(), PrefetchValues: true, PrefetchSize: 256})
		defer it.Close()
		for n, seek := 0, s.box.oldestFrom(from); ; n++ {
			if n%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if n == 0 {
				it.Seek(seek)
			} else {
				it.Next()
			}
			if !it.Valid() {
				return nil
			}
			item := it.Item()
			p := posOfItem(item.Key())
			more := true
			err := item.Value(func(v []byte) error {
				var err error
				more, err = fn(p, itemValue{v, item.UserMeta(), dict})
				return err
			})
			if err != nil {
				return fmt.Errorf("read %x: %w", p, err)
			}
			if !more {
				return nil
			}
		}
	})
}

// sizeFloor is the lowest floor that leaves at most MaxSize envelope bytes once everything older than cutoff
// is gone, as the store stands when the walk begins. It deletes whole milliseconds: items sharing the
// timestamp of the last one that must go go too.
func (s *Store) sizeFloor(ctx context.Context, from, cutoff int64) (int64, error) {
	remaining := s.meta().bytes
	floor := int64(math.MinInt64)
	err := s.walkOldest(ctx, from, func(p pos, v itemValue) (bool, error) {
		ts := p.ts()
		if ts >= cutoff && remaining <= s.opts.MaxSize && ts >= floor {
			return false, nil
		}
		n, err := v.blobLen()
		if err != nil {
			return false, err
		}
		remaining -= int64(n)
		if ts == math.MaxInt64 {
			floor = ts // nothing can be newer; the floor cannot pass it
			return false, nil
		}
		floor = ts + 1
		return true, nil
	})
	return floor, err
}

// countBetween counts the items at or after from and before floor, and their envelope bytes.
func (s *Store) countBetween(ctx context.Context, from, floor int64) (RetentionResult, error) {
	var res RetentionResult
	err := s.walkOldest(ctx, from, func(p pos, v itemValue) (bool, error) {
		if p.ts() >= floor {
			return false, nil
		}
		n, err := v.blobLen()
		if err != nil {
			return false, err
		}
		res.Deleted++
		res.DeletedBytes += int64(n)
		return true, nil
	})
	return res, err
}

// Sweep removes the keys of the items below the retention floor: primary key, message-id entry and their
// positions in the posting lists, in transactions of up to retentionChunk items. The first chunk holding an
// item of a posting list trims the whole list, in the same transaction: blocks wholly below the floor are
// deleted, a block straddling it is rewritten with its positions from the floor on. Until that commit every
// item of the list below the floor is still stored, so a sweep cut short finds the list again when it resumes. One read snapshot walks them oldest first and hands
// chunks to a committer, so reading the next chunk overlaps with Badger writing the tombstones of the previous
// one; the committer takes the write lock per chunk, so a long sweep never stalls ingestion. It returns how many
// items it removed. Until it runs, deleted items cost disk space but are invisible.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	floor := s.meta().floor()
	if floor == math.MinInt64 {
		return 0, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan []victim, 1)
	swept := 0
	var commitErr error
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		trimmed := map[string]struct{}{} // posting lists already trimmed to the floor
		for vs := range chunks {
			if commitErr != nil {
				continue // the reader stops at its next chunk
			}
			s.wmu.Lock()
			commitErr = s.deleteChunk(vs, floor, trimmed)
			s.wmu.Unlock()
			if commitErr != nil {
				cancel()
				continue
			}
			swept += len(vs)
			s.swept.Add(int64(len(vs)))
		}
	}()
	readErr := s.collectVictims(ctx, floor, chunks)
	close(chunks)
	<-committed
	if commitErr != nil {
		return swept, fmt.Errorf("sweep: %w", commitErr)
	}
	if readErr != nil {
		return swept, fmt.Errorf("sweep: %w", readErr)
	}
	if err := s.owner.fixModes(); err != nil {
		return swept, fmt.Errorf("sweep: %w", err)
	}
	return swept, nil
}

// collectVictims sends, in chunks of s.chunk, the items below floor with all their keys.
func (s *Store) collectVictims(ctx context.Context, floor int64, out chan<- []victim) error {
	vs := make([]victim, 0, s.chunk)
	var buf []byte
	err := s.walkOldest(ctx, math.MinInt64, func(p pos, v itemValue) (bool, error) {
		if p.ts() >= floor {
			return false, nil
		}
		rec, err := v.record(&buf)
		if err != nil {
			return false, err
		}
		// itemKeys and indexPrefixes copy what they take from rec, which buf's next item overwrites.
		x, err := parseIndexed(rec)
		if err != nil {
			return false, err
		}
		vs = append(vs, victim{p: p, keys: itemKeys(nil, s.box, p, x.msgID), index: indexPrefixes(nil, nil, s.box, x.topic, x.principal, x.corr, x.trace)})
		if len(vs) == s.chunk {
			out <- vs
			vs = make([]victim, 0, s.chunk)
		}
		return true, nil
	})
	if err == nil && len(vs) > 0 {
		out <- vs
	}
	return err
}

// deleteChunk deletes vs in one transaction, halving it while Badger finds it too big.
func (s *Store) deleteChunk(vs []victim, floor int64, trimmed map[string]struct{}) error {
	err := s.deleteTxn(vs, floor, trimmed)
	if !errors.Is(err, badger.ErrTxnTooBig) || len(vs) < 2 {
		return err
	}
	half := len(vs) / 2
	if err := s.deleteChunk(vs[:half], floor, trimmed); err != nil {
		return err
	}
	return s.deleteChunk(vs[half:], floor, trimmed)
}

// deleteTxn removes the keys of items already deleted by the floor (and so already out of the counters), and
// trims the posting lists they are in that no earlier chunk trimmed, adding those to trimmed once committed.
func (s *Store) deleteTxn(vs []victim, floor int64, trimmed map[string]struct{}) error {
	s.settle()
	txn, done, err := s.begin(true)
	if err != nil {
		return err
	}
	defer done()
	var lists []string
	seen := map[string]struct{}{}
	for _, v := range vs {
		for _, k := range v.keys {
			if err := txn.Delete(k); err != nil {
				return fmt.Errorf("delete %x: %w", v.p, err)
			}
		}
		for _, pr := range v.index {
			if _, done := trimmed[string(pr)]; done {
				continue
			}
			if _, dup := seen[string(pr)]; dup {
				continue
			}
			seen[string(pr)] = struct{}{}
			lists = append(lists, string(pr))
		}
	}
	if len(lists) > 0 {
		// The lists are read in a read-only transaction: one opened in txn would copy and sort txn's pending
		// writes for every list. With the write lock held and nothing in flight, it reads what txn changes.
		rt, rdone, err := s.begin(false)
		if err != nil {
			return err
		}
		for _, pr := range lists {
			if err := trimList(rt, txn, []byte(pr), floor, s.wm.span); err != nil {
				rdone()
				return err
			}
		}
		rdone()
	}
	ts := s.owner.nextTs()
	if err := txn.CommitAt(ts, nil); err != nil {
		return fmt.Errorf("commit deletes: %w", err)
	}
	for _, pr := range lists {
		trimmed[pr] = struct{}{}
	}
	// The deleted keys were already invisible; a new snapshot lets compaction drop them.
	s.publish(s.meta(), ts)
	return nil
}

// trimList removes, in txn, the positions below floor from the posting list prefix as read reads it, whose blocks
// span at most span: blocks wholly below it go, a block straddling it keeps its first positions.
func trimList(read, txn *badger.Txn, prefix []byte, floor int64, span uint64) error {
	type edit struct {
		key  []byte
		keep []pos // nil: delete
	}
	var edits []edit
	// A position below floor is after bound; a block holding one starts at most span before it.
	bound := makePos(floor, 0)
	it := read.NewIterator(badger.IteratorOptions{Prefix: prefix})
	for it.Seek(blockKey(nil, prefix, seekBack(bound, span))); it.ValidForPrefix(prefix); it.Next() {
		item := it.Item()
		k := item.KeyCopy(nil)
		if len(k) != len(prefix)+posLen {
			it.Close()
			return fmt.Errorf("posting block key %x: %w", k, errCorruptBlock)
		}
		var first pos
		copy(first[:], k[len(prefix):])
		var ps []pos
		err := item.Value(func(v []byte) error {
			var err error
			ps, err = decodeBlock(nil, first, v, span)
			return err
		})
		if err != nil {
			it.Close()
			return fmt.Errorf("posting block %x: %w", k, err)
		}
		// Positions from the floor on sort before bound (at the floor, bound is the last position possible).
		n, _ := slices.BinarySearchFunc(ps, bound, comparePos)
		switch {
		case n == len(ps):
		case n == 0:
			edits = append(edits, edit{key: k})
		default:
			edits = append(edits, edit{key: k, keep: ps[:n]})
		}
	}
	it.Close()
	for _, e := range edits {
		var err error
		if e.keep == nil {
			err = txn.Delete(e.key)
		} else {
			err = txn.Set(e.key, encodeBlock(e.keep))
		}
		if err != nil {
			return fmt.Errorf("trim posting block %x: %w", e.key, err)
		}
	}
	return nil
}

// RunRetention runs RetainOnce and Sweep every interval of clk, at clk's time, until ctx ends, and after a sweep
// that removed something runs the database's value-log GC (DB.collectGarbage, one run at a time per database),
// so deleted envelopes give their disk space back.
// It returns once ctx is done and its pass has stopped; callers cancel ctx and wait for it before Close.
func (s *Store) RunRetention(ctx context.Context, interval time.Duration, clk clock.WithTicker) {
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if _, err := s.RetainOnce(ctx, clk.Now()); err != nil {
			if ctx.Err() == nil {
				s.log.Error("retention pass failed", "err", err)
			}
			continue
		}
		// Also after a pass that deleted nothing: a sweep cut short (by a stop or an error) resumes here.
		swept, err := s.Sweep(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("retention sweep failed", "err", err)
			}
			continue
		}
		if swept > 0 {
			s.owner.collectGarbage(ctx)
		}
	}
}
