package store

import (
	"bufio"
	"context"
	"fmt"
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
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
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
	last := time.Now()
	lines := bufio.NewScanner(out)
	read := func(until int) {
		for acked < until && lines.Scan() {
			f := strings.Fields(lines.Text())
			if len(f) == 2 && f[0] == "acked" {
				acked, _ = strconv.Atoi(f[1])
				batchTime, last = time.Since(last), time.Now()
			} else if len(f) > 0 && f[0] == "error" {
				t.Errorf("child: %s", lines.Text())
			}
		}
	}
	read(15) // the child exits by itself after crashMaxBatch batches, which bounds this wait
	// A random moment within the next Write, so kills land before, between and after its sub-transactions.
	time.Sleep(rand.N(batchTime))
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	read(crashMaxBatch) // what the child acknowledged before it died
	_ = cmd.Wait()
	if acked < 0 {
		t.Fatal("child acknowledged no batch")
	}

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
