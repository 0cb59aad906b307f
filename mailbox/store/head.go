package store

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/klauspost/compress/s2"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// The head (docs/architecture.md#mailbox-store) holds a mailbox's newest items in memory, indexed like the store,
// so that a query or Get over them is answered without Badger: no iterator, no Get, none of the locks Badger's
// reads take (its memtable lock, held for tens of milliseconds at each memtable rotation). It is written through:
// every item it holds is also in Badger, committed and synced before the head gets it, so durability, offsets,
// crash recovery, copies and retention are Badger's alone, and the head is rebuilt empty at every open.
//
// The head is a list of segments, one per write group published, each immutable and sorted by position with
// its own postings and message ids. A view of it (a list of segments and a bound) is published with every
// snapshot and never changes, so a read needs no lock to use it. The bound is what makes it exact: every item
// the snapshot holds at a position before the bound is in the view's segments. At open the bound is the newest
// stored item's timestamp (nothing is newer, so nothing before it is missing); evicting a segment lowers it to
// that segment's newest position. A query walks the head while its candidates are before the bound and
// continues in Badger from the bound, so the two together are the primary order exactly once. An item written
// at a position past the bound (a lagging partition's old timestamps) is in its segment but not used by
// queries, which find it in Badger. Get by message id uses every segment whatever the bound: a message id is
// stored at most once.

// Default bounds of a head. The bytes are shared by the database's open stores (DB.headShare); the segments
// bound a query's merge (one cursor per segment and range) when write groups are small.
const (
	defaultHeadBytes = 64 << 20
	maxHeadSegments  = 256
	// headItemOverhead approximates what a segment holds per item beside its record: position, message id
	// and map entries, posting entries.
	headItemOverhead = 96
)

// headSegment is one write group's stored items, sorted by position (newest first).
type headSegment struct {
	ps      []pos
	recs    [][]byte // stored record values (record.go), aliasing the group's arenas
	formats []byte
	ids     map[string]int32   // message id -> index
	post    map[string][]int32 // posting-list prefix (indexPrefix) -> indexes, ascending
	size    int64
}

// newSegment builds the segment of group, whose batches' items are at positions batches (zero: not stored); nil
// if it stored nothing.
func newSegment(group []*writeReq, batches [][]pos) *headSegment {
	type ref struct{ b, i int32 }
	var refs []ref
	for b, ps := range batches {
		for i, p := range ps {
			if p != (pos{}) {
				refs = append(refs, ref{int32(b), int32(i)})
			}
		}
	}
	if len(refs) == 0 {
		return nil
	}
	slices.SortFunc(refs, func(x, y ref) int { return comparePos(batches[x.b][x.i], batches[y.b][y.i]) })
	n := len(refs)
	seg := &headSegment{
		ps: make([]pos, n), recs: make([][]byte, n), formats: make([]byte, n),
		ids: make(map[string]int32, n), post: make(map[string][]int32),
	}
	rank := make([][]int32, len(batches))
	for b := range rank {
		rank[b] = make([]int32, len(batches[b]))
	}
	for k, x := range refs {
		r := group[x.b]
		e := r.enc[x.i]
		seg.ps[k] = batches[x.b][x.i]
		seg.recs[k], seg.formats[k] = e.rec, e.format
		seg.ids[r.items[x.i].GetMessageId()] = int32(k)
		rank[x.b][x.i] = int32(k)
		seg.size += int64(len(e.rec)) + headItemOverhead
	}
	for b, r := range group {
		for _, vg := range r.groups {
			l := seg.post[vg.key]
			for _, i := range vg.items {
				if batches[b][i] != (pos{}) {
					l = append(l, rank[b][i])
				}
			}
			if len(l) > 0 {
				seg.post[vg.key] = l
			}
		}
	}
	for _, l := range seg.post {
		slices.Sort(l)
	}
	return seg
}

// headView is the head as of one snapshot; it never changes once published.
type headView struct {
	segs  []*headSegment // in the order written
	bound pos            // every item of the snapshot at a position before bound is in segs
	size  int64
}

// maxPos is the largest position: a bound past every item.
var maxPos = pos{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// emptyHead is the head of a store opened with counters m: nothing is newer than its newest item.
func emptyHead(m meta) *headView {
	if m.newest < m.oldest {
		return &headView{bound: maxPos}
	}
	return &headView{bound: makePos(m.newest, ^uint64(0))}
}

// with is h plus seg (nil: none), with the bound lowered to lower, and the oldest segments evicted while the
// head holds more than limit bytes or maxHeadSegments segments.
func (h *headView) with(seg *headSegment, lower pos, limit int64) *headView {
	n := &headView{bound: h.bound, size: h.size}
	if comparePos(lower, n.bound) < 0 {
		n.bound = lower
	}
	n.segs = make([]*headSegment, 0, len(h.segs)+1)
	n.segs = append(n.segs, h.segs...)
	if seg != nil {
		n.segs = append(n.segs, seg)
		n.size += seg.size
	}
	drop := 0
	for drop < len(n.segs) && (n.size > limit || len(n.segs)-drop > maxHeadSegments) {
		old := n.segs[drop]
		if comparePos(old.ps[0], n.bound) < 0 {
			n.bound = old.ps[0]
		}
		n.size -= old.size
		drop++
	}
	n.segs = n.segs[drop:]
	return n
}

// get returns the position and value of the item with message id id, if the head holds it.
func (h *headView) get(id string) (pos, itemValue, bool) {
	for i := len(h.segs) - 1; i >= 0; i-- {
		seg := h.segs[i]
		if k, ok := seg.ids[id]; ok {
			return seg.ps[k], itemValue{b: seg.recs[k], format: seg.formats[k]}, true
		}
	}
	return pos{}, itemValue{}, false
}

// headCursor walks one segment's items, all of them (list nil) or one posting list's, from a position on.
type headCursor struct {
	seg  *headSegment
	list []int32
	at   int
}

func (c *headCursor) valid() bool {
	if c.list != nil {
		return c.at < len(c.list)
	}
	return c.at < len(c.seg.ps)
}

func (c *headCursor) index() int32 {
	if c.list != nil {
		return c.list[c.at]
	}
	return int32(c.at)
}

func (c *headCursor) cur() pos { return c.seg.ps[c.index()] }

// seek places c at its first item not before from.
func (c *headCursor) seek(from pos) {
	ps := c.seg.ps
	if c.list != nil {
		c.at = sort.Search(len(c.list), func(i int) bool { return comparePos(ps[c.list[i]], from) >= 0 })
		return
	}
	c.at = sort.Search(len(ps), func(i int) bool { return comparePos(ps[i], from) >= 0 })
}

// headHeap orders cursors by their current position, the newest first.
type headHeap []*headCursor

func (h headHeap) less(i, j int) bool { return comparePos(h[i].cur(), h[j].cur()) < 0 }

func (h headHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// run answers pl from the head into resp as far as the head's bound: done says the answer is complete (the page
// is full, with its next page token if more match, or the range ends before the bound); otherwise the rest is in
// Badger from the bound on, and last is the position of the last item put in resp.
func (h *headView) run(ctx context.Context, pl *plan, dict *s2.Dict, resp *mailboxv1.QueryEventsResponse) (done bool, last pos, err error) {
	if comparePos(pl.from, h.bound) >= 0 {
		return false, last, nil
	}
	var cs headHeap
	for _, seg := range h.segs {
		if len(pl.ranges) == 0 {
			c := &headCursor{seg: seg}
			if c.seek(pl.from); c.valid() {
				cs = append(cs, c)
			}
			continue
		}
		for _, pr := range pl.ranges {
			l, ok := seg.post[string(pr)]
			if !ok {
				continue
			}
			c := &headCursor{seg: seg, list: l}
			if c.seek(pl.from); c.valid() {
				cs = append(cs, c)
			}
		}
	}
	for i := len(cs)/2 - 1; i >= 0; i-- {
		cs.down(i)
	}
	var buf []byte
	for n := 0; len(cs) > 0; n++ {
		if n%256 == 0 {
			if err := ctx.Err(); err != nil {
				return false, last, err
			}
		}
		c := cs[0]
		p := c.cur()
		if comparePos(p, h.bound) >= 0 {
			break
		}
		if bytes.Compare(p[:8], pl.last[:]) > 0 {
			return true, last, nil // older than the start of the range, as is everything after it
		}
		k := c.index()
		rec, err := itemValue{b: c.seg.recs[k], format: c.seg.formats[k], dict: dict}.record(&buf)
		if err != nil {
			return false, last, fmt.Errorf("read %x: %w", p, err)
		}
		matched := true
		if pl.needsHeaders() {
			x, err := parseIndexed(rec)
			if err != nil {
				return false, last, fmt.Errorf("read %x: %w", p, err)
			}
			matched = pl.matches(x)
		}
		if matched {
			if len(resp.Items) == pl.limit {
				resp.NextPageToken = encodePageToken(last)
				return true, last, nil
			}
			it, err := decodeItem(rec)
			if err != nil {
				return false, last, fmt.Errorf("read %x: %w", p, err)
			}
			resp.Items = append(resp.Items, it)
			last = p
		}
		if c.at++; !c.valid() {
			cs[0] = cs[len(cs)-1]
			cs = cs[:len(cs)-1]
		}
		cs.down(0)
	}
	// Nothing is at the bound or after it when it is the last position (no sequence number is 0), nor in range
	// when the bound is already older than the range's start.
	return h.bound == maxPos || bytes.Compare(h.bound[:8], pl.last[:]) > 0, last, nil
}
