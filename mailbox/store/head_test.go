package store

import (
	"context"
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// headSizes are the head bounds the brute-force tests run under: none (every query in Badger), a few segments
// (the bound moves on every write group, so queries and pages cross it), and the default (everything written
// since the open in the head).
var headSizes = []struct {
	name  string
	bytes int64
}{{"no-head", -1}, {"small-head", 6 << 10}, {"default-head", 0}}

// TestQueryMatchesBruteForceHeadSizes writes random data (random timestamps, so write groups land on both sides
// of the head's bound), reopens the store halfway (the head starts empty, bounded at the newest item) and checks
// random paged queries and Get against the brute force, under each head size.
func TestQueryMatchesBruteForceHeadSizes(t *testing.T) {
	t.Parallel()
	for _, hs := range headSizes {
		for d := range 6 {
			sh := shape{batch: 20, scale: 1, group: 1 + d%3}
			t.Run(fmt.Sprintf("%s-dataset-%d", hs.name, d), func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				r := rand.New(rand.NewSource(int64(d)))
				s := openDir(t, dir, Options{MaxAge: time.Millisecond, headBytes: hs.bytes})
				model := genShaped(t, r, s, "a", sh)
				checkQueries(t, r, s, model, 30)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = openDir(t, dir, Options{MaxAge: time.Millisecond, headBytes: hs.bytes})
				t.Cleanup(func() { _ = s.Close() })
				model = appendModel(model, genShaped(t, r, s, "b", sh))
				if d%2 == 1 {
					floor := int64(r.Intn(40)) - 5
					if _, err := s.RetainOnce(context.Background(), time.UnixMilli(floor).Add(time.Millisecond)); err != nil {
						t.Fatal(err)
					}
					kept := model[:0]
					for _, x := range model {
						if x.it.GetTimestamp() >= floor {
							kept = append(kept, x)
						}
					}
					model = kept
				}
				checkQueries(t, r, s, model, 60)
				for _, x := range model {
					got, err := s.Get(context.Background(), x.it.GetMessageId())
					if err != nil {
						t.Fatalf("get %s: %v", x.it.GetMessageId(), err)
					}
					if !proto.Equal(got, x.it) {
						t.Fatalf("get %s: %v, want %v", x.it.GetMessageId(), got, x.it)
					}
				}
			})
		}
	}
}

// TestPageTokensAcrossHeadEvictions pages through a mailbox while newer items are written between pages, each
// write group evicting older segments from a small head, so the items a token points among move from the head
// to Badger alone between one page and the next: the pages still list exactly what was there when paging began.
func TestPageTokensAcrossHeadEvictions(t *testing.T) {
	t.Parallel()
	for _, f := range []*mailboxv1.EventFilter{
		{Limit: 7},
		{Limit: 5, Topics: []string{"orders.created"}},
		{Limit: 3, Principals: []string{"user-1"}},
	} {
		s := openMem(t, Options{headBytes: 8 << 10})
		var old []*mailboxv1.MailboxItem
		for b := range 10 {
			batch := make([]*mailboxv1.MailboxItem, 10)
			for i := range batch {
				batch[i] = item(fmt.Sprintf("old-%d-%d", b, i), int64(1000+b*10+i))
			}
			mustWrite(t, s, batch...)
			old = append(old, batch...)
		}
		var model []stored
		for i, it := range old {
			model = append(model, stored{it: it, seq: i})
		}
		want := bruteForce(model, proto.CloneOf(f))
		var got []*mailboxv1.MailboxItem
		q := proto.CloneOf(f)
		for page := 0; ; page++ {
			resp, err := s.Query(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, resp.GetItems()...)
			if resp.GetNextPageToken() == "" {
				break
			}
			q.PageToken = resp.GetNextPageToken()
			// Newer items: a write group that evicts the head's oldest segments.
			batch := make([]*mailboxv1.MailboxItem, 10)
			for i := range batch {
				batch[i] = item(fmt.Sprintf("new-%d-%d", page, i), int64(5000+page*10+i))
			}
			mustWrite(t, s, batch...)
		}
		if !equalItems(got, want) {
			t.Errorf("filter %v: pages %v, want %v", f, ids(got), ids(want))
		}
		if b := s.acquireHead(); b.bound == maxPos {
			t.Errorf("filter %v: the head never evicted a segment; the test crosses no bound", f)
		}
	}
}

func equalItems(a, b []*mailboxv1.MailboxItem) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// acquireHead is the head of the current snapshot.
func (s *Store) acquireHead() *headView {
	sn := s.acquire()
	defer s.release(sn)
	return sn.head
}

// TestHeadAnswersWithoutBadger: queries of every kind and Get over what was written since the open are answered
// from the head, never reading Badger; after a reopen, the same queries read Badger (the head starts empty), and
// a query reaching past a small head's bound reads it too.
func TestHeadAnswersWithoutBadger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := func(headBytes int64) (*Store, *atomic.Int64) {
		s := openDir(t, dir, Options{headBytes: headBytes})
		var reads atomic.Int64
		s.readBadger = func() { reads.Add(1) }
		return s, &reads
	}
	s, reads := open(0)
	for b := range 20 {
		batch := make([]*mailboxv1.MailboxItem, 50)
		for i := range batch {
			batch[i] = item(fmt.Sprintf("m-%d-%d", b, i), int64(b*50+i))
			batch[i].CorrelationId = fmt.Sprintf("c-%d", i%7)
			batch[i].TraceId = fmt.Sprintf("t-%d", b)
		}
		mustWrite(t, s, batch...)
	}
	filters := []*mailboxv1.EventFilter{
		{},
		{Limit: 1000},
		{Topics: []string{"orders.created"}},
		{Principals: []string{"user-1"}},
		{CorrelationId: "c-3"},
		{TraceId: "t-7", Limit: 3},
		{StartTime: tsOf(100), EndTime: tsOf(400)},
		{Topics: []string{"orders.created", "nothing"}, CorrelationId: "c-1", StartTime: tsOf(10)},
	}
	answers := map[int][]string{}
	for i, f := range filters {
		var all []string
		q := proto.CloneOf(f)
		for {
			resp, err := s.Query(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ids(resp.GetItems())...)
			if resp.GetNextPageToken() == "" {
				break
			}
			q.PageToken = resp.GetNextPageToken()
		}
		if len(all) == 0 {
			t.Fatalf("filter %v matched nothing: the test would prove nothing", f)
		}
		answers[i] = all
	}
	if _, err := s.Get(context.Background(), "m-3-4"); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("%d reads of Badger for what the head holds, want none", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for _, headBytes := range []int64{0, 6 << 10} {
		s, reads = open(headBytes)
		if headBytes > 0 {
			// Newer items through a small head: the older ones are past its bound.
			for b := range 5 {
				batch := make([]*mailboxv1.MailboxItem, 20)
				for i := range batch {
					batch[i] = item(fmt.Sprintf("n-%d-%d", b, i), int64(5000+b*20+i))
				}
				mustWrite(t, s, batch...)
			}
		}
		got, err := s.Query(context.Background(), &mailboxv1.EventFilter{EndTime: tsOf(1000), Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.GetItems()) != 1000 {
			t.Errorf("head of %d bytes: %d items before 1000, want 1000", headBytes, len(got.GetItems()))
		}
		if reads.Load() == 0 {
			t.Errorf("head of %d bytes: no read of Badger for items the head does not hold", headBytes)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func tsOf(ms int64) *timestamppb.Timestamp { return timestamppb.New(time.UnixMilli(ms)) }

// BenchmarkQueryRecent is a page of the newest items of a topic, of a trace and by time, answered from the head
// and, with no head, from Badger: the CPU a query costs each way, without the waits on Badger's locks that the
// head also spares it.
func BenchmarkQueryRecent(b *testing.B) {
	for _, hs := range []struct {
		name  string
		bytes int64
	}{{"head", 0}, {"badger", -1}} {
		s, err := Open(Options{InMemory: true, Logger: quiet, headBytes: hs.bytes})
		if err != nil {
			b.Fatal(err)
		}
		for g := range 20 {
			batch := make([]*mailboxv1.MailboxItem, 1000)
			for i := range batch {
				batch[i] = item(fmt.Sprintf("m-%d-%d", g, i), int64(g*1000+i))
				batch[i].TraceId = fmt.Sprintf("t-%d", (g*1000+i)/10)
			}
			if _, err := s.Write(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
		}
		for _, f := range []struct {
			name string
			f    *mailboxv1.EventFilter
		}{
			{"topic", &mailboxv1.EventFilter{Topics: []string{"orders.created"}, Limit: 100}},
			{"trace", &mailboxv1.EventFilter{TraceId: "t-1990"}},
			{"time", &mailboxv1.EventFilter{StartTime: tsOf(19_000), EndTime: tsOf(19_500), Limit: 100}},
		} {
			b.Run(hs.name+"/"+f.name, func(b *testing.B) {
				for b.Loop() {
					resp, err := s.Query(context.Background(), f.f)
					if err != nil || len(resp.GetItems()) == 0 {
						b.Fatalf("%v items, %v", len(resp.GetItems()), err)
					}
				}
			})
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
