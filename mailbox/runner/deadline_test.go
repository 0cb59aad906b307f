package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/internal/kafkatest"
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
