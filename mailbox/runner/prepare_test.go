package runner

import (
	"testing"

	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// A prepared mailbox is not served (and not consuming) until Open, which
// then uses the prepared store; Discard and Close release prepared stores.
func TestPrepareThenOpen(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "p.events"))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	mc := MailboxConfig{ID: "p@x", Topics: []string{"p.events"}, Epoch: 3}
	if err := r.Prepare(mc); err != nil {
		t.Fatal(err)
	}
	if err := r.Prepare(mc); err != nil {
		t.Fatalf("preparing twice: %v", err)
	}
	if _, _, ok := r.Mailbox("p@x"); ok || r.Consuming("p@x") {
		t.Fatal("a prepared mailbox is served or consumed")
	}
	if err := r.Open(mc); err != nil {
		t.Fatal(err)
	}
	if _, epoch, ok := r.Mailbox("p@x"); !ok || epoch != 3 {
		t.Fatalf("opened mailbox: served %v epoch %d", ok, epoch)
	}
	if len(r.prepared) != 0 {
		t.Fatal("the prepared store was not handed to Open")
	}
	if err := r.Prepare(mc); err == nil {
		t.Fatal("preparing an open mailbox must fail")
	}
	if err := r.CloseMailbox("p@x"); err != nil {
		t.Fatal(err)
	}
	// The directory is free again: prepare, discard, prepare (Badger holds
	// a directory lock, so a leaked store would fail here).
	for range 2 {
		if err := r.Prepare(mc); err != nil {
			t.Fatal(err)
		}
		if err := r.Discard("p@x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Prepare(mc); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("close with a prepared store: %v", err)
	}
}
