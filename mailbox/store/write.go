package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/klauspost/compress/s2"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Write stores items atomically and durably (synced to disk before it returns), so the caller may commit the Kafka
// offsets covering them. An item whose message_id is already stored (or repeated earlier in the same batch) is
// skipped and counted as a duplicate: redelivery never creates a second item. An item older than the retention
// floor is skipped and counted as expired: retention has already deleted everything that old.
//
// Concurrent Writes (one per Kafka partition claim) are committed together: the caller that gets the write lock
// takes every queued batch into one transaction, so claims waiting on each other share one fsync. Each batch
// stays all-or-nothing, and dedup runs across them in queue order.
//
// Groups are pipelined: Badger writes on a single goroutine, so a group is sent the moment it is filled (records
// and keys encoded before the lock, dedup lookups and Sets under it), queued behind the one Badger is writing,
// and Badger never waits for the store between two groups (it also syncs the groups it finds queued together).
// What makes that safe:
//   - a group's transaction reads the store as of its last applied commit, so the group is filled only once
//     every flight but the last one sent is durable; that last flight's message ids it checks in memory;
//   - a group with an item found among those ids (a duplicate of the flight) is sent only once that flight is
//     durable, and fails if it failed, so dedup never builds on a write that did not happen;
//   - Badger applies and syncs commits in the order they are sent, so after a crash a group is there only if the
//     ones before it are;
//   - a group sent behind a flight that then fails is stored whole, but its counters counted the failed flight's
//     items: its Writes fail too (redelivery finds its items stored), and the next holder of the write lock
//     settles, rewriting the counters from what Badger applied (settle).
//
// A group too big for one transaction falls back to one transaction per batch, and a batch too big on its own
// (beyond 15% of Badger's 64 MiB memtable: tens of thousands of items) is split in halves committed in turn; a
// crash between them leaves a prefix stored, which redelivery completes without duplicates.
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
	if err := s.ready(); err != nil {
		return WriteResult{}, fmt.Errorf("write: %w", err)
	}
	var enc []encoded
	if s.opts.plainRecords {
		enc = encodeItems(items, s.box, false, nil)
	} else {
		dict, err := s.dictionary(items)
		if err != nil {
			return WriteResult{}, err
		}
		enc = encodeItems(items, s.box, true, dict)
	}
	req := &writeReq{items: items, enc: enc, groups: groupValues(enc)}
	s.qmu.Lock()
	s.queue = append(s.queue, req)
	s.qmu.Unlock()
	s.wmu.Lock()
	if !req.taken {
		s.qmu.Lock()
		group := s.queue
		s.queue = nil
		s.qmu.Unlock()
		s.sendGroup(group)
	}
	s.wmu.Unlock()
	if req.f != nil {
		<-req.f.done
		if req.f.err != nil {
			return WriteResult{}, req.f.err
		}
	}
	return req.res, req.err
}

// writeReq is one queued Write. taken, res, err and f are set by whichever Write takes it into a group, with wmu
// held; the result stands once f (if set) is done.
type writeReq struct {
	items  []*mailboxv1.MailboxItem
	enc    []encoded
	groups []valueGroup
	taken  bool
	res    WriteResult
	err    error
	f      *flight
}

// encoded is an item's stored record (compressed where that pays, record.go), keys and posting-list prefixes,
// built before the write lock, on the writer's goroutine; the primary key's position bytes are filled in under
// it, once the item's sequence number is known.
type encoded struct {
	rec    []byte
	format byte
	keys   [2][]byte // primary, message id
	index  [][]byte  // indexPrefixes
}

// valueGroup is the items of a batch (indexes into it) with one indexed value: with those of the other batches
// of its write group, one posting block, or more if they span too long.
type valueGroup struct {
	prefix []byte
	key    string // prefix, as the key of a map merging a group's batches (made here, off the write lock)
	items  []int
}

// groupValues groups a batch's items by posting-list prefix, in order of first appearance.
func groupValues(enc []encoded) []valueGroup {
	var groups []valueGroup
	at := make(map[string]int, 2*len(enc))
	for i, e := range enc {
		for _, pr := range e.index {
			g, ok := at[string(pr)]
			if !ok {
				g = len(groups)
				k := string(pr)
				at[k] = g
				groups = append(groups, valueGroup{prefix: pr, key: k})
			}
			groups[g].items = append(groups[g].items, i)
		}
	}
	return groups
}

// encodeItems encodes a batch for mailbox b: each record is built and compressed in buffers reused from item to item, and what
// is kept (the stored value, keys and prefixes) is carved out of an arena, a few allocations per batch instead
// of nine per item.
func encodeItems(items []*mailboxv1.MailboxItem, b box, compress bool, dict *s2.Dict) []encoded {
	enc := make([]encoded, len(items))
	index := make([][]byte, 0, 4*len(items))
	var a arena
	var rec, comp []byte
	for i, it := range items {
		rec = appendRecord(rec[:0], it)
		v, format := rec, formatPlain
		if compress {
			comp = slices.Grow(comp[:0], storedMaxLen(len(rec)))
			v, format = storeRecord(comp, rec, len(it.GetEnvelopeBlob()), dict)
		}
		start := len(index)
		index = indexPrefixes(index, &a, b, it.GetTopic(), it.GetPrincipal(), it.GetCorrelationId(), it.GetTraceId())
		enc[i] = encoded{
			rec:    a.copy(v),
			format: format,
			keys:   itemKeys(&a, b, pos{}, it.GetMessageId()),
			index:  index[start:len(index):len(index)],
		}
	}
	return enc
}

// dictionary returns the store's compression dictionary, making it from items if the store has none yet and they
// are enough, and nil if it still has none. A dictionary made here is durable before it is returned: every
// record compressed with it is written after it.
func (s *Store) dictionary(items []*mailboxv1.MailboxItem) (*s2.Dict, error) {
	if d := s.dict.Load(); d != nil {
		return d, nil
	}
	s.dictMu.Lock()
	defer s.dictMu.Unlock()
	if d := s.dict.Load(); d != nil {
		return d, nil
	}
	d := makeDict(items)
	if d == nil {
		return nil, nil
	}
	// Synced (SyncWrites) like every commit; a crash before the first record using it leaves it unused. The
	// transaction reads nothing: its read timestamp does not matter.
	if s.closed.Load() {
		return nil, fmt.Errorf("write: %w", badger.ErrDBClosed)
	}
	txn := s.db.NewTransactionAt(0, true)
	defer txn.Discard()
	if err := txn.Set(s.box.dictKey(), d.Bytes()); err != nil {
		return nil, fmt.Errorf("write: store the compression dictionary: %w", err)
	}
	if err := txn.CommitAt(s.owner.nextTs(), nil); err != nil {
		return nil, fmt.Errorf("write: store the compression dictionary: %w", err)
	}
	s.dict.Store(d)
	return d, nil
}

// flight is a group sent to Badger. done closes once it is durable (err nil) or failed; applied says a failed one
// was stored all the same (only the flight before it failed).
type flight struct {
	ids     map[string]struct{} // message ids it stores, for the dedup of the group after it
	own     meta                // what it adds to the counters: events, bytes and bounds of its items
	seq     uint64              // the last sequence number it uses
	span    uint64              // the widest block span as of it
	done    chan struct{}
	err     error
	applied bool
}

// sendGroup fills a transaction with group and sends it to Badger behind the flight already there; it must be
// called with wmu held.
func (s *Store) sendGroup(group []*writeReq) {
	for _, r := range group {
		r.taken = true
	}
	// The transaction reads as of the last applied commit: everything before the last flight sent must be in.
	if b := s.before; b != nil {
		<-b.done
		if b.err != nil {
			s.settle()
		} else {
			s.before = nil
		}
	}
	prev := s.inflight
	txn, done, err := s.begin(true)
	if err != nil {
		for _, r := range group {
			r.err = fmt.Errorf("write: %w", err)
		}
		return
	}
	defer done()
	m := s.wm
	n := 0
	for _, r := range group {
		n += len(r.items)
	}
	f := &flight{ids: make(map[string]struct{}, n), done: make(chan struct{})}
	res, batches, stored, overlap, err := fill(txn, group, prev, s.wfloor, &m, f)
	if err == nil && stored > 0 {
		err = txn.Set(s.box.metaKey(), m.encode())
	}
	if errors.Is(err, badger.ErrTxnTooBig) {
		s.settle()
		s.writeEach(group)
		return
	}
	if err == nil && overlap {
		// Items were counted as duplicates of prev's: the group stands only once prev is durable.
		<-prev.done
		if prev.err != nil {
			s.settle()
			err = fmt.Errorf("write: an earlier write this one depends on failed: %w", prev.err)
		}
	}
	if err != nil || stored == 0 {
		for i, r := range group {
			if err != nil {
				r.err = err
			} else {
				r.res = res[i]
			}
		}
		return
	}
	f.seq, f.span = m.seq, m.span
	s.wm = m
	s.before, s.inflight = prev, f
	for i, r := range group {
		r.res, r.f = res[i], f
	}
	hold := s.heldCommit
	ts := s.owner.nextTs()
	if s.heldSend != nil {
		s.heldSend()
	}
	_ = txn.CommitAt(ts, func(err error) {
		if err == nil && hold != nil {
			hold()
		}
		// Published in order: prev's counters and snapshot come first.
		if prev != nil {
			<-prev.done
		}
		switch {
		case err != nil:
			f.err = fmt.Errorf("write: commit: %w", err)
		case prev.failed():
			f.applied = true
			f.err = fmt.Errorf("write: an earlier write this one's counters include failed: %w", prev.err)
			// Its items are in Badger but published by no snapshot of this group: the head leaves them to Badger.
			s.lowerHead(batches)
		default:
			// Built here, on Badger's callback, not under the write lock.
			s.publishWith(m, ts, newSegment(group, batches))
		}
		close(f.done)
	})
}

// failed says if f (nil: none) is done and failed.
func (f *flight) failed() bool { return f != nil && f.err != nil }

// settle waits for the flights in Badger, so that what runs next under wmu reads and writes the store as it is on
// disk; it must be called with wmu held. After a failed flight the counters start again from the last durable
// ones, plus what a flight sent behind it stored all the same (its items are there; its meta counted the failed
// flight's too, so the corrected meta is written at once, and again by the next write). Sequence numbers are
// never handed out twice, used or not.
func (s *Store) settle() {
	flights := [2]*flight{s.before, s.inflight}
	s.before, s.inflight = nil, nil
	last := flights[1]
	if last == nil {
		return
	}
	<-last.done // done after the flight before it
	if last.err == nil {
		return
	}
	wm := s.meta()
	fix := false
	for _, f := range flights {
		if !f.failed() {
			continue
		}
		wm.seq, wm.span = max(wm.seq, f.seq), max(wm.span, f.span)
		if f.applied && f.own.events > 0 {
			wm.events += f.own.events
			wm.bytes += f.own.bytes
			wm.widen(f.own.oldest)
			wm.widen(f.own.newest)
			fix = true
		}
	}
	s.wm = wm
	if fix {
		if err := s.writeMeta(wm); err != nil {
			s.log.Warn("rewrite the counters after a failed write", "err", err)
		}
	}
}

// writeMeta commits m as the store's meta and publishes it; it must be called with wmu held and nothing in
// flight.
func (s *Store) writeMeta(m meta) error {
	txn, done, err := s.begin(true)
	if err != nil {
		return err
	}
	defer done()
	if err := txn.Set(s.box.metaKey(), m.encode()); err != nil {
		return err
	}
	ts := s.owner.nextTs()
	if err := txn.CommitAt(ts, nil); err != nil {
		return err
	}
	s.publish(m, ts)
	return nil
}

// fill drops group's items older than floor, dedups the others (against each other, the flight prev that txn
// cannot see, and txn) and sets the keys of the new ones in txn, with a posting block per indexed value across
// the group's batches, advancing m and recording their ids and counts in f. batches are the positions of each
// batch's items (zero: not stored); overlap says an item was a duplicate of prev's.
func fill(txn *badger.Txn, group []*writeReq, prev *flight, floor int64, m *meta, f *flight) (res []WriteResult, batches [][]pos, stored int, overlap bool, err error) {
	res = make([]WriteResult, len(group))
	ids := f.ids
	f.own.oldest, f.own.newest = 1, 0 // no bounds yet
	var blocks blockWriter
	for b, r := range group {
		// ps[i] is item i's position, zero (no item's: its sequence would be the largest) if it is not stored.
		ps := make([]pos, len(r.items))
		blocks.batches = append(blocks.batches, ps)
		for i, it := range r.items {
			if it.GetTimestamp() < floor {
				res[b].Expired++
				continue
			}
			id := it.GetMessageId()
			if _, dup := ids[id]; dup {
				res[b].Duplicates++
				continue
			}
			if prev != nil {
				if _, dup := prev.ids[id]; dup {
					res[b].Duplicates++
					overlap = true
					continue
				}
			}
			e := r.enc[i]
			_, found, err := lookupPos(txn, e.keys[1])
			if err != nil {
				return nil, nil, 0, false, fmt.Errorf("write: dedup %q: %w", id, err)
			}
			if found {
				res[b].Duplicates++
				continue
			}
			ids[id] = struct{}{}
			m.seq++
			p := makePos(it.GetTimestamp(), m.seq)
			ps[i] = p
			copy(e.keys[0][boxLen+1:], p[:])
			if err := txn.SetEntry(badger.NewEntry(e.keys[0], e.rec).WithMeta(e.format)); err != nil {
				return nil, nil, 0, false, fmt.Errorf("write %q: %w", id, err)
			}
			if err := txn.Set(e.keys[1], p[:]); err != nil {
				return nil, nil, 0, false, fmt.Errorf("write %q: %w", id, err)
			}
			m.events++
			m.bytes += int64(len(it.GetEnvelopeBlob()))
			m.widen(it.GetTimestamp())
			f.own.events++
			f.own.bytes += int64(len(it.GetEnvelopeBlob()))
			f.own.widen(it.GetTimestamp())
			res[b].Stored++
			stored++
		}
	}
	if err := blocks.set(txn, group, m); err != nil {
		return nil, nil, 0, false, err
	}
	return res, blocks.batches, stored, overlap, nil
}

// blockWriter sets the posting blocks of a group, their keys and values carved out of one arena. A group's
// batches are the different partitions' of one moment, and a value repeats across them as it does in the data
// (a request's or a trace's events spread over the partitions when produced round-robin): one block per value
// and group, not per batch, is what makes a value's repeats cost one key.
type blockWriter struct {
	batches [][]pos // per batch of the group, its items' positions (zero: not stored)
	a       arena
	refs    []pos // a list's positions, sorted
	run     []pos // one batch's share of them
	merged  []pos // refs and run merged
	buf     []byte
}

// set sets the posting blocks of group, whose items are at w.batches, widening m.span: per posting-list prefix,
// the sorted positions of every batch's stored items with it, cut into runs spanning at most maxBlockSpan and at
// most the group's widest batch or meta.span, whichever is wider, so merging batches (a lagging partition's
// beside a current one's) never widens meta.span, how far back a walk starting mid-list reads, beyond what one
// batch's blocks would.
func (w *blockWriter) set(txn *badger.Txn, group []*writeReq, m *meta) error {
	limit := min(maxBlockSpan, max(m.span, w.widestBatch()))
	if len(group) == 1 {
		// A batch's valueGroups are already one per prefix.
		for _, vg := range group[0].groups {
			w.refs = appendStored(w.refs[:0], vg.items, w.batches[0])
			slices.SortFunc(w.refs, comparePos)
			if err := w.setList(txn, vg.prefix, limit, m); err != nil {
				return err
			}
		}
		return nil
	}
	c := chainsPool.Get().(*chains)
	defer chainsPool.Put(c)
	c.link(group)
	for _, l := range c.lists {
		w.refs = w.refs[:0]
		var prefix []byte
		for at := l.first; at >= 0; at = c.links[at].next {
			x := c.links[at]
			vg := group[x.batch].groups[x.group]
			prefix = vg.prefix
			// Each batch's positions sorted on their own, then merged: batches of partitions produced
			// round-robin interleave, which a sort of the whole would pay for in comparisons.
			w.run = appendStored(w.run[:0], vg.items, w.batches[x.batch])
			slices.SortFunc(w.run, comparePos)
			if len(w.refs) == 0 || len(w.run) == 0 || comparePos(w.refs[len(w.refs)-1], w.run[0]) < 0 {
				w.refs = append(w.refs, w.run...)
				continue
			}
			w.merged = mergePos(w.merged[:0], w.refs, w.run)
			w.refs, w.merged = w.merged, w.refs
		}
		if err := w.setList(txn, prefix, limit, m); err != nil {
			return err
		}
	}
	return nil
}

// mergePos appends to dst the sorted positions a and b, merged in order.
func mergePos(dst, a, b []pos) []pos {
	for len(a) > 0 && len(b) > 0 {
		if comparePos(a[0], b[0]) < 0 {
			dst, a = append(dst, a[0]), a[1:]
		} else {
			dst, b = append(dst, b[0]), b[1:]
		}
	}
	return append(append(dst, a...), b...)
}

// setList sets the blocks of prefix's list holding the positions w.refs, sorted, runs of them spanning at most
// limit.
func (w *blockWriter) setList(txn *badger.Txn, prefix []byte, limit uint64, m *meta) error {
	return splitBlocks(w.refs, limit, func(run []pos) error {
		m.span = max(m.span, blockSpan(run))
		w.buf = appendBlock(w.buf[:0], run)
		if err := txn.Set(blockKey(&w.a, prefix, run[0]), w.a.copy(w.buf)); err != nil {
			return fmt.Errorf("write posting block: %w", err)
		}
		return nil
	})
}

// appendStored appends to dst the positions in ps of items that are stored (not zero).
func appendStored(dst []pos, items []int, ps []pos) []pos {
	for _, i := range items {
		if ps[i] != (pos{}) {
			dst = append(dst, ps[i])
		}
	}
	return dst
}

// widestBatch is the longest time between two stored items of one batch of the group, in milliseconds: at most
// what a batch's own blocks would span. Cut at that (greedy cutting makes the fewest runs), a value's items
// merged from several batches make no more blocks than the batches' own would, and a group of one batch is cut
// only at maxBlockSpan, as if it had blocks of its own.
func (w *blockWriter) widestBatch() uint64 {
	var widest uint64
	for _, ps := range w.batches {
		lo, hi := ^uint64(0), uint64(0)
		for _, p := range ps {
			if p != (pos{}) {
				lo, hi = min(lo, p.invTs()), max(hi, p.invTs())
			}
		}
		if lo <= hi {
			widest = max(widest, hi-lo)
		}
	}
	return widest
}

// chains chains the valueGroups of a group's batches list by list: the valueGroups with one prefix, in queue
// order. Pooled: a runner's stores share a few instead of each keeping its largest.
type chains struct {
	at    map[string]int32 // prefix -> its list
	lists []struct{ first, last int32 }
	links []link // one per valueGroup of the group
}

// link is a batch's valueGroup in its list's chain.
type link struct {
	batch, group int32
	next         int32 // the list's next valueGroup in links, -1: none
}

var chainsPool = sync.Pool{New: func() any { return &chains{at: map[string]int32{}} }}

// link chains group's valueGroups, lists in order of first appearance.
func (c *chains) link(group []*writeReq) {
	clear(c.at)
	c.lists, c.links = c.lists[:0], c.links[:0]
	for b, r := range group {
		for g, vg := range r.groups {
			at := int32(len(c.links))
			c.links = append(c.links, link{batch: int32(b), group: int32(g), next: -1})
			if l, ok := c.at[vg.key]; ok {
				c.links[c.lists[l].last].next = at
				c.lists[l].last = at
				continue
			}
			c.at[vg.key] = int32(len(c.lists))
			c.lists = append(c.lists, struct{ first, last int32 }{at, at})
		}
	}
}

// writeEach commits the batches of a group too big for one transaction one by one; it must be called with wmu
// held and nothing in flight.
func (s *Store) writeEach(group []*writeReq) {
	for _, r := range group {
		r.res, r.err = s.writeChunk(r)
	}
}

func (s *Store) writeChunk(r *writeReq) (WriteResult, error) {
	res, err := s.writeTxn(r)
	if !errors.Is(err, badger.ErrTxnTooBig) || len(r.items) < 2 {
		return res, err
	}
	half := len(r.items) / 2
	a, err := s.writeChunk(&writeReq{items: r.items[:half], enc: r.enc[:half], groups: groupValues(r.enc[:half])})
	if err != nil {
		return a, err
	}
	b, err := s.writeChunk(&writeReq{items: r.items[half:], enc: r.enc[half:], groups: groupValues(r.enc[half:])})
	return WriteResult{Stored: a.Stored + b.Stored, Duplicates: a.Duplicates + b.Duplicates, Expired: a.Expired + b.Expired}, err
}

// writeTxn writes one batch in one synchronous transaction; it must be called with wmu held and nothing in
// flight.
func (s *Store) writeTxn(r *writeReq) (WriteResult, error) {
	txn, done, err := s.begin(true)
	if err != nil {
		return WriteResult{}, fmt.Errorf("write: %w", err)
	}
	defer done()
	m := s.wm
	group := []*writeReq{r}
	res, batches, stored, _, err := fill(txn, group, nil, s.wfloor, &m, &flight{ids: map[string]struct{}{}})
	if err != nil {
		return WriteResult{}, err
	}
	if stored == 0 {
		return res[0], nil
	}
	if err := txn.Set(s.box.metaKey(), m.encode()); err != nil {
		return WriteResult{}, fmt.Errorf("write counters: %w", err)
	}
	ts := s.owner.nextTs()
	if err := txn.CommitAt(ts, nil); err != nil {
		return WriteResult{}, fmt.Errorf("write: commit: %w", err)
	}
	s.wm = m
	s.publishWith(m, ts, newSegment(group, batches))
	return res[0], nil
}

// meta returns the counters and floor as of the last durable write or retention pass.
func (s *Store) meta() meta {
	s.mmu.Lock()
	defer s.mmu.Unlock()
	return s.m
}
