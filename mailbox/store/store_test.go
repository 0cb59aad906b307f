package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var quiet = slog.New(slog.DiscardHandler)

func openMem(t *testing.T, opts Options) *Store {
	t.Helper()
	opts.InMemory = true
	opts.Logger = quiet
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openDir(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	opts.Dir = dir
	opts.Logger = quiet
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return s
}

func item(id string, ts int64) *mailboxv1.MailboxItem {
	return &mailboxv1.MailboxItem{
		MessageId:     id,
		Timestamp:     ts,
		Topic:         "orders.created",
		Principal:     "user-1",
		CorrelationId: "corr-" + id,
		TraceId:       "trace-" + id,
		ContentType:   "application/protobuf",
		CustomHeaders: map[string]string{"region": "eu"},
		EnvelopeBlob:  []byte("envelope of " + id),
	}
}

func mustWrite(t *testing.T, s *Store, items ...*mailboxv1.MailboxItem) WriteResult {
	t.Helper()
	res, err := s.Write(context.Background(), items)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	return res
}

func TestWriteDedup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		batches [][]*mailboxv1.MailboxItem
		want    []WriteResult
		events  int64
	}{
		{
			name:    "distinct items",
			batches: [][]*mailboxv1.MailboxItem{{item("a", 1), item("b", 2)}},
			want:    []WriteResult{{Stored: 2}},
			events:  2,
		},
		{
			name:    "duplicate within one batch",
			batches: [][]*mailboxv1.MailboxItem{{item("a", 1), item("a", 1), item("b", 2), item("a", 5)}},
			want:    []WriteResult{{Stored: 2, Duplicates: 2}},
			events:  2,
		},
		{
			name:    "redelivery of a stored item",
			batches: [][]*mailboxv1.MailboxItem{{item("a", 1)}, {item("a", 1), item("c", 3)}},
			want:    []WriteResult{{Stored: 1}, {Stored: 1, Duplicates: 1}},
			events:  2,
		},
		{
			name:    "whole batch redelivered",
			batches: [][]*mailboxv1.MailboxItem{{item("a", 1), item("b", 1)}, {item("a", 1), item("b", 1)}},
			want:    []WriteResult{{Stored: 2}, {Duplicates: 2}},
			events:  2,
		},
		{
			name:    "empty batch",
			batches: [][]*mailboxv1.MailboxItem{{}},
			want:    []WriteResult{{}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openMem(t, Options{})
			for i, b := range tc.batches {
				if got := mustWrite(t, s, b...); got != tc.want[i] {
					t.Errorf("batch %d: got %+v, want %+v", i, got, tc.want[i])
				}
			}
			st, err := s.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.GetTotalEvents() != tc.events {
				t.Errorf("total events %d, want %d", st.GetTotalEvents(), tc.events)
			}
			resp, err := s.Query(context.Background(), &mailboxv1.EventFilter{Limit: mesh.MaxQueryLimit})
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(resp.GetItems())) != tc.events {
				t.Errorf("query returned %d items, want %d", len(resp.GetItems()), tc.events)
			}
		})
	}
}

func TestWriteRejectsItemsWithoutID(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	for _, batch := range [][]*mailboxv1.MailboxItem{{item("a", 1), nil}, {item("a", 1), item("", 2)}} {
		if _, err := s.Write(context.Background(), batch); err == nil {
			t.Errorf("write %v: no error", batch)
		}
	}
	if _, err := s.Get(context.Background(), "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a rejected batch stored an item: %v", err)
	}
}

func TestConcurrentWritersStoreEachIDOnce(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	const writers, ids = 8, 200
	var wg sync.WaitGroup
	results := make([]WriteResult, writers)
	for w := range writers {
		wg.Go(func() {
			batch := make([]*mailboxv1.MailboxItem, 0, ids)
			for i := range ids {
				batch = append(batch, item(fmt.Sprintf("id-%d", (i+w*7)%ids), int64(i)))
			}
			for j := 0; j < len(batch); j += 25 {
				res, err := s.Write(context.Background(), batch[j:j+25])
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				results[w].Stored += res.Stored
				results[w].Duplicates += res.Duplicates
			}
		})
	}
	wg.Wait()
	var stored int
	for _, r := range results {
		stored += r.Stored
		if r.Stored+r.Duplicates != ids {
			t.Errorf("writer result %+v does not add up to %d", r, ids)
		}
	}
	if stored != ids {
		t.Errorf("stored %d items in total, want %d", stored, ids)
	}
	st, _ := s.Stats(context.Background())
	if st.GetTotalEvents() != ids {
		t.Errorf("stats: %d events, want %d", st.GetTotalEvents(), ids)
	}
}

func TestGet(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	want := item("m-1", 1700000000000)
	mustWrite(t, s, want, item("m-2", 1700000000001))
	got, err := s.Get(context.Background(), "m-1")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("get: got %v, want %v", got, want)
	}
	if _, err := s.Get(context.Background(), "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get missing: got %v, want ErrNotFound", err)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != 0 || st.GetOldestEvent() != nil || st.GetNewestEvent() != nil {
		t.Errorf("empty store stats: %v", st)
	}
	items := []*mailboxv1.MailboxItem{item("a", 5000), item("b", -20), item("c", 9000), item("d", 100)}
	mustWrite(t, s, items...)
	var bytes int64
	for _, it := range items {
		bytes += int64(len(it.GetEnvelopeBlob()))
	}
	st, err = s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != 4 || st.GetTotalBytes() != bytes {
		t.Errorf("stats counters %d events %d bytes, want 4 and %d", st.GetTotalEvents(), st.GetTotalBytes(), bytes)
	}
	if got := st.GetOldestEvent().AsTime().UnixMilli(); got != -20 {
		t.Errorf("oldest %d, want -20", got)
	}
	if got := st.GetNewestEvent().AsTime().UnixMilli(); got != 9000 {
		t.Errorf("newest %d, want 9000", got)
	}
}

// TestDurableAcrossReopen checks that items, dedup entries and counters survive closing and reopening.
func TestDurableAcrossReopen(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mbox")
	s := openDir(t, dir, Options{})
	mustWrite(t, s, item("a", 1), item("b", 2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openDir(t, dir, Options{})
	defer s.Close()
	if res := mustWrite(t, s, item("a", 1), item("c", 3)); res != (WriteResult{Stored: 1, Duplicates: 1}) {
		t.Errorf("write after reopen: %+v", res)
	}
	st, _ := s.Stats(context.Background())
	if st.GetTotalEvents() != 3 {
		t.Errorf("events after reopen %d, want 3", st.GetTotalEvents())
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Get(context.Background(), id); err != nil {
			t.Errorf("get %s after reopen: %v", id, err)
		}
	}
}

func TestFileModes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mbox")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := openDir(t, dir, Options{MaxAge: time.Hour})
	mustWrite(t, s, item("a", 1))
	if _, err := s.RetainOnce(context.Background(), time.UnixMilli(1).Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var files int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := fileMode
		if d.IsDir() {
			want = dirMode
		} else {
			files++
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, info.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no data files found")
	}
}

// TestParseIndexed checks the hand-written field numbers against the generated MailboxItem and the partial
// parse against a full encode.
func TestParseIndexed(t *testing.T) {
	t.Parallel()
	fields := (&mailboxv1.MailboxItem{}).ProtoReflect().Descriptor().Fields()
	for name, num := range map[string]int{
		"message_id": fieldMessageID, "topic": fieldTopic, "correlation_id": fieldCorrelationID,
		"principal": fieldPrincipal, "trace_id": fieldTraceID,
	} {
		if got := int(fields.ByName(protoreflect.Name(name)).Number()); got != num {
			t.Errorf("field %s is %d in the proto, %d here", name, got, num)
		}
	}
	for _, it := range []*mailboxv1.MailboxItem{item("a", 7), {MessageId: "only-id", EnvelopeBlob: []byte{1, 2}}} {
		x, err := parseIndexed(encodeRecord(it))
		if err != nil {
			t.Fatal(err)
		}
		got := []string{string(x.msgID), string(x.topic), string(x.principal), string(x.corr), string(x.trace)}
		want := []string{it.GetMessageId(), it.GetTopic(), it.GetPrincipal(), it.GetCorrelationId(), it.GetTraceId()}
		if !slices.Equal(got, want) || x.blobLen != len(it.GetEnvelopeBlob()) {
			t.Errorf("parsed %q (blob %d), want %q (blob %d)", got, x.blobLen, want, len(it.GetEnvelopeBlob()))
		}
	}
	if _, err := parseIndexed([]byte{5, 0x0a, 0xff}); err == nil {
		t.Error("truncated record parsed without error")
	}
}

// TestEncodeHeaders: the hand-written encoder writes what proto.Marshal writes, for an item with every header
// set (the test fails when MailboxItem gains a field the encoder does not know).
func TestEncodeHeaders(t *testing.T) {
	t.Parallel()
	full := &mailboxv1.MailboxItem{
		MessageId: "m", Timestamp: -1_700_000_000_000, Topic: "t", ContentType: "ct", SchemaUrl: "su",
		SchemaVersion: "sv", Encryption: "enc", CorrelationId: "c", Principal: "p", Namespace: "ns", TraceId: "tr",
		SpanId: "sp", CustomHeaders: map[string]string{"b": "2", "a": "", "": "empty key"},
	}
	fields := full.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Name() != "envelope_blob" && !full.ProtoReflect().Has(fd) {
			t.Errorf("test item leaves %s unset", fd.Name())
		}
	}
	for _, it := range []*mailboxv1.MailboxItem{full, {}, {MessageId: "only"}} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(it)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendHeaders(nil, it); !bytes.Equal(got, want) {
			t.Errorf("appendHeaders(%v) = %x, proto.Marshal = %x", it, got, want)
		}
		withBlob := proto.CloneOf(it)
		withBlob.EnvelopeBlob = []byte("blob")
		back, err := decodeItem(encodeRecord(withBlob))
		if err != nil || !proto.Equal(back, withBlob) {
			t.Errorf("record round trip of %v: %v, %v", withBlob, back, err)
		}
	}
}

// TestExtremeTimestamps: the order and the oldest/newest ends hold over the whole int64 range.
func TestExtremeTimestamps(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	tss := []int64{math.MinInt64, math.MinInt64 + 1, -1, 0, 1, math.MaxInt64 - 1, math.MaxInt64}
	for i, ts := range tss {
		mustWrite(t, s, item(fmt.Sprint(i), ts))
	}
	resp, err := s.Query(context.Background(), &mailboxv1.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, it := range resp.GetItems() {
		got = append(got, it.GetTimestamp())
	}
	want := slices.Clone(tss)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if o, n := st.GetOldestEvent().AsTime().UnixMilli(), st.GetNewestEvent().AsTime().UnixMilli(); o != math.MinInt64 || n != math.MaxInt64 {
		t.Errorf("oldest %d newest %d, want the int64 extremes", o, n)
	}
	if got := len(rawKeys(t, s)[prefixItem]); got != len(tss) {
		t.Errorf("%d items stored, want %d", got, len(tss))
	}
}

// FuzzDecodeRecord: the hand-written decoder never panics on stored bytes and agrees with proto.Unmarshal
// whenever both accept the headers.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(item("a", 7)))
	f.Add(encodeRecord(&mailboxv1.MailboxItem{}))
	f.Add([]byte{3, 0x12, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, rec []byte) {
		got, err := decodeItem(rec)
		if err != nil {
			return
		}
		hdr, blob, _ := splitRecord(rec)
		want := &mailboxv1.MailboxItem{}
		if proto.Unmarshal(hdr, want) != nil {
			return
		}
		want.ProtoReflect().SetUnknown(nil)
		want.EnvelopeBlob = blob
		if len(want.GetEnvelopeBlob()) == 0 {
			want.EnvelopeBlob, got.EnvelopeBlob = nil, nil
		}
		if !proto.Equal(got, want) {
			t.Fatalf("decodeItem = %v, proto.Unmarshal = %v", got, want)
		}
	})
}

// req is items queued as Write queues them (with the store's dictionary if it has one).
func req(s *Store, items ...*mailboxv1.MailboxItem) *writeReq {
	enc := encodeItems(items, s.box, true, s.dict.Load())
	return &writeReq{items: items, enc: enc, groups: groupValues(enc)}
}

// sendAndWait sends group as one flight, with wmu held as Write holds it, and waits for it.
func sendAndWait(s *Store, group ...*writeReq) {
	s.wmu.Lock()
	s.sendGroup(group)
	s.wmu.Unlock()
	for _, r := range group {
		if r.f != nil {
			<-r.f.done
			if r.f.err != nil {
				r.err = r.f.err
			}
		}
	}
}

// TestWriteGroup: batches committed together keep their own counts, and dedup runs across them in queue order.
func TestWriteGroup(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	mustWrite(t, s, item("stored", 1))
	group := []*writeReq{
		req(s, item("a", 2), item("stored", 1)),
		req(s, item("a", 2), item("b", 3), item("b", 3)),
		req(s, item("c", 4)),
	}
	sendAndWait(s, group...)
	want := []WriteResult{{Stored: 1, Duplicates: 1}, {Stored: 1, Duplicates: 2}, {Stored: 1}}
	for i, r := range group {
		if !r.taken || r.err != nil || r.res != want[i] {
			t.Errorf("batch %d: taken %v, %+v, %v; want %+v", i, r.taken, r.res, r.err, want[i])
		}
	}
	if n := len(rawKeys(t, s)[prefixItem]); n != 4 {
		t.Errorf("%d items stored, want 4", n)
	}
}

// TestGroupPostingBlocks: the items of one indexed value in several batches of a write group go to one posting
// block (one per maxBlockSpan they cover), without the group's duplicates and beside the blocks of earlier
// groups, and a query by the value, paged, returns exactly them, newest first.
func TestGroupPostingBlocks(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	traced := func(id string, ts int64, trace string) *mailboxv1.MailboxItem {
		it := item(id, ts)
		it.TraceId = trace
		return it
	}
	far := int64(5 + maxBlockSpan + 1) // too far from the group's other items to share their block
	mustWrite(t, s, traced("stored", 1, "t1"))
	sendAndWait(s,
		req(s, traced("a", 2, "t1"), traced("stored", 1, "t1"), traced("x", 3, "t2")),
		req(s, traced("b", 5, "t1"), traced("a", 2, "t1")),
		req(s, traced("c", 4, "t1"), traced("far", far, "t1")),
	)
	// Each block's timestamps, blocks in key order (by their newest item).
	want := [][]int64{{far}, {5, 4, 2}, {1}}
	if got := blockTimes(t, s, indexPrefix(s.box, kindTrace, "t1")); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("trace t1's posting blocks hold %v, want %v", got, want)
	}
	if got := blockTimes(t, s, indexPrefix(s.box, kindTopic, "orders.created")); len(got) != 3 || len(got[1]) != 4 {
		t.Errorf("the topic's posting blocks hold %v, want the group's 4 items below maxBlockSpan in one", got)
	}
	var got []string
	f := &mailboxv1.EventFilter{TraceId: "t1", Limit: 2}
	for {
		resp, err := s.Query(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range resp.GetItems() {
			got = append(got, it.GetMessageId())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		f.PageToken = resp.GetNextPageToken()
	}
	if want := []string{"far", "b", "c", "a", "stored"}; !slices.Equal(got, want) {
		t.Errorf("query by trace t1 pages %v, want %v", got, want)
	}

	// A lagging partition's batch beside a current one's: their items of a value stay in separate blocks rather
	// than widen the span a walk seeks back by beyond a batch's.
	span := s.meta().span
	sendAndWait(s,
		req(s, traced("now-1", 1000, "t3"), traced("now-2", 1010, "t3")),
		req(s, traced("late-1", 100, "t3"), traced("late-2", 105, "t3")),
	)
	if want := [][]int64{{1010, 1000}, {105, 100}}; !slices.EqualFunc(blockTimes(t, s, indexPrefix(s.box, kindTrace, "t3")), want, slices.Equal) {
		t.Errorf("trace t3's posting blocks hold %v, want %v", blockTimes(t, s, indexPrefix(s.box, kindTrace, "t3")), want)
	}
	if got, want := s.meta().span, max(span, 10); got != want {
		t.Errorf("widest block span %d ms after the lagging batch, want %d", got, want)
	}
}

// blockTimes returns the timestamps of the positions of each posting block of prefix's list, in key order.
func blockTimes(t *testing.T, s *Store, prefix []byte) [][]int64 {
	t.Helper()
	var out [][]int64
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var first pos
			copy(first[:], it.Item().Key()[len(prefix):])
			var ps []pos
			err := it.Item().Value(func(v []byte) error {
				var err error
				ps, err = decodeBlock(nil, first, v, s.meta().span)
				return err
			})
			if err != nil {
				return err
			}
			ts := make([]int64, len(ps))
			for i, p := range ps {
				ts[i] = p.ts()
			}
			out = append(out, ts)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPipelinedGroupDedupsTheGroupInFlight: the group after a flight is filled while that flight may not be applied
// yet (its transaction blind to it); the flight's ids must still count as stored.
func TestPipelinedGroupDedupsTheGroupInFlight(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	first, second := req(s, item("a", 1), item("b", 2)), req(s, item("b", 2), item("c", 3))
	s.wmu.Lock()
	s.sendGroup([]*writeReq{first})
	if s.inflight != first.f {
		s.wmu.Unlock()
		t.Fatalf("after a send: inflight %p, want the first flight %p", s.inflight, first.f)
	}
	s.sendGroup([]*writeReq{second})
	s.wmu.Unlock()
	for _, r := range []*writeReq{first, second} {
		<-r.f.done
		if r.f.err != nil {
			t.Fatal(r.f.err)
		}
	}
	if want := (WriteResult{Stored: 1, Duplicates: 1}); second.res != want {
		t.Errorf("second group %+v, want %+v", second.res, want)
	}
	if n := len(rawKeys(t, s)[prefixItem]); n != 3 {
		t.Errorf("%d items stored, want 3", n)
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != 3 {
		t.Errorf("stats count %d events, want 3", st.GetTotalEvents())
	}
}

// TestGroupAfterAFailedFlightFails: a group whose dedup and counters assumed the flight before it fails when that
// flight failed, sends nothing, and the next write starts again from what is durable.
func TestGroupAfterAFailedFlightFails(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	mustWrite(t, s, item("a", 1))
	// The state a failed flight of item "b" leaves: its counters and id assumed, its commit failed.
	failed := &flight{ids: map[string]struct{}{"b": {}}, done: make(chan struct{}), err: errors.New("disk gone"), seq: 2}
	close(failed.done)
	s.wmu.Lock()
	s.settle()
	s.inflight = failed
	s.wm.events++
	s.wm.seq++
	s.wmu.Unlock()

	_, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("b", 2), item("c", 3)})
	if err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("write after a failed flight: %v, want the flight's error", err)
	}
	if res := mustWrite(t, s, item("b", 2), item("c", 3)); res != (WriteResult{Stored: 2}) {
		t.Errorf("retry %+v, want both stored", res)
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != 3 || len(rawKeys(t, s)[prefixItem]) != 3 {
		t.Errorf("stats %d events, %d items stored; want 3 and 3", st.GetTotalEvents(), len(rawKeys(t, s)[prefixItem]))
	}
}

// TestGroupDedupsAFlightNotApplied: a group's items whose ids the flight before it stores are duplicates even
// though its transaction cannot see them (that flight is not applied), and the group waits for it to be durable.
func TestGroupDedupsAFlightNotApplied(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	mustWrite(t, s, item("a", 1))
	// A flight of item "b" that Badger has not applied yet.
	inBadger := &flight{ids: map[string]struct{}{"b": {}}, done: make(chan struct{}), seq: 2}
	s.wmu.Lock()
	s.inflight = inBadger
	s.wm.events++
	s.wm.seq++
	s.wmu.Unlock()

	type result struct {
		res WriteResult
		err error
	}
	written := make(chan result, 1)
	go func() {
		res, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("b", 2), item("c", 3)})
		written <- result{res, err}
	}()
	select {
	case r := <-written:
		t.Fatalf("the write returned %+v, %v before the flight it found duplicates in was durable", r.res, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	close(inBadger.done)
	if r := <-written; r.err != nil || r.res != (WriteResult{Stored: 1, Duplicates: 1}) {
		t.Fatalf("write after the flight: %+v, %v; want c stored and b a duplicate", r.res, r.err)
	}
	if _, err := s.Get(context.Background(), "b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get b: %v, want not found: the group must not store what the flight stores", err)
	}
}

// TestGroupBehindAFailedFlight: a group sent behind a flight, sharing no id with it, is stored whole when that
// flight then fails, but its Write fails (its counters counted the failed flight); the next write settles,
// rewriting the counters to what is stored, and they survive a reopen.
func TestGroupBehindAFailedFlight(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openDir(t, dir, Options{})
	mustWrite(t, s, item("a", 1))
	// A flight of item "x" still in Badger, which will fail.
	failing := &flight{ids: map[string]struct{}{"x": {}}, done: make(chan struct{}), seq: 2, span: 0}
	s.wmu.Lock()
	s.inflight = failing
	s.wm.events++
	s.wm.bytes += 100
	s.wm.seq++
	s.wmu.Unlock()

	written := make(chan error, 1)
	go func() {
		_, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("b", 2), item("c", 3)})
		written <- err
	}()
	// The group is sent behind the failing flight, not held back by it.
	for deadline := time.Now().Add(5 * time.Second); ; {
		s.wmu.Lock()
		sent := s.inflight != failing
		s.wmu.Unlock()
		if sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the group was never sent behind the flight")
		}
		time.Sleep(time.Millisecond)
	}
	failing.err = errors.New("disk gone")
	close(failing.done)
	if err := <-written; err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("write behind a failed flight: %v, want the flight's error", err)
	}
	if n := len(rawKeys(t, s)[prefixItem]); n != 3 {
		t.Errorf("%d items stored, want 3 (a, and b and c stored whole)", n)
	}
	if res := mustWrite(t, s, item("b", 2), item("c", 3), item("d", 4)); res != (WriteResult{Stored: 1, Duplicates: 2}) {
		t.Errorf("redelivery %+v, want b and c duplicates, d stored", res)
	}
	// b and c are in Badger and in no head segment: the head's bound leaves them to Badger (head.go).
	resp, err := s.Query(context.Background(), &mailboxv1.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(resp.GetItems()); !slices.Equal(got, []string{"d@4", "c@3", "b@2", "a@1"}) {
		t.Errorf("query after the failed flight: %v, want d c b a", got)
	}
	want := func(s *Store, when string) {
		t.Helper()
		st, err := s.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.GetTotalEvents() != 4 || st.GetOldestEvent().AsTime().UnixMilli() != 1 || st.GetNewestEvent().AsTime().UnixMilli() != 4 {
			t.Errorf("stats %s: %v, want 4 events from 1 to 4", when, st)
		}
		if blob := int64(len(item("a", 1).GetEnvelopeBlob())); st.GetTotalBytes() != 4*blob {
			t.Errorf("stats %s: %d bytes, want %d", when, st.GetTotalBytes(), 4*blob)
		}
	}
	want(s, "after the redelivery")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openDir(t, dir, Options{})
	t.Cleanup(func() { _ = s.Close() })
	want(s, "after a reopen")
	if res := mustWrite(t, s, item("e", 5)); res != (WriteResult{Stored: 1}) {
		t.Errorf("write after a reopen %+v, want e stored", res)
	}
	if n := len(rawKeys(t, s)[prefixItem]); n != 5 {
		t.Errorf("%d items stored, want 5: a sequence number used twice would overwrite an item", n)
	}
}

// TestMetaEncoding: counters, floor and span round-trip, a zero meta has no floor, and meta written by the
// layout before posting lists (versions 1 and 2) is refused as such.
func TestMetaEncoding(t *testing.T) {
	t.Parallel()
	if f := (meta{}).floor(); f != math.MinInt64 {
		t.Errorf("zero meta floor %d, want none (MinInt64)", f)
	}
	for _, floor := range []int64{math.MinInt64, -5, 0, 1_700_000_000_000, math.MaxInt64} {
		m := meta{events: 3, bytes: -1, seq: 9, span: 86_200}
		m.setFloor(floor)
		got, err := decodeMeta(m.encode())
		if err != nil || got != m || got.floor() != floor {
			t.Errorf("floor %d: decoded %+v (floor %d), %v; want %+v", floor, got, got.floor(), err, m)
		}
	}
	for _, old := range [][]byte{{1, 6, 20, 7}, {2, 6, 20, 7, 0}} {
		if _, err := decodeMeta(old); !errors.Is(err, ErrOldLayout) {
			t.Errorf("decodeMeta(%v): %v, want ErrOldLayout", old, err)
		}
	}
	wide := meta{span: maxBlockSpan + 1}
	for _, bad := range [][]byte{nil, {3}, {4, 6, 20, 7, 0, 0}, {3, 6, 20, 7, 0}, wide.encode()} {
		if _, err := decodeMeta(bad); err == nil {
			t.Errorf("decodeMeta(%v) accepted", bad)
		}
	}
}

// TestWriteAfterCloseFails: a write to a closed store is an error for the caller to retry, not a crash.
func TestWriteAfterCloseFails(t *testing.T) {
	t.Parallel()
	s := openDir(t, filepath.Join(t.TempDir(), "mbox"), Options{})
	mustWrite(t, s, item("a", 1))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("b", 2)}); err == nil {
		t.Fatal("write after close succeeded")
	}
}

// TestOpenRefusesOldLayout: a store written before the one-database layout (a Badger per mailbox, its keys
// without a mailbox number, no layout version) or with a newer layout version is refused with ErrOldLayout,
// which names the directory and the way out, rather than opened as empty; so is a mailbox whose meta says it
// was written with per-item index entries.
func TestOpenRefusesOldLayout(t *testing.T) {
	t.Parallel()
	t.Run("a Badger per mailbox", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "mbox")
		bdb, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		v3 := []byte{3, 2, 2, 1, 0, 0} // events 1, bytes 1, seq 1, no floor, no span
		must(t, bdb.Update(func(txn *badger.Txn) error { return txn.Set([]byte("!meta"), v3) }))
		must(t, bdb.Close())
		s, err := Open(Options{Dir: dir, Logger: quiet})
		if err == nil {
			s.Close()
			t.Fatal("a store in the old layout opened")
		}
		if !errors.Is(err, ErrOldLayout) || !strings.Contains(err.Error(), "prism runner rebuild") || !strings.Contains(err.Error(), dir) {
			t.Errorf("open: %v; want ErrOldLayout naming the store and prism runner rebuild", err)
		}
	})
	t.Run("per-item index entries", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "mbox")
		s := openDir(t, dir, Options{ID: "a@p"})
		mustWrite(t, s, item("a", 1))
		v2 := []byte{2, 2, 2, 1, 0} // events 1, bytes 1, seq 1, no floor
		setRaw(t, s, s.box.metaKey(), v2)
		must(t, s.Close())
		s, err := Open(Options{Dir: dir, ID: "a@p", Logger: quiet})
		if err == nil {
			s.Close()
			t.Fatal("a store in the old layout opened")
		}
		if !errors.Is(err, ErrOldLayout) || !strings.Contains(err.Error(), "prism runner rebuild") || !strings.Contains(err.Error(), "a@p") {
			t.Errorf("open: %v; want ErrOldLayout naming the mailbox and prism runner rebuild", err)
		}
	})
}

// setRaw sets key to v in s's database, as a write of s would.
func setRaw(t *testing.T, s *Store, key, v []byte) {
	t.Helper()
	txn := s.db.NewTransactionAt(0, true)
	defer txn.Discard()
	must(t, txn.Set(key, v))
	must(t, txn.CommitAt(s.owner.nextTs(), nil))
}
