package runner

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/mailbox/store"
)

// heldOpens makes r's store opens for the mailbox directory named held wait
// until release closes; entered is told when one is waiting.
func heldOpens(r *Runner, held string) (entered, release chan struct{}) {
	entered, release = make(chan struct{}, 1), make(chan struct{})
	r.openStore = func(o store.Options) (*store.Store, error) {
		if filepath.Base(o.Dir) == held {
			entered <- struct{}{}
			<-release
		}
		return store.Open(o)
	}
	return entered, release
}

// TestQueriesAnswerWhileAnotherMailboxOpens: while mailbox b's store is held
// mid-open, queries and stats of mailbox a answer, b is not served yet, and
// closing b waits for its open and then closes it rather than finding nothing
// (a fenced mailbox must never be published after its close).
func TestQueriesAnswerWhileAnotherMailboxOpens(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "b.events"))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Open(MailboxConfig{ID: "a@p", Topics: []string{"a.events"}}); err != nil {
		t.Fatal(err)
	}
	entered, release := heldOpens(r, "b@p")
	opened := make(chan error, 1)
	go func() { opened <- r.Open(MailboxConfig{ID: "b@p", Topics: []string{"b.events"}, Epoch: 7}) }()
	<-entered

	srv := httptest.NewServer(r.HTTPHandler())
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/v1/mailboxes/a@p/events", "/v1/mailboxes/a@p/stats"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s while b@p opens: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s while b@p opens: %d, want 200", path, resp.StatusCode)
		}
	}
	if _, _, ok := r.Mailbox("b@p"); ok {
		t.Fatal("b@p is served before its store is open")
	}
	if ids := r.IDs(); len(ids) != 1 || ids[0] != "a@p" {
		t.Fatalf("IDs while b@p opens = %v, want [a@p]", ids)
	}

	closed := make(chan error, 1)
	go func() { closed <- r.CloseMailbox("b@p") }()
	close(release)
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("CloseMailbox during the open: %v, want b@p closed once opened", err)
	}
	if _, _, ok := r.Mailbox("b@p"); ok {
		t.Fatal("b@p is served after its close")
	}
}

// TestCloseWaitsForAnOpenInFlight: a runner closed while a mailbox's store
// is held mid-open refuses the open once the store opens, closes that store
// (its directory is free again) and returns only after.
func TestCloseWaitsForAnOpenInFlight(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "b.events"))
	dir := t.TempDir()
	r, err := New(Config{DataDir: dir, Brokers: c.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := heldOpens(r, "b@p")
	opened := make(chan error, 1)
	go func() { opened <- r.Open(MailboxConfig{ID: "b@p", Topics: []string{"b.events"}}) }()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	waitFor(t, "Close to begin", func() bool { r.mu.RLock(); defer r.mu.RUnlock(); return r.closed })
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	// Close has returned: the store opened across it must be closed already (Badger locks its directory).
	st, err := store.Open(store.Options{Dir: Dir(dir, "b@p")})
	if err != nil {
		t.Fatalf("the store opened across Close was left open: %v", err)
	}
	st.Close()
	if err := <-opened; err == nil || !strings.Contains(err.Error(), "runner closed") {
		t.Fatalf("Open across Close: %v, want refused as runner closed", err)
	}
	if err := r.Open(MailboxConfig{ID: "b@p", Topics: []string{"b.events"}}); err == nil {
		t.Fatal("Open after Close succeeded")
	}
}
