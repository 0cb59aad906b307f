package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
)

func openDB(t *testing.T, dir string) *DB {
	t.Helper()
	db, err := OpenDB(DBOptions{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatalf("open database %s: %v", dir, err)
	}
	return db
}

func openIn(t *testing.T, db *DB, id string) *Store {
	t.Helper()
	s, err := db.Open(Options{ID: id, Logger: quiet})
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	return s
}

// TestDBMailboxes checks a database's mailboxes: each store holds only its own items, IDs lists them, one
// dropped is empty when opened again while the others are untouched, and all of it survives a reopen.
func TestDBMailboxes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	for _, id := range []string{"a@p", "b/x@p", "c@p"} {
		s := openIn(t, db, id)
		mustWrite(t, s, item(id+"-1", 1000), item(id+"-2", 2000))
		if _, err := db.Open(Options{ID: id}); err == nil {
			t.Errorf("%s opened twice", id)
		}
		if err := db.Drop(id); err == nil {
			t.Errorf("%s dropped while open", id)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Open(Options{ID: "d@p", Dir: dir}); err == nil {
		t.Error("a store opened through a database took a Dir of its own")
	}
	if err := db.Drop("b/x@p"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	defer db.Close()
	listed, err := db.IDs()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a@p", "c@p"}; !slices.Equal(listed, want) {
		t.Errorf("IDs after a drop and a reopen = %v, want %v", listed, want)
	}
	for _, tc := range []struct {
		id   string
		want []string
	}{
		{"a@p", []string{"a@p-2@2000", "a@p-1@1000"}},
		{"b/x@p", nil},
		{"c@p", []string{"c@p-2@2000", "c@p-1@1000"}},
	} {
		s := openIn(t, db, tc.id)
		resp, err := s.Query(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(resp.GetItems()); !slices.Equal(got, tc.want) {
			t.Errorf("%s holds %v, want %v", tc.id, got, tc.want)
		}
		if st := s.Usage(); st.Events != int64(len(tc.want)) {
			t.Errorf("%s counts %d events, want %d", tc.id, st.Events, len(tc.want))
		}
	}
}

// boxKeys counts the keys of mailbox b in db, whatever store they belong to.
func boxKeys(t *testing.T, db *DB, b box) int {
	t.Helper()
	n := 0
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: b[:], PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitNoKeys waits until mailbox b holds no key in db: its drop has run.
func awaitNoKeys(t *testing.T, db *DB, b box) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); boxKeys(t, db, b) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("mailbox number %d still holds %d keys after its drop", b.num(), boxKeys(t, db, b))
		}
	}
}

// TestQueryMatchesBruteForceSharedDB runs the brute-force property test on several mailboxes of one database at
// once, their writes, retention passes and sweeps interleaved (the same message ids and indexed values in all
// of them): each mailbox answers exactly what was written to it. Then one is dropped and opened again: it is
// empty, its old keys go, and every other mailbox still answers exactly.
func TestQueryMatchesBruteForceSharedDB(t *testing.T) {
	t.Parallel()
	db, err := OpenDB(DBOptions{InMemory: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const mailboxes = 6
	stores := make([]*Store, mailboxes)
	models := make([][]stored, mailboxes)
	t.Run("interleaved", func(t *testing.T) {
		for d := range mailboxes {
			t.Run(fmt.Sprintf("mailbox-%d", d), func(t *testing.T) {
				t.Parallel()
				s, err := db.Open(Options{ID: fmt.Sprintf("m%d@p", d), MaxAge: time.Millisecond, Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				stores[d] = s
				sh := smallBatches
				switch d % 3 {
				case 1:
					sh.group = 4
				case 2:
					sh = shape{batch: 300, scale: maxBlockSpan / 8}
				}
				models[d] = bruteForceOn(t, s, d, sh)
			})
		}
	})
	if t.Failed() {
		return
	}

	dropped := stores[0].box
	if keys := boxKeys(t, db, dropped); keys == 0 && len(models[0]) > 0 {
		t.Fatal("the mailbox to drop holds no key")
	}
	must(t, stores[0].Close())
	must(t, db.Drop("m0@p"))
	s, err := db.Open(Options{ID: "m0@p", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.box == dropped {
		t.Fatalf("the mailbox opened again got its dropped number %d", dropped.num())
	}
	resp, err := s.Query(context.Background(), nil)
	if err != nil || len(resp.GetItems()) != 0 || s.Usage().Events != 0 {
		t.Errorf("the mailbox opened again after its drop: %v items, %d events, %v; want empty", ids(resp.GetItems()), s.Usage().Events, err)
	}
	if len(models[0]) > 0 {
		if _, err := s.Get(context.Background(), models[0][0].it.GetMessageId()); !errors.Is(err, ErrNotFound) {
			t.Errorf("get of a dropped item: %v, want ErrNotFound", err)
		}
	}
	awaitNoKeys(t, db, dropped)
	r := rand.New(rand.NewSource(99))
	for d := 1; d < mailboxes; d++ {
		sh := int64(1)
		if d%3 == 2 {
			sh = maxBlockSpan / 8
		}
		checkQueriesScaled(t, r, stores[d], models[d], 40, sh)
	}
}

// TestDropResumesAfterACrash: a drop whose keys were not deleted yet (the process died right after Drop
// returned) finishes on the next OpenDB, and the mailbox stays dropped.
func TestDropResumesAfterACrash(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := OpenDB(DBOptions{Dir: dir, Logger: quiet, holdDrops: true})
	if err != nil {
		t.Fatal(err)
	}
	keep, gone := openIn(t, db, "keep@p"), openIn(t, db, "gone@p")
	mustWrite(t, keep, seqItems(50, 100)...)
	mustWrite(t, gone, seqItems(500, 100)...)
	b := gone.box
	must(t, gone.Close())
	must(t, db.Drop("gone@p"))
	if n := boxKeys(t, db, b); n == 0 {
		t.Fatal("the drop deleted keys while drops were held")
	}
	must(t, db.Close())

	db = openDB(t, dir)
	defer db.Close()
	awaitNoKeys(t, db, b)
	if listed, err := db.IDs(); err != nil || !slices.Equal(listed, []string{"keep@p"}) {
		t.Errorf("IDs after the resumed drop: %v, %v; want only keep@p", listed, err)
	}
	keep = openIn(t, db, "keep@p")
	if n := keep.Usage().Events; n != 50 {
		t.Errorf("the mailbox kept holds %d events, want 50", n)
	}
	// The drop's record goes with its last keys: nothing is left to resume.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := db.bdb.View(func(txn *badger.Txn) error {
			_, err := txn.Get(dropKey(b))
			return err
		})
		if errors.Is(err, badger.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the drop's record is still there: %v", err)
		}
	}
}

// TestReadsDoNotWaitForAnotherMailbox holds mailbox A's write group after it took its commit timestamp and
// before Badger has it (a commit in flight, which an unmanaged Badger makes every new read transaction wait
// for), and checks that mailbox B's queries, Get and Stats answer, its writes and a retention pass complete and
// are read back, and a mailbox opened meanwhile works, all within answerBound; A's write completes once released.
func TestReadsDoNotWaitForAnotherMailbox(t *testing.T) {
	t.Parallel()
	db := openDB(t, t.TempDir())
	defer db.Close()
	a, b := openIn(t, db, "a@p"), openIn(t, db, "b@p")
	mustWrite(t, a, item("a-before", 1000))
	mustWrite(t, b, item("b-before", 1000))

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unhold)
	a.heldSend = func() {
		close(held)
		<-release
	}
	written := make(chan error, 1)
	go func() {
		_, err := a.Write(context.Background(), []*mailboxv1.MailboxItem{item("a-held", 2000)})
		written <- err
	}()
	<-held

	ctx := context.Background()
	steps := []struct {
		name string
		run  func() error
	}{
		{"query b", func() error {
			resp, err := b.Query(ctx, &mailboxv1.EventFilter{Topics: []string{"orders.created"}})
			if got := ids(resp.GetItems()); err == nil && !slices.Equal(got, []string{"b-before@1000"}) {
				return fmt.Errorf("got %v", got)
			}
			return err
		}},
		{"stats b", func() error {
			st, err := b.Stats(ctx)
			if err == nil && st.GetTotalEvents() != 1 {
				return fmt.Errorf("stats %v", st)
			}
			return err
		}},
		{"write b", func() error {
			_, err := b.Write(ctx, []*mailboxv1.MailboxItem{item("b-during", 3000)})
			return err
		}},
		{"read b's write back", func() error {
			resp, err := b.Query(ctx, nil)
			if got := ids(resp.GetItems()); err == nil && !slices.Equal(got, []string{"b-during@3000", "b-before@1000"}) {
				return fmt.Errorf("got %v", got)
			}
			return err
		}},
		{"retention pass on b", func() error {
			b.opts.MaxAge = time.Second
			res, err := b.RetainOnce(ctx, time.UnixMilli(2500))
			if err == nil && res.Deleted != 1 {
				return fmt.Errorf("deleted %d, want 1", res.Deleted)
			}
			if err == nil {
				_, err = b.Sweep(ctx)
			}
			return err
		}},
		{"get on a", func() error {
			if _, err := a.Get(ctx, "a-held"); !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("the held item is visible: %v", err)
			}
			_, err := a.Get(ctx, "a-before")
			return err
		}},
		{"open, write and query c", func() error {
			c, err := db.Open(Options{ID: "c@p", Logger: quiet})
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Write(ctx, []*mailboxv1.MailboxItem{item("c-1", 1)}); err != nil {
				return err
			}
			resp, err := c.Query(ctx, nil)
			if got := ids(resp.GetItems()); err == nil && !slices.Equal(got, []string{"c-1@1"}) {
				return fmt.Errorf("got %v", got)
			}
			return err
		}},
	}
	for _, st := range steps {
		done := make(chan error, 1)
		go func() { done <- st.run() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s while a's write is held: %v", st.name, err)
			}
		case <-time.After(answerBound):
			t.Fatalf("%s did not complete within %v while a's write was held", st.name, answerBound)
		}
	}
	unhold()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, "a-held"); err != nil {
		t.Errorf("a's held item after the release: %v", err)
	}
}

// BenchmarkOpen1000 opens a database holding 1,000 mailboxes (a few items each) and all their stores (closing
// them is not timed): what a runner restarting with 1,000 mailboxes pays before serving them; ms-opendb/op is
// the part OpenDB takes.
func BenchmarkOpen1000(b *testing.B) {
	const mailboxes = 1000
	dir := b.TempDir()
	db, err := OpenDB(DBOptions{Dir: dir, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	for i := range mailboxes {
		s, err := db.Open(Options{ID: fmt.Sprintf("mailbox-%04d@p", i), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Write(context.Background(), seqItems(10, 512)); err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	var openDB time.Duration
	b.ResetTimer()
	for b.Loop() {
		t := time.Now()
		db, err := OpenDB(DBOptions{Dir: dir, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		openDB += time.Since(t)
		ids, err := db.IDs()
		if err != nil || len(ids) != mailboxes {
			b.Fatalf("%d mailboxes listed, %v", len(ids), err)
		}
		for _, id := range ids {
			if _, err := db.Open(Options{ID: id, Logger: quiet}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(openDB.Microseconds())/float64(b.N)/1000, "ms-opendb/op")
}

// TestDBCloseClosesItsStores: closing a database closes the stores still open in it first; their reads and
// writes then fail instead of reaching a closed Badger, and closing them again is harmless.
func TestDBCloseClosesItsStores(t *testing.T) {
	t.Parallel()
	db := openDB(t, t.TempDir())
	s := openIn(t, db, "a@p")
	mustWrite(t, s, item("a", 1))
	must(t, db.Close())
	ctx := context.Background()
	if _, err := s.Write(ctx, []*mailboxv1.MailboxItem{item("b", 2)}); err == nil {
		t.Error("a write to a store of a closed database succeeded")
	}
	if _, err := s.Query(ctx, nil); err == nil {
		t.Error("a query of a store of a closed database succeeded")
	}
	if _, err := s.Stats(ctx); err == nil {
		t.Error("stats of a store of a closed database succeeded")
	}
	if _, err := db.Open(Options{ID: "b@p"}); err == nil {
		t.Error("a store opened in a closed database")
	}
	must(t, s.Close())
}

// TestDropGivesSpaceBack: once a dropped mailbox's keys are deleted and their tombstones compacted, value-log GC
// rewrites the files its envelopes filled and the database's directory shrinks by most of the dropped mailbox's
// share, while the mailbox beside it, whose envelopes the same files held, reads back exactly. GC is run as
// retention runs it, or left to the database's own periodic run (a runner whose mailboxes keep everything runs
// no retention), with the tombstones compacted by Flatten or by the compaction Badger starts at open.
func TestDropGivesSpaceBack(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// reopen is how the database opens once the drop's keys are deleted, reclaim what the test runs then.
		reopen  DBOptions
		reclaim func(t *testing.T, db *DB)
	}{
		{
			// Badger's default L0 threshold, so that no compaction at open merges the tombstones with the
			// items before reclaim sets the discard timestamp.
			name:   "gc as retention runs it",
			reopen: DBOptions{vlogFileSize: 1 << 20},
			reclaim: func(t *testing.T, db *DB) {
				db.bdb.SetDiscardTs(db.discardTs())
				must(t, db.bdb.Flatten(1))
				db.collectGarbage(context.Background())
			},
		},
		{
			name:    "the database's own gc",
			reopen:  DBOptions{vlogFileSize: 1 << 20, l0Tables: 1, gcEvery: 20 * time.Millisecond},
			reclaim: func(*testing.T, *DB) {},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			opts := DBOptions{Dir: dir, Logger: quiet, vlogFileSize: 1 << 20, l0Tables: 1}
			db, err := OpenDB(opts)
			if err != nil {
				t.Fatal(err)
			}
			keep, gone := openIn(t, db, "keep@p"), openIn(t, db, "gone@p")
			// 8 MiB of envelopes over about 9 value-log files, three quarters of them the dropped mailbox's;
			// batches of both interleave, as mailboxes written at once fill the same files.
			kept, dropped := seqItems(500, 4096), seqItems(1500, 4096)
			for i := 0; i < len(kept); i += 50 {
				mustWrite(t, keep, kept[i:i+50]...)
				mustWrite(t, gone, dropped[3*i:3*i+150]...)
			}
			b := gone.box
			must(t, keep.Close())
			must(t, gone.Close())
			// A close flushes the memtable: the items reach a table, which leaves L0 (one L0 table is enough
			// to compact here) so that the drop's tombstones have a level to be merged into.
			must(t, db.Close())
			db, err = OpenDB(opts)
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(30 * time.Second); tablesInL0(db); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the items' table is still in L0 after 30s")
				}
			}
			before := dirBytes(t, dir)
			must(t, db.Drop("gone@p"))
			awaitNoKeys(t, db, b)
			must(t, db.Close())
			tc.reopen.Dir, tc.reopen.Logger = dir, quiet
			db, err = OpenDB(tc.reopen)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			// The dropped share is three quarters of the envelopes; two thirds of it back is the floor
			// asserted. Badger's compactors may be merging the same tables in the background: retry within a
			// bound.
			want := before - before*3/4*2/3
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				tc.reclaim(t, db)
				after := dirBytes(t, dir)
				if after <= want {
					t.Logf("%d bytes on disk, %d after the drop", before, after)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d bytes on disk after dropping three quarters of %d; want at most %d", after, before, want)
				}
			}
			keep = openIn(t, db, "keep@p")
			checkVisible(t, keep, kept, 0)
			for _, it := range kept {
				got, err := keep.Get(context.Background(), it.GetMessageId())
				if err != nil || !proto.Equal(got, it) {
					t.Fatalf("kept item %s reads back as %v, %v", it.GetMessageId(), got, err)
				}
			}
			if n := keep.Usage().Events; n != int64(len(kept)) {
				t.Errorf("the mailbox kept counts %d events, want %d", n, len(kept))
			}
		})
	}
}

// tablesInL0 says whether any of db's tables is in Badger's level 0.
func tablesInL0(db *DB) bool {
	for _, ti := range db.bdb.Tables() {
		if ti.Level == 0 {
			return true
		}
	}
	return false
}

// dirBytes is the size of the database's tables and value-log files in dir (not the memtables' logs, which
// Badger sizes in advance).
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if ext := filepath.Ext(e.Name()); ext == ".sst" || ext == ".vlog" {
			n += info.Size()
		}
	}
	return n
}
