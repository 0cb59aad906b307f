package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// A mailbox served under a lease stops answering at the lease's deadline on
// the runner's clock, before any fence: a runner paused past the deadline
// serves the requests queued meanwhile before its timers run. The passed
// deadline is final (a late extension cannot revive it), and only a new
// Open serves the mailbox again.
func TestQueriesStopAtTheLeaseDeadline(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "d.events"))
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const id = "d@p"
	mc := MailboxConfig{ID: id, Topics: []string{"d.events"}, Epoch: 4}
	if err := r.SetValidFor(id, time.Second); !errors.Is(err, ErrNotOpen) {
		t.Fatalf("deadline of a mailbox not open: %v", err)
	}
	if err := r.Open(mc); err != nil {
		t.Fatal(err)
	}
	served := func() bool {
		_, _, ok := r.Mailbox(id)
		_, err := r.Stats(context.Background(), id)
		ids := r.IDs()
		if ok != (err == nil) || ok != (len(ids) == 1) {
			t.Fatalf("Mailbox %v, Stats %v and IDs %v disagree", ok, err, ids)
		}
		return ok
	}
	if !served() {
		t.Fatal("an open mailbox without a deadline is not served")
	}
	if err := r.SetValidFor(id, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	if err := r.SetValidFor(id, 3*time.Second); err != nil {
		t.Fatalf("extension before the deadline: %v", err)
	}
	clk.Step(2 * time.Second) // past the first deadline, not the extended one
	if !served() {
		t.Fatal("not served before the extended deadline")
	}
	clk.Step(time.Second)
	if served() {
		t.Fatal("served at its deadline, nothing fenced yet")
	}
	if err := r.SetValidFor(id, time.Minute); !errors.Is(err, ErrDeadlinePassed) {
		t.Fatalf("a late extension: %v, want ErrDeadlinePassed", err)
	}
	if served() {
		t.Fatal("a late extension revived the mailbox")
	}
	if err := r.CloseMailbox(id); err != nil {
		t.Fatal(err)
	}
	mc.Epoch = 9
	if err := r.Open(mc); err != nil {
		t.Fatal(err)
	}
	if _, epoch, ok := r.Mailbox(id); !ok || epoch != 9 {
		t.Fatalf("reopened under a new lease: served %v epoch %d", ok, epoch)
	}
}

// Past its lease deadline a mailbox's ingest stores nothing it fetches, so
// nothing of it is marked or committed: a runner resumed after a pause past
// the deadline must leave those records to the next holder, which consumes
// from the committed offsets. The refused batch is retried (the store's
// failure, never the records': nothing dead-lettered) until the mailbox is
// closed, and stays uncommitted.
func TestIngestStoresNothingPastTheLeaseDeadline(t *testing.T) {
	t.Parallel()
	const topic = "disk.events"
	c := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+".dlq"))
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, Clock: clk, BatchWait: 10 * time.Millisecond, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const id = "w@p"
	if err := r.Open(MailboxConfig{ID: id, Topics: []string{topic}, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if err := r.SetValidFor(id, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	r.mu.RLock()
	st := r.mailboxes[id].store.Load()
	r.mu.RUnlock()
	stored := func() int64 {
		s, err := st.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s.GetTotalEvents()
	}
	c.ProduceEnvelopes(t, topic, events("in", 5)...)
	waitFor(t, "the events before the deadline stored and committed", func() bool {
		return stored() == 5 && c.Committed(t, id, topic) == 5
	})
	clk.Step(10 * time.Second)
	c.ProduceEnvelopes(t, topic, events("past", 5)...)
	waitFor(t, "the batch fetched past the deadline refused", func() bool {
		return metricSum(t, r, "prism_mailbox_ingest_retries_total", id) > 0
	})
	if n := stored(); n != 5 {
		t.Fatalf("%d events stored, want the 5 from before the deadline", n)
	}
	if n := metricSum(t, r, "prism_mailbox_events_dead_lettered_total", id); n != 0 {
		t.Fatalf("%v events dead-lettered: the refusal is the store's, not the records'", n)
	}
	_ = r.CloseMailbox(id) // the refused batch ends the drain with an error
	if got := c.Committed(t, id, topic); got != 5 {
		t.Fatalf("committed %d after the close, want 5: nothing past the deadline", got)
	}
}
