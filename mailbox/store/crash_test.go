package store

import (
	"bufio"
	"context"
	"fmt"
	"math"
	mrand "math/rand"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

const (
	crashChildEnv  = "PRISM_STORE_CRASH_CHILD_DIR"
	crashBatchSize = 600
	crashMaxBatch  = 2000
)

func crashBatch(b int) []*mailboxv1.MailboxItem {
	items := make([]*mailboxv1.MailboxItem, crashBatchSize)
	for i := range items {
		it := item(fmt.Sprintf("b%04d-%04d", b, i), int64(b*crashBatchSize+i))
		it.EnvelopeBlob = make([]byte, 1024)
		items[i] = it
	}
	return items
}

// TestCrashChild is the writer process of TestKill9; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("only run as TestKill9's child process")
	}
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	for b := range crashMaxBatch {
		if _, err := s.Write(context.Background(), crashBatch(b)); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Println("acked", b) // only after Write returned: the batch must survive what follows
	}
	os.Exit(0)
}

// TestKill9 kills a writing process with SIGKILL and reopens its store: every acknowledged batch is there, the
// counters match the keys on disk, the batch in flight is there whole or not at all, and redelivering it
// completes it without duplicates.
func TestKill9(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mbox")
	// The child exits by itself after crashMaxBatch batches, which bounds the wait for 15.
	acked := killWriterMidBatch(t, "TestCrashChild", crashChildEnv, dir, 15, crashMaxBatch)

	s := openDir(t, dir, Options{})
	defer s.Close()
	ctx := context.Background()
	for b := 0; b <= acked; b++ {
		for _, it := range crashBatch(b) {
			if _, err := s.Get(ctx, it.GetMessageId()); err != nil {
				t.Fatalf("acknowledged item %s lost: %v", it.GetMessageId(), err)
			}
		}
	}
	keys := rawKeys(t, s)
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(keys[prefixItem])); st.GetTotalEvents() != n || int64(len(keys[prefixMsgID])) != n {
		t.Fatalf("after the crash: counter %d, %d items, %d message ids", st.GetTotalEvents(), n, len(keys[prefixMsgID]))
	}
	inFlight := crashBatch(acked + 1)
	res, err := s.Write(ctx, inFlight)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stored+res.Duplicates != crashBatchSize || (res.Duplicates != 0 && res.Duplicates != crashBatchSize) {
		t.Fatalf("redelivery of the batch in flight: %+v; a batch is stored whole or not at all", res)
	}
	st, _ = s.Stats(ctx)
	if want := int64((acked + 2) * crashBatchSize); st.GetTotalEvents() != want {
		t.Errorf("after redelivery %d events, want %d", st.GetTotalEvents(), want)
	}
	t.Logf("killed after %d acknowledged batches; %d items of the next were already stored", acked+1, res.Duplicates)
}

const (
	postingChildEnv   = "PRISM_STORE_POSTING_CRASH_CHILD_DIR"
	postingBatchSize  = 300
	postingMaxBatches = 2000
)

// postingBatch is batch b of TestKill9Postings: values repeated tens of times in the batch, as ingest's are,
// and timestamps that interleave with other batches', so posting blocks overlap.
func postingBatch(b int) []*mailboxv1.MailboxItem {
	r := rand.New(rand.NewPCG(uint64(b), 9))
	items := make([]*mailboxv1.MailboxItem, postingBatchSize)
	for i := range items {
		id := fmt.Sprintf("b%04d-%04d", b, i)
		items[i] = &mailboxv1.MailboxItem{
			MessageId:     id,
			Timestamp:     int64(b) + r.Int64N(40) - 5,
			Topic:         propTopics[r.IntN(len(propTopics))],
			Principal:     propPrincipals[r.IntN(len(propPrincipals))],
			CorrelationId: propCorr[r.IntN(len(propCorr))],
			TraceId:       propTrace[r.IntN(len(propTrace))],
			EnvelopeBlob:  []byte(id + strings.Repeat(" payload", 1+r.IntN(40))),
		}
	}
	return items
}

// TestPostingCrashChild is the writer process of TestKill9Postings; it does nothing in a normal run.
func TestPostingCrashChild(t *testing.T) {
	dir := os.Getenv(postingChildEnv)
	if dir == "" {
		t.Skip("only run as TestKill9Postings' child process")
	}
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	for b := range postingMaxBatches {
		if _, err := s.Write(context.Background(), postingBatch(b)); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Println("acked", b)
	}
	os.Exit(0)
}

// TestKill9Postings kills a process writing batches with many repeated values with SIGKILL mid-batch and
// reopens its store: the batch in flight is there whole or not at all, its posting blocks with it, and every
// query (random filters paged to the end, as the brute-force property test runs them) answers exactly what was
// stored.
func TestKill9Postings(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mbox")
	acked := killWriterMidBatch(t, "TestPostingCrashChild", postingChildEnv, dir, 10, postingMaxBatches)

	s := openDir(t, dir, Options{})
	defer s.Close()
	found := checkPostingsCrash(t, s, acked)
	t.Logf("killed after %d acknowledged batches; the next was stored: %v", acked+1, found)
}

// checkPostingsCrash checks s after its writer of postingBatch batches was killed once it had acknowledged batch
// acked: the batches up to it are there, the next whole or not at all (it says which), the counters, posting
// blocks and queries exact.
func checkPostingsCrash(t *testing.T, s *Store, acked int) bool {
	t.Helper()
	ctx := context.Background()
	var model []stored
	add := func(items []*mailboxv1.MailboxItem) {
		for _, it := range items {
			model = append(model, stored{it: it, seq: len(model)})
		}
	}
	for b := 0; b <= acked; b++ {
		add(postingBatch(b))
	}
	// The batch in flight: stored whole (its commit was applied, the ack not yet printed) or not at all.
	inFlight := postingBatch(acked + 1)
	found := 0
	for _, it := range inFlight {
		if _, err := s.Get(ctx, it.GetMessageId()); err == nil {
			found++
		}
	}
	switch found {
	case len(inFlight):
		add(inFlight)
	case 0:
	default:
		t.Fatalf("%d of the %d items of the batch in flight stored; a batch is stored whole or not at all", found, len(inFlight))
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != int64(len(model)) {
		t.Fatalf("after the crash %d events, want %d", st.GetTotalEvents(), len(model))
	}
	checkPostings(t, s, model, math.MinInt64)
	checkQueriesScaled(t, mrand.New(mrand.NewSource(1)), s, model, 150, 1)
	return found > 0
}

const (
	mailboxesChildEnv = "PRISM_STORE_MAILBOXES_CRASH_CHILD_DIR"
	crashMailboxes    = 3
)

// TestMailboxesCrashChild is the writer process of TestKill9Mailboxes; it does nothing in a normal run.
func TestMailboxesCrashChild(t *testing.T) {
	dir := os.Getenv(mailboxesChildEnv)
	if dir == "" {
		t.Skip("only run as TestKill9Mailboxes' child process")
	}
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(2)
	}
	db, err := OpenDB(DBOptions{Dir: dir, Logger: quiet})
	if err != nil {
		fail(err)
	}
	stores := make([]*Store, crashMailboxes)
	for i := range stores {
		if stores[i], err = db.Open(Options{ID: fmt.Sprintf("m%d@p", i), Logger: quiet}); err != nil {
			fail(err)
		}
	}
	for b := range postingMaxBatches {
		errs := make(chan error, len(stores))
		for _, s := range stores {
			go func() {
				_, err := s.Write(context.Background(), postingBatch(b))
				errs <- err
			}()
		}
		for range stores {
			if err := <-errs; err != nil {
				fail(err)
			}
		}
		fmt.Println("acked", b) // every mailbox has stored batch b
	}
	os.Exit(0)
}

// TestKill9Mailboxes is TestKill9Postings with several mailboxes of one database writing at once, their commits
// interleaved in one Badger: after the kill each mailbox holds every acknowledged batch, its batch in flight
// whole or not at all (each on its own), and answers exactly its own items.
func TestKill9Mailboxes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "db")
	acked := killWriterMidBatch(t, "TestMailboxesCrashChild", mailboxesChildEnv, dir, 10, postingMaxBatches)

	db := openDB(t, dir)
	defer db.Close()
	var found []bool
	for i := range crashMailboxes {
		s := openIn(t, db, fmt.Sprintf("m%d@p", i))
		found = append(found, checkPostingsCrash(t, s, acked))
	}
	t.Logf("killed after %d acknowledged batches; the next was stored in mailboxes: %v", acked+1, found)
}

// killWriterMidBatch runs test child (a writer printing "acked <batch>" after each Write returns) with env=dir, waits
// for batch after, kills it with SIGKILL at a random moment within the next Write (so kills land before, between
// and after its sub-transactions), and returns the last batch it acknowledged; the child writes at most last.
func killWriterMidBatch(t *testing.T, child, env, dir string, after, last int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := -1
	var batchTime time.Duration // between the last two acknowledgements
	prev := time.Now()
	lines := bufio.NewScanner(out)
	read := func(until int) {
		for acked < until && lines.Scan() {
			f := strings.Fields(lines.Text())
			if len(f) == 2 && f[0] == "acked" {
				acked, _ = strconv.Atoi(f[1])
				batchTime, prev = time.Since(prev), time.Now()
			} else if len(f) > 0 && f[0] == "error" {
				t.Errorf("child: %s", lines.Text())
			}
		}
	}
	read(after)
	time.Sleep(rand.N(batchTime))
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	read(last) // what the child acknowledged before it died
	_ = cmd.Wait()
	if acked < 0 {
		t.Fatal("child acknowledged no batch")
	}
	return acked
}
