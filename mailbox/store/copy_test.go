package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
)

// randBatches makes n random batches of items with ids starting with prefix, redeliveries included.
func randBatches(r *rand.Rand, prefix string, n int) [][]*mailboxv1.MailboxItem {
	out := make([][]*mailboxv1.MailboxItem, n)
	for b := range out {
		batch := make([]*mailboxv1.MailboxItem, 1+r.Intn(20))
		for i := range batch {
			id := fmt.Sprintf("%s-%d", prefix, r.Intn(20*n+10))
			batch[i] = &mailboxv1.MailboxItem{
				MessageId: id, Timestamp: int64(r.Intn(40)) - 5,
				Topic: pick(r, propTopics), Principal: pick(r, propPrincipals),
				CorrelationId: pick(r, propCorr), TraceId: pick(r, propTrace),
				EnvelopeBlob: propBlob(r, id),
			}
		}
		out[b] = batch
	}
	return out
}

// copyMailbox copies src into mailbox id of dst through a snapshot, in chunks of random size; cut, when set,
// closes and reopens dst mid-copy (a receiver killed and restarted) and resumes from the import's cursor.
func copyMailbox(t *testing.T, r *rand.Rand, src *Store, dst **DB, dir, id string, cut bool) {
	t.Helper()
	sn, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	im, err := (*dst).Import(id)
	if err != nil {
		t.Fatal(err)
	}
	chunks := 0
	for {
		entries, more, err := sn.Next(im.Cursor(), 1+r.Intn(4096))
		if err != nil {
			t.Fatal(err)
		}
		if err := im.Put("snap-1", entries); err != nil {
			t.Fatal(err)
		}
		chunks++
		if !more {
			break
		}
		if cut && chunks == 2 {
			if err := (*dst).Close(); err != nil {
				t.Fatal(err)
			}
			*dst = openDB(t, dir)
			if im, err = (*dst).Import(id); err != nil {
				t.Fatal(err)
			}
			if im.Snapshot() != "snap-1" || im.Cursor() == nil {
				t.Fatalf("resumed import at snapshot %q cursor %q", im.Snapshot(), im.Cursor())
			}
		}
	}
	if err := im.Finish([]Position{{Topic: "t", Partition: 3, Next: 42}}, Recovery{Source: "src", Copied: true}); err != nil {
		t.Fatal(err)
	}
}

// sameMailbox checks that every query (paged to the end), Get and Stats of b equals a's.
func sameMailbox(t *testing.T, r *rand.Rand, a, b *Store, msgIDs []string) {
	t.Helper()
	ctx := context.Background()
	sa, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(sa, sb) {
		t.Fatalf("stats: copy %v, source %v", sb, sa)
	}
	if ua, ub := a.Usage(), b.Usage(); ua.Events != ub.Events || ua.Bytes != ub.Bytes || !ua.Floor.Equal(ub.Floor) {
		t.Fatalf("usage: copy %+v, source %+v", ub, ua)
	}
	for range 60 {
		f := randFilter(r, 1)
		for page := 0; ; page++ {
			ra, errA := a.Query(ctx, f)
			rb, errB := b.Query(ctx, f)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("query %v: copy err %v, source err %v", f, errB, errA)
			}
			if errA != nil {
				break
			}
			if !proto.Equal(ra, rb) {
				t.Fatalf("query %v page %d:\ncopy   %v\nsource %v", f, page, ids(rb.GetItems()), ids(ra.GetItems()))
			}
			if ra.GetNextPageToken() == "" {
				break
			}
			f = proto.CloneOf(f)
			f.PageToken = ra.GetNextPageToken()
		}
	}
	for _, id := range msgIDs {
		ia, errA := a.Get(ctx, id)
		ib, errB := b.Get(ctx, id)
		if errors.Is(errA, ErrNotFound) != errors.Is(errB, ErrNotFound) || !proto.Equal(ia, ib) {
			t.Fatalf("get %s: copy %v (%v), source %v (%v)", id, ib, errB, ia, errA)
		}
	}
}

// TestCopyIsTheSameMailbox is the copy's property: random items written into mailbox A (with retention passes and
// sweeps between), copied into B in another database, possibly cut and resumed, make B answer every query,
// page, Get and Stats as A did at the snapshot; and after both take the same further writes and retention passes
// they still agree, so a copy is the mailbox, not an approximation of it.
func TestCopyIsTheSameMailbox(t *testing.T) {
	t.Parallel()
	for seed := range int64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewSource(seed))
			opts := Options{ID: "ns@p", Logger: quiet, MaxAge: time.Duration(10+r.Intn(20)) * time.Millisecond}
			if seed%2 == 1 {
				opts.MaxSize = int64(20_000 + r.Intn(40_000))
			}
			dbA := openDB(t, t.TempDir())
			defer dbA.Close()
			dirB := t.TempDir()
			dbB := openDB(t, dirB)
			defer func() { dbB.Close() }()
			// B's database has a mailbox of its own, so the copy's number differs from A's.
			other := openIn(t, dbB, "other@q")
			writeBatches(t, other, randBatches(r, "o", 3))
			if err := other.Close(); err != nil {
				t.Fatal(err)
			}
			oa := opts
			a, err := dbA.Open(oa)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			var msgIDs []string
			write := func(stores []*Store, prefix string, n int) {
				for i, batch := range randBatches(r, prefix, n) {
					for _, it := range batch {
						msgIDs = append(msgIDs, it.GetMessageId())
					}
					var first WriteResult
					for j, s := range stores {
						res, err := s.Write(context.Background(), batch)
						if err != nil {
							t.Fatal(err)
						}
						if j == 0 {
							first = res
						} else if res != first {
							t.Fatalf("batch %d: write result %+v, source's %+v", i, res, first)
						}
					}
					if r.Intn(4) == 0 {
						now := time.UnixMilli(int64(r.Intn(40)))
						var first RetentionResult
						for j, s := range stores {
							res, err := s.RetainOnce(context.Background(), now)
							if err != nil {
								t.Fatal(err)
							}
							if j == 0 {
								first = res
							} else if res != first {
								t.Fatalf("retention at %v: %+v, source's %+v", now, res, first)
							}
							if r.Intn(2) == 0 {
								if _, err := s.Sweep(context.Background()); err != nil {
									t.Fatal(err)
								}
							}
						}
					}
				}
			}
			write([]*Store{a}, "a", 10+r.Intn(20))
			copyMailbox(t, r, a, &dbB, dirB, "ns@p", seed%3 == 0)
			b, err := dbB.Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if got := b.Seed(); len(got) != 1 || got[0] != (Position{Topic: "t", Partition: 3, Next: 42}) {
				t.Fatalf("seed %+v", got)
			}
			if rec := b.Recovery(); !rec.Copied || rec.Source != "src" || rec.Incomplete {
				t.Fatalf("recovery record %+v", rec)
			}
			sameMailbox(t, r, a, b, msgIDs)
			write([]*Store{a, b}, "b", 10)
			sameMailbox(t, r, a, b, msgIDs)
			if ids, _ := dbB.IDs(); len(ids) != 2 {
				t.Fatalf("B's mailboxes %v", ids)
			}
		})
	}
}

// TestImportInvisibleUntilFinished: a copy in progress is no mailbox (Open finds the mailbox as it was, empty),
// an import of another snapshot or out of key order is refused, and Abort drops what was received so the next
// import starts from nothing.
func TestImportInvisibleUntilFinished(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewSource(1))
	a, err := Open(Options{InMemory: true, ID: "ns@p", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	writeBatches(t, a, randBatches(r, "a", 5))
	sn, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	db := openDB(t, t.TempDir())
	defer db.Close()
	im, err := db.Import("ns@p")
	if err != nil {
		t.Fatal(err)
	}
	entries, more, err := sn.Next(nil, 2048)
	if err != nil || !more {
		t.Fatalf("first chunk: more %v, %v", more, err)
	}
	if err := im.Put("s1", entries); err != nil {
		t.Fatal(err)
	}
	if err := im.Put("s2", entries[len(entries)-1:]); err == nil {
		t.Fatal("an entry of another snapshot was taken")
	}
	if err := im.Put("s1", entries[:1]); err == nil {
		t.Fatal("an entry before the cursor was taken")
	}
	if on, err := db.Importing("ns@p"); err != nil || !on {
		t.Fatalf("importing %v, %v", on, err)
	}
	s := openIn(t, db, "ns@p")
	if st, _ := s.Stats(context.Background()); st.GetTotalEvents() != 0 {
		t.Fatalf("a partial copy is visible: %v", st)
	}
	if res, _ := s.Query(context.Background(), &mailboxv1.EventFilter{}); len(res.GetItems()) != 0 {
		t.Fatalf("a partial copy is queryable: %v", ids(res.GetItems()))
	}
	if err := im.Finish(nil, Recovery{}); err == nil {
		t.Fatal("finished with the mailbox's store open")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := im.Abort(); err != nil {
		t.Fatal(err)
	}
	awaitNoKeys(t, db, im.box)
	im, err = db.Import("ns@p")
	if err != nil {
		t.Fatal(err)
	}
	if im.Snapshot() != "" || im.Cursor() != nil {
		t.Fatalf("import after abort resumes at %q %q", im.Snapshot(), im.Cursor())
	}
	if err := db.Drop("ns@p"); err != nil {
		t.Fatal(err)
	}
	if on, err := db.Importing("ns@p"); err != nil || on {
		t.Fatalf("drop left the import: %v, %v", on, err)
	}
}

// TestSetRecoverySurvivesReopen: the recovery record is durable and read back on open.
func TestSetRecoverySurvivesReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := openDB(t, dir)
	s := openIn(t, db, "ns@p")
	rec := Recovery{Incomplete: true, Started: time.UnixMilli(5).UTC(), Finished: time.UnixMilli(9).UTC()}
	if err := s.SetRecovery(rec); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	if got := openIn(t, db, "ns@p").Recovery(); got != rec {
		t.Fatalf("recovery record %+v after reopen, want %+v", got, rec)
	}
}

// TestCopyOfAnIncompleteHistoryIsIncomplete: a mailbox built from Kafka without its earlier history, copied, gives a
// copy that says so too, whatever the receiver records.
func TestCopyOfAnIncompleteHistoryIsIncomplete(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewSource(3))
	a, err := Open(Options{InMemory: true, ID: "ns@p", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	writeBatches(t, a, randBatches(r, "a", 3))
	if err := a.SetRecovery(Recovery{Incomplete: true}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	db := openDB(t, dir)
	defer func() { db.Close() }()
	copyMailbox(t, r, a, &db, dir, "ns@q", false)
	if rec := openIn(t, db, "ns@q").Recovery(); !rec.Copied || !rec.Incomplete {
		t.Fatalf("copy's recovery record %+v, want copied and incomplete", rec)
	}
}
