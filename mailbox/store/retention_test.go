package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// rawKeys lists every live key of the store's mailbox by its first byte after the mailbox's number, straight
// from Badger, without that number.
func rawKeys(t *testing.T, s *Store) map[byte][][]byte {
	t.Helper()
	out := map[byte][][]byte{}
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: s.box[:]})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().KeyCopy(nil)[boxLen:]
			out[k[0]] = append(out[k[0]], k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func seqItems(n int, blob int) []*mailboxv1.MailboxItem {
	items := make([]*mailboxv1.MailboxItem, n)
	for i := range items {
		it := item(fmt.Sprintf("m-%05d", i), int64(i))
		it.Topic = fmt.Sprintf("topic-%d", i%3)
		it.Principal = fmt.Sprintf("user-%d", i%7)
		// Random, as an encrypted envelope: stored uncompressed, so the value log holds the sizes the tests
		// reason about.
		it.EnvelopeBlob = make([]byte, blob)
		fillRandom(it.EnvelopeBlob, uint64(i))
		items[i] = it
	}
	return items
}

func fillRandom(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// retain runs a retention pass at now and the sweep after it, as RunRetention does.
func retain(t *testing.T, s *Store, now time.Time) RetentionResult {
	t.Helper()
	res, err := s.RetainOnce(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	swept, err := s.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if swept != res.Deleted {
		t.Errorf("swept %d items, the pass deleted %d", swept, res.Deleted)
	}
	return res
}

// checkOnlyNewest asserts that exactly the items with timestamp >= keepFrom remain, with no stray key of any
// deleted item: primary keys, message-id entries and the positions in all four indexes' posting lists are
// counted from the raw key space.
func checkOnlyNewest(t *testing.T, s *Store, items []*mailboxv1.MailboxItem, keepFrom int64) {
	t.Helper()
	checkVisible(t, s, items, keepFrom)
	var kept, indexRefs int
	for _, it := range items {
		if it.GetTimestamp() >= keepFrom {
			kept++
			indexRefs += 4 // every test item has topic, principal, correlation and trace id
		}
	}
	keys := rawKeys(t, s)
	if got := len(keys[prefixItem]); got != kept {
		t.Errorf("%d primary keys, want %d", got, kept)
	}
	if got := len(keys[prefixMsgID]); got != kept {
		t.Errorf("%d message-id keys, want %d", got, kept)
	}
	refs := postingRefs(t, s)
	if len(refs) != indexRefs {
		t.Errorf("%d positions in posting lists, want %d", len(refs), indexRefs)
	}
	for _, p := range refs {
		if p.ts() < keepFrom {
			t.Errorf("posting list still points at deleted item at %d", p.ts())
		}
	}
}

// postingRefs decodes every posting block of the store and returns all the positions they hold.
func postingRefs(t *testing.T, s *Store) []pos {
	t.Helper()
	var out []pos
	span := s.meta().span
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: s.box.key(prefixPosting)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			var first pos
			copy(first[:], k[len(k)-posLen:])
			err := it.Item().Value(func(v []byte) error {
				var err error
				out, err = decodeBlock(out, first, v, span)
				return err
			})
			if err != nil {
				return fmt.Errorf("block %q: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkVisible asserts that Get, Query (by every index and by time) and Stats show exactly the items with
// timestamp >= keepFrom, whatever keys remain on disk.
func checkVisible(t *testing.T, s *Store, items []*mailboxv1.MailboxItem, keepFrom int64) {
	t.Helper()
	kept := 0
	var newest *mailboxv1.MailboxItem
	for _, it := range items {
		_, err := s.Get(context.Background(), it.GetMessageId())
		if it.GetTimestamp() >= keepFrom {
			kept++
			newest = it
			if err != nil {
				t.Errorf("kept item %s: %v", it.GetMessageId(), err)
			}
		} else if !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted item %s: got %v, want ErrNotFound", it.GetMessageId(), err)
		}
	}
	oldest := items[0]
	filters := map[string]*mailboxv1.EventFilter{
		"time":        {},
		"topic":       {Topics: []string{oldest.GetTopic()}},
		"principal":   {Principals: []string{oldest.GetPrincipal()}},
		"correlation": {CorrelationId: oldest.GetCorrelationId()},
		"trace":       {TraceId: oldest.GetTraceId()},
	}
	for name, f := range filters {
		f.Limit = mesh.MaxQueryLimit
		for tok := "start"; tok != ""; {
			if tok != "start" {
				f.PageToken = tok
			}
			resp, err := s.Query(context.Background(), f)
			if err != nil {
				t.Fatalf("query by %s: %v", name, err)
			}
			for _, it := range resp.GetItems() {
				if it.GetTimestamp() < keepFrom {
					t.Errorf("query by %s returned deleted item %s at %d", name, it.GetMessageId(), it.GetTimestamp())
				}
			}
			tok = resp.GetNextPageToken()
		}
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != int64(kept) {
		t.Errorf("stats: %d events, want %d", st.GetTotalEvents(), kept)
	}
	if kept > 0 && st.GetOldestEvent().AsTime().UnixMilli() != keepFrom {
		t.Errorf("oldest %v, want %d", st.GetOldestEvent().AsTime().UnixMilli(), keepFrom)
	}
	if kept > 0 && st.GetNewestEvent().AsTime().UnixMilli() != newest.GetTimestamp() {
		t.Errorf("newest %v, want %d", st.GetNewestEvent().AsTime().UnixMilli(), newest.GetTimestamp())
	}
	if kept == 0 && (st.GetOldestEvent() != nil || st.GetNewestEvent() != nil) {
		t.Errorf("stats of an emptied store: oldest %v, newest %v", st.GetOldestEvent(), st.GetNewestEvent())
	}
}

func TestRetainByAge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		maxAge   time.Duration
		now      time.Time
		keepFrom int64
	}{
		{"nothing old", time.Hour, time.UnixMilli(999), 0},
		{"half old", 500 * time.Millisecond, time.UnixMilli(1000), 500},
		{"cutoff between milliseconds", 500 * time.Millisecond, time.UnixMilli(1000).Add(300 * time.Microsecond), 501},
		{"everything old", time.Millisecond, time.UnixMilli(5000), 1 << 62},
		{"no max age keeps all", 0, time.UnixMilli(1 << 40), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openMem(t, Options{MaxAge: tc.maxAge})
			s.chunk = 37 // many transactions, one partial
			items := seqItems(1000, 10)
			mustWrite(t, s, items...)
			res := retain(t, s, tc.now)
			wantDeleted := int(min(tc.keepFrom, 1000))
			if res.Deleted != wantDeleted || res.DeletedBytes != int64(wantDeleted*10) {
				t.Errorf("result %+v, want %d deleted, %d bytes", res, wantDeleted, wantDeleted*10)
			}
			checkOnlyNewest(t, s, items, tc.keepFrom)
			if again, err := s.RetainOnce(context.Background(), tc.now); err != nil || again.Deleted != 0 {
				t.Errorf("second pass: %+v, %v", again, err)
			}
		})
	}
}

func TestRetainBySize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		maxSize  int64
		keepFrom int64
	}{
		{"under the bound", 100_000, 0},
		{"exactly at the bound", 10_000, 0},
		{"one byte over keeps 999", 9_999, 1},
		{"keeps the newest 250", 2_500, 750},
		{"keeps the newest 250 with slack", 2_509, 750},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openMem(t, Options{MaxSize: tc.maxSize})
			s.chunk = 64
			items := seqItems(1000, 10)
			mustWrite(t, s, items...)
			retain(t, s, time.UnixMilli(0))
			checkOnlyNewest(t, s, items, tc.keepFrom)
			st, _ := s.Stats(context.Background())
			if st.GetTotalBytes() > tc.maxSize {
				t.Errorf("%d bytes stored, bound %d", st.GetTotalBytes(), tc.maxSize)
			}
		})
	}
}

// TestRetainAgeThenSize: age runs first, then size trims further among the young.
func TestRetainAgeThenSize(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{MaxAge: time.Second, MaxSize: 1000})
	items := seqItems(1000, 10)
	mustWrite(t, s, items...)
	if res := retain(t, s, time.UnixMilli(1500)); res.Deleted != 900 {
		t.Errorf("deleted %d, want 900", res.Deleted)
	}
	checkOnlyNewest(t, s, items, 900)
}

// TestRetainBigBatches crosses Badger's transaction size limit on both write and delete, so both split.
func TestRetainBigBatches(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{MaxAge: time.Millisecond})
	items := seqItems(6000, 1024)
	if res := mustWrite(t, s, items...); res.Stored != len(items) {
		t.Fatalf("stored %d of %d", res.Stored, len(items))
	}
	if res := retain(t, s, time.UnixMilli(1<<40)); res.Deleted != len(items) {
		t.Errorf("deleted %d of %d", res.Deleted, len(items))
	}
	checkOnlyNewest(t, s, items, 1<<62)
}

// TestRedeliveryAfterRetention pins the documented trade-off: a message redelivered after its item aged out is
// dropped as expired, and once the sweep has freed its id it is stored again only with a newer timestamp.
func TestRedeliveryAfterRetention(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{MaxAge: time.Second})
	mustWrite(t, s, item("old", 0))
	retain(t, s, time.UnixMilli(10_000))
	if res := mustWrite(t, s, item("old", 0)); res != (WriteResult{Expired: 1}) {
		t.Errorf("redelivery after retention: %+v, want it expired", res)
	}
	if res := mustWrite(t, s, item("old", 20_000)); res != (WriteResult{Stored: 1}) {
		t.Errorf("same id, newer timestamp: %+v, want it stored", res)
	}
}

// TestFloorDeletesBeforeTheSweep: a pass deletes at once and durably (queries, Get, Stats and writes obey the
// floor, also after a reopen) while every key is still on disk; the sweep then removes them.
func TestFloorDeletesBeforeTheSweep(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mbox")
	s := openDir(t, dir, Options{MaxAge: time.Second})
	items := seqItems(300, 10)
	mustWrite(t, s, items...)
	res, err := s.RetainOnce(context.Background(), time.UnixMilli(1100))
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 100 || res.DeletedBytes != 1000 {
		t.Errorf("pass %+v, want 100 deleted, 1000 bytes", res)
	}
	checkVisible(t, s, items, 100)
	if u := s.Usage(); u != (Usage{Events: 200, Bytes: 2000, Floor: time.UnixMilli(100), Deleted: 100, DeletedBytes: 1000}) {
		t.Errorf("usage after the pass %+v", u)
	}
	if n := len(rawKeys(t, s)[prefixItem]); n != 300 {
		t.Errorf("%d primary keys before the sweep, want all 300", n)
	}
	late := item("late", 99)
	if res := mustWrite(t, s, late); res != (WriteResult{Expired: 1}) {
		t.Errorf("write below the floor: %+v, want it expired", res)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openDir(t, dir, Options{MaxAge: time.Second})
	defer s.Close()
	checkVisible(t, s, items, 100)
	if res := mustWrite(t, s, late); res != (WriteResult{Expired: 1}) {
		t.Errorf("write below the floor after a reopen: %+v, want it expired", res)
	}
	if swept, err := s.Sweep(context.Background()); err != nil || swept != 100 {
		t.Fatalf("sweep: %d, %v; want 100 swept", swept, err)
	}
	checkOnlyNewest(t, s, items, 100)
	if u := s.Usage(); u.Swept != 100 || u.Deleted != 0 || !u.Floor.Equal(time.UnixMilli(100)) {
		t.Errorf("usage after reopen and sweep %+v: want 100 swept, the floor kept", u)
	}
	if swept, err := s.Sweep(context.Background()); err != nil || swept != 0 {
		t.Errorf("second sweep: %d, %v; want nothing left", swept, err)
	}
}

func TestRunRetention(t *testing.T) {
	t.Parallel()
	s := openDir(t, filepath.Join(t.TempDir(), "mbox"), Options{MaxAge: time.Minute})
	defer s.Close()
	mustWrite(t, s, seqItems(100, 2048)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The first tick comes at 50 ms past the max age: half the items go.
	const interval = 5 * time.Millisecond
	clk := clocktesting.NewFakeClock(time.UnixMilli(50).Add(time.Minute - interval))
	go func() {
		s.RunRetention(ctx, interval, clk)
		close(done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("retention loop never started its ticker")
		}
		time.Sleep(time.Millisecond)
	}
	clk.Step(interval)
	for {
		st, err := s.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.GetTotalEvents() == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention loop did not delete: %d events", st.GetTotalEvents())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("RunRetention did not return after cancel")
	}
}

// TestRetainWhileWriting runs a retention pass and its sweep while new items keep arriving: the sweep takes the
// write lock per chunk, and the counters still match the keys on disk afterwards.
func TestRetainWhileWriting(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{MaxAge: time.Second})
	s.chunk = 50
	old := seqItems(2000, 10)
	mustWrite(t, s, old...)
	done := make(chan error)
	var fresh []*mailboxv1.MailboxItem
	for i := range 2000 {
		fresh = append(fresh, item(fmt.Sprintf("new-%d", i), 1_000_000+int64(i)))
	}
	go func() {
		for i := 0; i < len(fresh); i += 100 {
			if _, err := s.Write(context.Background(), fresh[i:i+100]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	res := retain(t, s, time.UnixMilli(1_000_000))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res.Deleted != len(old) {
		t.Errorf("deleted %d, want %d", res.Deleted, len(old))
	}
	keys := rawKeys(t, s)
	st, _ := s.Stats(context.Background())
	if n := len(keys[prefixItem]); n != len(fresh) || st.GetTotalEvents() != int64(n) || len(keys[prefixMsgID]) != n {
		t.Errorf("%d items, %d message ids, counter %d; want %d", n, len(keys[prefixMsgID]), st.GetTotalEvents(), len(fresh))
	}
}

// TestRetentionGivesSpaceBack: once the sweep's tombstones are compacted, value-log GC rewrites the files the
// deleted envelopes filled, and the value log shrinks. (By how much depends on which files Badger's compaction
// has reported garbage for by then; a quarter back, of the three quarters deleted, is the floor asserted.)
func TestRetentionGivesSpaceBack(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mbox")
	opts := Options{MaxAge: time.Second, vlogFileSize: 1 << 20, l0Tables: 1}
	s := openDir(t, dir, opts)
	items := seqItems(2000, 4096) // 8 MiB of envelopes over about 9 value-log files
	for i := 0; i < len(items); i += 100 {
		mustWrite(t, s, items[i:i+100]...)
	}
	before := vlogBytes(t, dir)
	// Compaction is what hands Badger's GC the garbage, when it merges the tombstones with the keys they delete.
	// As time would, the items reach a table of their own before retention runs (a close flushes the memtable),
	// and the tombstones another one, which Flatten then compacts with the first.
	reopen := func(opts Options) {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openDir(t, dir, opts)
	}
	reopen(opts)
	// The items' table leaves L0 (one L0 table is enough to compact here): Flatten below merges levels, and two
	// tables both in L0 are one level to it, which it leaves as they are.
	for deadline := time.Now().Add(30 * time.Second); inL0(s); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the items' table is still in L0 after 30s")
		}
	}
	retain(t, s, time.UnixMilli(1500+1000)) // the oldest 1500 go
	// Badger's default L0 threshold now, so that no compaction at open merges the tombstones with the items
	// before the loop below has set the discard timestamp: Flatten does it after.
	reopen(Options{MaxAge: opts.MaxAge, vlogFileSize: opts.vlogFileSize})
	defer s.Close()
	// Badger's compactors may be merging the same tables in the background; retry until GC has had the whole
	// picture, within a bound (a minute: under -race on a loaded 2-core machine 30 s was once not enough).
	deadline := time.Now().Add(60 * time.Second)
	for {
		s.db.SetDiscardTs(s.owner.discardTs())
		if err := s.db.Flatten(1); err != nil {
			t.Fatal(err)
		}
		s.owner.collectGarbage(context.Background())
		after := vlogBytes(t, dir)
		if after <= before*3/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("value log %d bytes after deleting 75%% of %d bytes; want a quarter of it back at least", after, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	checkOnlyNewest(t, s, items, 1500)
}

// inL0 says whether any of the store's tables is in Badger's level 0.
func inL0(s *Store) bool { return tablesInL0(s.owner) }

func vlogBytes(t *testing.T, dir string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}
