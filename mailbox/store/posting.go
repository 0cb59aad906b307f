package store

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	badger "github.com/dgraph-io/badger/v4"
)

// Posting lists (keys.go has the layout). A block is one write group's items with one (index kind, value): its
// key is 'p' kind uvarint(len) value F, where F is the block's first position (its newest item), and its value is
// the other positions in order, delta-encoded:
//
//	uvarint(n-1), then for each position after F: uvarint(invTs - previous invTs) and the sequence's change,
//	uvarint(invSeq - previous invSeq) after a zero time delta (positions strictly increase, so it is
//	positive), else varint of the same as a wrapping difference (the sequence may go either way).
//
// A write group is the batches of the Writes committed together (one per partition claim), so a value's items
// from every partition's batch share a block: a request's or a trace's events, produced round-robin, are spread
// over the partitions. Blocks of one value overlap whenever groups do in time, so a walk cannot just read them in
// key order: a cursor merges them, opening each block once the walk reaches its first position (blockCursor). A
// walk starting mid-list (a page token, an end time) must also open the earlier blocks that reach past its
// start; the span of a block (the time between its first and last position) is what bounds how far back they
// begin. Every write keeps that span at most maxBlockSpan, and at most the time its widest batch covers (or
// meta.span, if wider), splitting a value's items where needed: the batches of a lagging partition and of a
// current one go to separate blocks rather than widen the span. The store records the widest span it has ever
// written (meta.span), so a walk seeks back by that, usually one batch's duration.

// maxBlockSpan is the widest time a block covers, in milliseconds: items further apart than this go to separate
// blocks. It bounds meta.span, and with it how far back a walk starting mid-list reads, when a batch mixes in
// items much older than the rest (a lagging partition, a late producer).
const maxBlockSpan = 10 * 60 * 1000

var errCorruptBlock = errors.New("corrupt posting block")

func (p pos) invTs() uint64  { return binary.BigEndian.Uint64(p[:8]) }
func (p pos) invSeq() uint64 { return binary.BigEndian.Uint64(p[8:]) }

func posOf(invTs, invSeq uint64) pos {
	var p pos
	binary.BigEndian.PutUint64(p[:8], invTs)
	binary.BigEndian.PutUint64(p[8:], invSeq)
	return p
}

// blockSpan is the time between the newest and the oldest of sorted positions, in milliseconds (exact for any
// two timestamps, however far apart).
func blockSpan(ps []pos) uint64 { return ps[len(ps)-1].invTs() - ps[0].invTs() }

// encodeBlock encodes ps, sorted and distinct, as a block's value; ps[0] is the block's key.
func encodeBlock(ps []pos) []byte {
	return appendBlock(make([]byte, 0, binary.MaxVarintLen64+3*(len(ps)-1)), ps)
}

// appendBlock appends encodeBlock(ps) to b.
func appendBlock(b []byte, ps []pos) []byte {
	b = binary.AppendUvarint(b, uint64(len(ps)-1))
	for i := 1; i < len(ps); i++ {
		dts, dseq := ps[i].invTs()-ps[i-1].invTs(), ps[i].invSeq()-ps[i-1].invSeq()
		b = binary.AppendUvarint(b, dts)
		if dts == 0 {
			b = binary.AppendUvarint(b, dseq)
		} else {
			b = binary.AppendVarint(b, int64(dseq))
		}
	}
	return b
}

// decodeBlock appends to dst the positions of the block with first position first and value b: first, then the
// others. It rejects any value encodeBlock cannot have made of positions at most span apart.
func decodeBlock(dst []pos, first pos, b []byte, span uint64) ([]pos, error) {
	n, w := binary.Uvarint(b)
	// Every position after the first takes at least two bytes.
	if w <= 0 || n > uint64(len(b)-w)/2 {
		return dst, errCorruptBlock
	}
	b = b[w:]
	dst = slices.Grow(dst, 1+int(n))
	dst = append(dst, first)
	ts, seq := first.invTs(), first.invSeq()
	for range n {
		dts, w := binary.Uvarint(b)
		if w <= 0 || dts > ^ts {
			return dst, errCorruptBlock
		}
		b = b[w:]
		var dseq uint64
		if dts == 0 {
			if dseq, w = binary.Uvarint(b); w > 0 && (dseq == 0 || dseq > ^seq) {
				return dst, errCorruptBlock // not after the previous position
			}
		} else {
			var d int64
			d, w = binary.Varint(b)
			dseq = uint64(d)
		}
		if w <= 0 {
			return dst, errCorruptBlock
		}
		b = b[w:]
		ts += dts
		seq += dseq
		dst = append(dst, posOf(ts, seq))
	}
	if len(b) != 0 || ts-first.invTs() > span {
		return dst, errCorruptBlock
	}
	return dst, nil
}

// splitBlocks cuts sorted positions into runs spanning at most limit each (greedily, from the newest) and calls fn
// with each run.
func splitBlocks(ps []pos, limit uint64, fn func(run []pos) error) error {
	for len(ps) > 0 {
		n := 1
		for n < len(ps) && ps[n].invTs()-ps[0].invTs() <= limit {
			n++
		}
		if err := fn(ps[:n]); err != nil {
			return err
		}
		ps = ps[n:]
	}
	return nil
}

// blockKey is the key of the block of prefix's list starting at first, carved out of a (nil: allocated on its
// own).
func blockKey(a *arena, prefix []byte, first pos) []byte {
	k := a.alloc(len(prefix) + posLen)
	copy(k[copy(k, prefix):], first[:])
	return k
}

// seekBack is the smallest block key position whose block can hold p or a later position: a block starts at
// most span before its last position.
func seekBack(p pos, span uint64) pos {
	ts := p.invTs()
	if ts < span {
		return pos{}
	}
	return posOf(ts-span, 0)
}

// comparePos orders positions as their bytes do (big-endian halves), comparing two words instead of calling
// bytes.Compare: it runs for every position a write sorts and a query merges.
func comparePos(a, b pos) int {
	return cmp.Or(cmp.Compare(a.invTs(), b.invTs()), cmp.Compare(a.invSeq(), b.invSeq()))
}

// blockCursor walks the positions of one (kind, value) in order, from a start position on, merging its
// overlapping blocks. Blocks are opened in key order, that is by first position, so a position can be returned
// once it is before the next unopened block's first: no block after that holds anything earlier.
type blockCursor struct {
	it     *badger.Iterator
	prefix []byte
	span   uint64
	from   pos
	open   [][]pos // the opened blocks' positions not yet returned, each sorted
	cur    pos
	ok     bool
	err    error
}

// start seeks to the first block that can hold from or a later position and loads the first position.
func (c *blockCursor) start() {
	c.it.Seek(blockKey(nil, c.prefix, seekBack(c.from, c.span)))
	c.advance()
}

// advance loads the next position into cur (ok false at the end or on error).
func (c *blockCursor) advance() {
	c.ok = false
	for {
		best := -1
		for i, o := range c.open {
			if best < 0 || comparePos(o[0], c.open[best][0]) < 0 {
				best = i
			}
		}
		if c.it.ValidForPrefix(c.prefix) {
			item := c.it.Item()
			k := item.Key()
			if len(k) != len(c.prefix)+posLen {
				c.err = fmt.Errorf("posting block key %x: %w", k, errCorruptBlock)
				return
			}
			var first pos
			copy(first[:], k[len(c.prefix):])
			if best < 0 || comparePos(first, c.open[best][0]) < 0 {
				if err := c.load(first, item); err != nil {
					c.err = err
					return
				}
				c.it.Next()
				continue
			}
		}
		if best < 0 {
			return
		}
		o := c.open[best]
		c.cur, c.ok = o[0], true
		if len(o) == 1 {
			c.open = slices.Delete(c.open, best, best+1)
		} else {
			c.open[best] = o[1:]
		}
		return
	}
}

// load opens the block first: its positions from c.from on join the merge.
func (c *blockCursor) load(first pos, item *badger.Item) error {
	var ps []pos
	err := item.Value(func(v []byte) error {
		var err error
		ps, err = decodeBlock(nil, first, v, c.span)
		return err
	})
	if err != nil {
		return fmt.Errorf("posting block %x: %w", first, err)
	}
	i, _ := slices.BinarySearchFunc(ps, c.from, comparePos)
	if ps = ps[i:]; len(ps) > 0 {
		c.open = append(c.open, ps)
	}
	return nil
}
