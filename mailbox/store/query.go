package store

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// plan is how one query runs: the index ranges to merge (none means the primary order), the position range,
// and the predicates the ranges do not already guarantee.
type plan struct {
	ranges [][]byte // index prefixes; empty: walk the primary order
	from   pos      // first position to consider (inclusive)
	// last is the largest acceptable timestamp inverse: a position whose first 8 bytes exceed it is older than
	// the start of the time range, and so is every position after it.
	last       [8]byte
	limit      int
	topics     map[string]struct{}
	principals map[string]struct{}
	corr       string
	trace      string
	empty      bool // the range holds nothing (e.g. the cursor was already at the very end)
}

// needsHeaders reports whether candidates must be read to be checked.
func (pl *plan) needsHeaders() bool {
	return pl.topics != nil || pl.principals != nil || pl.corr != "" || pl.trace != ""
}

func (pl *plan) matches(x indexed) bool {
	if pl.topics != nil {
		if _, ok := pl.topics[string(x.topic)]; !ok {
			return false
		}
	}
	if pl.principals != nil {
		if _, ok := pl.principals[string(x.principal)]; !ok {
			return false
		}
	}
	if pl.corr != "" && string(x.corr) != pl.corr {
		return false
	}
	return pl.trace == "" || string(x.trace) == pl.trace
}

func invalid(param, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidFilter, param, fmt.Sprintf(format, a...))
}

// ceilMillis is the smallest whole millisecond not before t: an item at millisecond ms is at or after t exactly
// when ms >= ceilMillis(t), and before t exactly when ms < ceilMillis(t).
func ceilMillis(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.After(time.UnixMilli(ms)) {
		ms++
	}
	return ms
}

func setOf(param string, vals []string) (map[string]struct{}, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	if len(vals) > mesh.MaxFilterValues {
		return nil, invalid(param, "at most %d values, got %d", mesh.MaxFilterValues, len(vals))
	}
	m := make(map[string]struct{}, len(vals))
	for _, v := range vals {
		m[v] = struct{}{}
	}
	return m, nil
}

func sortedKeys(m map[string]struct{}) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// planQuery validates f and picks the most selective index: an equality on correlation or trace id (a handful
// of items), else the principals (thousands of values, few items each), else the topics (few values, many items
// each), else the primary time order. The chosen index's predicate is dropped from the residual filters; the
// time range always bounds the walk because every index key ends with the position.
func planQuery(b box, f *mailboxv1.EventFilter) (*plan, error) {
	pl := &plan{limit: mesh.DefaultQueryLimit, corr: f.GetCorrelationId(), trace: f.GetTraceId()}
	switch l := f.GetLimit(); {
	case l < 0:
		return nil, invalid("limit", "must not be negative, got %d", l)
	case l > mesh.MaxQueryLimit:
		pl.limit = mesh.MaxQueryLimit
	case l > 0:
		pl.limit = int(l)
	}
	endMs, startMs := int64(math.MaxInt64), int64(math.MinInt64)
	if t := f.GetEndTime(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, invalid("end_time", "%v", err)
		}
		endMs = ceilMillis(t.AsTime())
	}
	if t := f.GetStartTime(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, invalid("start_time", "%v", err)
		}
		startMs = ceilMillis(t.AsTime())
	}
	if f.GetStartTime() != nil && f.GetEndTime() != nil && !f.GetStartTime().AsTime().Before(f.GetEndTime().AsTime()) {
		return nil, invalid("start_time", "must be before end_time")
	}
	if startMs >= endMs || endMs == math.MinInt64 {
		pl.empty = true // a range narrower than one millisecond holds no item
		return pl, nil
	}
	// Without an end the walk starts at the very first position (the zero value). With one, it starts at the
	// newest position an item at endMs-1 can have: invTs(endMs-1) followed by the inverse of the largest sequence.
	if f.GetEndTime() != nil {
		pl.from = makePos(endMs-1, math.MaxUint64)
	}
	last := makePos(startMs, 0)
	copy(pl.last[:], last[:8])
	if tok := f.GetPageToken(); tok != "" {
		cur, err := decodePageToken(tok)
		if err != nil {
			return nil, invalid("page_token", "%v", err)
		}
		next, ok := cur.next()
		if !ok {
			pl.empty = true
			return pl, nil
		}
		if bytes.Compare(next[:], pl.from[:]) > 0 {
			pl.from = next
		}
	}
	var err error
	if pl.topics, err = setOf("topics", f.GetTopics()); err != nil {
		return nil, err
	}
	if pl.principals, err = setOf("principals", f.GetPrincipals()); err != nil {
		return nil, err
	}
	switch {
	case pl.corr != "":
		pl.ranges = [][]byte{indexPrefix(b, kindCorrelation, pl.corr)}
		pl.corr = ""
	case pl.trace != "":
		pl.ranges = [][]byte{indexPrefix(b, kindTrace, pl.trace)}
		pl.trace = ""
	case pl.principals != nil:
		for _, v := range sortedKeys(pl.principals) {
			pl.ranges = append(pl.ranges, indexPrefix(b, kindPrincipal, v))
		}
		pl.principals = nil
	case pl.topics != nil:
		for _, v := range sortedKeys(pl.topics) {
			pl.ranges = append(pl.ranges, indexPrefix(b, kindTopic, v))
		}
		pl.topics = nil
	}
	return pl, nil
}

// raiseStart bounds the walk at ts when that is later than the filter's start: the retention floor, below which
// index entries may remain until the sweep removes them but their items are deleted.
func (pl *plan) raiseStart(ts int64) {
	if ts == math.MinInt64 {
		return
	}
	last := makePos(ts, 0)
	if bytes.Compare(last[:8], pl.last[:]) < 0 {
		copy(pl.last[:], last[:8])
	}
}

// cursor walks a mailbox's primary order from pl.from on.
type cursor struct {
	it  *badger.Iterator
	cur pos
	ok  bool
}

func (c *cursor) load() {
	c.ok = c.it.Valid() // the iterator's prefix is the mailbox's primary order
	if c.ok {
		c.cur = posOfItem(c.it.Item().Key())
	}
}

// Query returns items matching f, newest first (timestamp desc, then latest write first), at most clamp(f.Limit)
// of them, and a next_page_token when more remain. The token holds the last position returned, so the next page
// seeks straight past it.
func (s *Store) Query(ctx context.Context, f *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error) {
	if f == nil {
		f = &mailboxv1.EventFilter{}
	}
	pl, err := planQuery(s.box, f)
	if err != nil {
		return nil, err
	}
	resp := &mailboxv1.QueryEventsResponse{}
	if pl.empty {
		return resp, nil
	}
	err = s.viewSnapshot(func(sn *snapshot) error {
		pl.raiseStart(sn.m.floor())
		// The head answers what is before its bound; Badger the rest, from the bound on (head.go).
		done, last, err := sn.head.run(ctx, pl, s.dict.Load(), resp)
		if err != nil || done {
			return err
		}
		if comparePos(pl.from, sn.head.bound) < 0 {
			pl.from = sn.head.bound
		}
		if s.readBadger != nil {
			s.readBadger()
		}
		return s.run(ctx, sn.txn, pl, sn.m.span, resp, last)
	})
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	return resp, nil
}

// run answers pl from Badger into resp, after the items already there, the last of them at lastPos.
func (s *Store) run(ctx context.Context, txn *badger.Txn, pl *plan, span uint64, resp *mailboxv1.QueryEventsResponse, lastPos pos) error {
	// Values are read inline, not prefetched: Badger prefetches on helper goroutines that the query then waits for
	// (in ValueCopy and again in Close), a hand-off that costs a scheduling delay each time the cores are busy
	// with ingest, for a page read from the memory-mapped value log either way.
	var primary *cursor
	var curs []*blockCursor
	defer func() {
		if primary != nil {
			primary.it.Close()
		}
		for _, c := range curs {
			c.it.Close()
		}
	}()
	if len(pl.ranges) == 0 {
		primary = &cursor{it: txn.NewIterator(badger.IteratorOptions{Prefix: s.box.itemPrefix()})}
		primary.it.Seek(s.box.itemKey(pl.from))
		primary.load()
	}
	for _, pr := range pl.ranges {
		c := &blockCursor{it: txn.NewIterator(badger.IteratorOptions{Prefix: pr}), prefix: pr, span: span, from: pl.from}
		curs = append(curs, c)
		c.start()
		if c.err != nil {
			return c.err
		}
	}
	var buf []byte // compressed records are decompressed into it, one at a time
	dict := s.dict.Load()
	for n := 0; ; n++ {
		if n%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		// Merge: the cursor at the smallest position is the newest candidate. An item has one topic and one
		// principal, so no position appears in two ranges.
		var best *blockCursor
		for _, c := range curs {
			if c.ok && (best == nil || comparePos(c.cur, best.cur) < 0) {
				best = c
			}
		}
		var p pos
		var item *badger.Item
		switch {
		case primary != nil && primary.ok:
			p, item = primary.cur, primary.it.Item()
		case best != nil:
			p = best.cur
		default:
			return nil
		}
		if bytes.Compare(p[:8], pl.last[:]) > 0 {
			return nil // older than the start of the range, as is everything after it
		}
		// The record is read in place (Badger's buffer, valid in the callback) and decoded once: decodeItem
		// copies out what the item keeps, so no copy of the whole record is made first.
		matched := true
		var it *mailboxv1.MailboxItem
		if pl.needsHeaders() || len(resp.Items) < pl.limit {
			if item == nil {
				var err error
				if item, err = txn.Get(s.box.itemKey(p)); err != nil {
					return fmt.Errorf("read %x: %w", p, err)
				}
			}
			err := item.Value(func(v []byte) error {
				rec, err := itemValue{v, item.UserMeta(), dict}.record(&buf)
				if err != nil {
					return fmt.Errorf("decode: %w", err)
				}
				if pl.needsHeaders() {
					x, err := parseIndexed(rec)
					if err != nil {
						return fmt.Errorf("decode: %w", err)
					}
					if matched = pl.matches(x); !matched {
						return nil
					}
				}
				if len(resp.Items) == pl.limit {
					return nil
				}
				if it, err = decodeItem(rec); err != nil {
					return fmt.Errorf("decode: %w", err)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("read %x: %w", p, err)
			}
		}
		if primary != nil {
			primary.it.Next()
			primary.load()
		} else if best.advance(); best.err != nil {
			return best.err
		}
		if !matched {
			continue
		}
		if len(resp.Items) == pl.limit {
			// One more match exists beyond the page.
			resp.NextPageToken = encodePageToken(lastPos)
			return nil
		}
		resp.Items = append(resp.Items, it)
		lastPos = p
	}
}
