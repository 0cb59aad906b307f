package runner

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
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

// TestOpenFailureIsTheMailboxs: a mailbox whose store fails to open (a
// truncated table, a full disk, a panic in the open, a store of the old
// layout) gets an error naming why, counted by reason, logged and listed by
// /readyz with it and by a gauge, while the runner's other mailbox goes on
// answering and the runner stays ready; a later open that succeeds clears it.
func TestOpenFailureIsTheMailboxs(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "b.events"))
	dataDir := t.TempDir()
	var logs lockedBuffer
	r, err := New(Config{DataDir: dataDir, Brokers: c.Brokers, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Open(MailboxConfig{ID: "a@p", Topics: []string{"a.events"}}); err != nil {
		t.Fatal(err)
	}

	// A store for b@p with a table on disk, then its table truncated.
	bdir := Dir(dataDir, "b@p")
	st, err := store.Open(store.Options{Dir: bdir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := st.Write(t.Context(), []*mailboxv1.MailboxItem{{MessageId: fmt.Sprint("m", i), Timestamp: int64(i), EnvelopeBlob: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	ssts, _ := filepath.Glob(filepath.Join(bdir, "*.sst"))
	if len(ssts) == 0 {
		t.Fatal("no table written")
	}
	if err := os.Truncate(ssts[0], 10); err != nil {
		t.Fatal(err)
	}
	r.openStore = func(o store.Options) (*store.Store, error) {
		switch filepath.Base(o.Dir) {
		case "c@p":
			return nil, fmt.Errorf("open store %s: %w", o.Dir, &os.PathError{Op: "write", Path: filepath.Join(o.Dir, "000001.vlog"), Err: syscall.ENOSPC})
		case "d@p":
			panic("index out of range [4] with length 3")
		case "e@p":
			// As store.Open refuses a store written before posting lists.
			return nil, fmt.Errorf("open store %s: read counters: %w", o.Dir, store.ErrOldLayout)
		}
		return store.Open(o)
	}
	cases := []struct {
		id, reason string
		want       error
	}{
		{"b@p", "damaged", store.ErrDamaged},
		{"c@p", "no_space", syscall.ENOSPC},
		{"d@p", "damaged", store.ErrDamaged},
		{"e@p", "old_layout", store.ErrOldLayout},
	}
	for _, tc := range cases {
		err := r.Open(MailboxConfig{ID: tc.id, Topics: []string{"b.events"}})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.id) {
			t.Fatalf("open %s: %v, want an error naming it wrapping %v", tc.id, err, tc.want)
		}
		if _, _, ok := r.Mailbox(tc.id); ok {
			t.Fatalf("%s served after its open failed", tc.id)
		}
		if want := "mailbox_id=" + tc.id + " reason=" + tc.reason; !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	if err := r.Prepare(MailboxConfig{ID: "c@p"}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("prepare c@p: %v, want ENOSPC", err)
	}
	for reason, want := range map[string]float64{"damaged": 2, "no_space": 2, "old_layout": 1, "other": 0} {
		if got := testutil.ToFloat64(r.openFailures.WithLabelValues(reason)); got != want {
			t.Errorf("open failures %s = %v, want %v", reason, got, want)
		}
	}

	srv := httptest.NewServer(r.HTTPHandler())
	t.Cleanup(srv.Close)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/v1/mailboxes/a@p/stats"); code != http.StatusOK {
		t.Fatalf("a@p stats beside the failed mailboxes: %d %s", code, body)
	}
	waitFor(t, "a@p consuming", func() bool { return r.Ready() == nil })
	code, body := get("/readyz")
	if code != http.StatusOK {
		t.Fatalf("/readyz %d %q: one mailbox's failure must not take the runner out of routing", code, body)
	}
	for _, tc := range cases {
		if want := "mailbox " + tc.id + ": store failed to open (" + tc.reason + "): "; !strings.Contains(body, want) {
			t.Errorf("/readyz %q does not say %q", body, want)
		}
	}
	if !strings.Contains(body, "prism runner rebuild") {
		t.Errorf("/readyz %q does not name the way out of the old layout", body)
	}
	if _, metrics := get("/metrics"); !strings.Contains(metrics, `prism_mailbox_open_failed{mailbox="c@p"} 1`) {
		t.Error("/metrics has no prism_mailbox_open_failed for c@p")
	}

	r.openStore = store.Open
	if err := r.Open(MailboxConfig{ID: "c@p", Topics: []string{"b.events"}}); err != nil {
		t.Fatalf("open c@p once space returned: %v", err)
	}
	if _, ok := r.OpenFailures()["c@p"]; ok {
		t.Error("c@p still listed failed after it opened")
	}
	if _, body := get("/readyz"); strings.Contains(body, "mailbox c@p: store failed") {
		t.Errorf("/readyz %q still names c@p", body)
	}
}

// lockedBuffer is an io.Writer a logger and a test may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
