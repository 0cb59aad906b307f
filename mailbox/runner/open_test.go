package runner

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prism-mesh/prism/internal/lazy"
	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// heldOpens makes r's store opens of mailbox held wait until release
// closes; entered is told when one is waiting.
func heldOpens(r *Runner, held string) (entered, release chan struct{}) {
	entered, release = make(chan struct{}, 1), make(chan struct{})
	r.openView = func(db *store.DB, o store.Options) (*store.Store, error) {
		if o.ID == held {
			entered <- struct{}{}
			<-release
		}
		return db.Open(o)
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
// and then the runner's store (its directory is free again) and returns
// only after.
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
	// Close has returned: the stores opened across it must be closed already (Badger locks its directory).
	if _, err := r.db.Get(r.openStoreDB); !errors.Is(err, lazy.ErrClosed) {
		t.Fatalf("the runner's store after Close: %v, want lazy.ErrClosed (closed, not to be opened again)", err)
	}
	db, err := store.OpenDB(store.DBOptions{Dir: StoreDir(dir)})
	if err != nil {
		t.Fatalf("the runner's store was left open: %v", err)
	}
	st, err := db.Open(store.Options{ID: "b@p"})
	if err != nil {
		t.Fatalf("the store opened across Close was left open: %v", err)
	}
	if err := errors.Join(st.Close(), db.Close()); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err == nil || !strings.Contains(err.Error(), "runner closed") {
		t.Fatalf("Open across Close: %v, want refused as runner closed", err)
	}
	if err := r.Open(MailboxConfig{ID: "b@p", Topics: []string{"b.events"}}); err == nil {
		t.Fatal("Open after Close succeeded")
	}
}

// TestOpenFailureIsTheMailboxs: a mailbox whose store fails to open (a
// full disk, a panic in the open, a store of the old layout) gets an error
// naming why, counted by reason, logged and listed by /readyz with it and by
// a gauge, while the runner's other mailbox goes on answering and the runner
// stays ready; a later open that succeeds clears it. The store of the old
// layout is a real one, with its data: the mailbox is refused, never opened
// empty beside it.
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

	// As the previous version left e@p's store: a Badger of its own.
	old, err := store.Open(store.Options{Dir: OldDir(dataDir, "e@p")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Write(t.Context(), []*mailboxv1.MailboxItem{{MessageId: "m", Timestamp: 1, EnvelopeBlob: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	r.openView = func(db *store.DB, o store.Options) (*store.Store, error) {
		switch o.ID {
		case "c@p":
			return nil, fmt.Errorf("open store %s: %w", o.ID, &os.PathError{Op: "write", Path: "000001.vlog", Err: syscall.ENOSPC})
		case "d@p":
			panic("index out of range [4] with length 3")
		}
		return db.Open(o)
	}
	cases := []struct {
		id, reason string
		want       error
	}{
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
	for reason, want := range map[string]float64{"damaged": 1, "no_space": 2, "old_layout": 1, "other": 0} {
		if got := testutil.ToFloat64(r.openFailures.WithLabelValues(reason)); got != want {
			t.Errorf("open failures %s = %v, want %v", reason, got, want)
		}
	}
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := db.IDs(); err != nil || slices.Contains(ids, "e@p") {
		t.Errorf("the runner's store holds %v (err %v): e@p was opened in it, empty, beside its old store", ids, err)
	}
	if _, err := os.Stat(OldDir(dataDir, "e@p")); err != nil {
		t.Fatalf("the old layout's store was touched: %v", err)
	}

	srv := httptest.NewServer(r.HTTPHandler())
	t.Cleanup(srv.Close)
	if code, body := get(t, srv.URL+"/v1/mailboxes/a@p/stats"); code != http.StatusOK {
		t.Fatalf("a@p stats beside the failed mailboxes: %d %s", code, body)
	}
	waitFor(t, "a@p consuming", func() bool { return r.Ready() == nil })
	code, body := get(t, srv.URL+"/readyz")
	if code != http.StatusOK {
		t.Fatalf("/readyz %d %q: one mailbox's failure must not take the runner out of routing", code, body)
	}
	for _, tc := range cases {
		if want := "mailbox " + tc.id + ": store failed to open (" + tc.reason + "): "; !strings.Contains(body, want) {
			t.Errorf("/readyz %q does not say %q", body, want)
		}
	}
	if !strings.Contains(body, "prism runner rebuild --mailbox e@p") {
		t.Errorf("/readyz %q does not name the way out of the old layout", body)
	}
	if _, metrics := get(t, srv.URL+"/metrics"); !strings.Contains(metrics, `prism_mailbox_open_failed{mailbox="c@p"} 1`) {
		t.Error("/metrics has no prism_mailbox_open_failed for c@p")
	}

	r.openView = (*store.DB).Open
	if err := r.Open(MailboxConfig{ID: "c@p", Topics: []string{"b.events"}}); err != nil {
		t.Fatalf("open c@p once space returned: %v", err)
	}
	if _, ok := r.OpenFailures()["c@p"]; ok {
		t.Error("c@p still listed failed after it opened")
	}
	if _, body := get(t, srv.URL+"/readyz"); strings.Contains(body, "mailbox c@p: store failed") {
		t.Errorf("/readyz %q still names c@p", body)
	}
}

// get is the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
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

// TestDamagedRunnerStore: a runner whose store is damaged (a truncated
// table) fails every mailbox's open and prepare with reason damaged, naming
// the store, and stays up naming each in /readyz and the gauge, so that its
// sidecar reports them all open_failed and the admin moves them. Moving the
// store aside and rebuilding the mailboxes (their consumer groups reset)
// recovers without a restart: the runner's next open creates a store, empty,
// and re-ingests every mailbox from Kafka; the damaged store is left as it
// was moved.
func TestDamagedRunnerStore(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(2, "a.events", "b.events"))
	c.ProduceEnvelopes(t, "a.events", kafkatest.Envelopes("a.events", 30)...)
	c.ProduceEnvelopes(t, "b.events", kafkatest.Envelopes("b.events", 20)...)
	dataDir := t.TempDir()
	var logs lockedBuffer
	cfg := Config{DataDir: dataDir, Brokers: c.Brokers, BatchWait: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	want := map[string]int64{"a@p": 30, "b@p": 20}
	open := func(r *Runner) []error {
		var errs []error
		for id := range want {
			errs = append(errs, r.Open(MailboxConfig{ID: id, Topics: []string{id[:1] + ".events"}}))
		}
		return errs
	}
	filled := func(r *Runner) func() bool {
		return func() bool {
			for id, n := range want {
				if s, err := r.Stats(t.Context(), id); err != nil || s.TotalEvents != n || c.Committed(t, id, id[:1]+".events") != n {
					return false
				}
			}
			return true
		}
	}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(open(first)...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both mailboxes filled and committed", filled(first))
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	var ssts []string
	err = filepath.WalkDir(StoreDir(dataDir), func(path string, _ fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, ".sst") {
			ssts = append(ssts, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ssts) == 0 {
		t.Fatal("no table written")
	}
	for _, sst := range ssts {
		if err := os.Truncate(sst, 10); err != nil {
			t.Fatal(err)
		}
	}

	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	srv := httptest.NewServer(r.HTTPHandler())
	t.Cleanup(srv.Close)
	for i, err := range open(r) {
		if !errors.Is(err, store.ErrDamaged) || !strings.Contains(err.Error(), StoreDir(dataDir)) {
			t.Fatalf("open %d on a damaged store: %v, want ErrDamaged naming %s", i, err, StoreDir(dataDir))
		}
	}
	if err := r.Prepare(MailboxConfig{ID: "new@p"}); !errors.Is(err, store.ErrDamaged) {
		t.Fatalf("prepare of a new mailbox on a damaged store: %v, want ErrDamaged", err)
	}
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d: the runner must stay up", code)
	}
	_, body := get(t, srv.URL+"/readyz")
	_, metrics := get(t, srv.URL+"/metrics")
	for _, id := range []string{"a@p", "b@p", "new@p"} {
		if want := "mailbox " + id + ": store failed to open (damaged): runner store " + StoreDir(dataDir); !strings.Contains(body, want) {
			t.Errorf("/readyz %q does not say %q", body, want)
		}
		if !strings.Contains(metrics, `prism_mailbox_open_failed{mailbox="`+id+`"} 1`) {
			t.Errorf("/metrics has no prism_mailbox_open_failed for %s", id)
		}
	}
	if !strings.Contains(logs.String(), "the runner's store failed to open") {
		t.Errorf("the log does not name the runner's store:\n%s", logs.String())
	}

	aside := StoreDir(dataDir) + ".damaged"
	if err := os.Rename(StoreDir(dataDir), aside); err != nil {
		t.Fatal(err)
	}
	if _, err := Rebuild(RebuildConfig{DataDir: dataDir, Brokers: c.Brokers}, slices.Sorted(maps.Keys(want))); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(open(r)...); err != nil {
		t.Fatalf("open once the damaged store is aside: %v", err)
	}
	waitFor(t, "both mailboxes re-ingested from Kafka", filled(r))
	if fs := r.OpenFailures(); len(fs) != 1 || fs["new@p"] == nil {
		t.Errorf("open failures %v after the recovery, want new@p's alone (not opened since)", fs)
	}
	for _, sst := range ssts {
		if _, err := os.Stat(strings.Replace(sst, StoreDir(dataDir), aside, 1)); err != nil {
			t.Errorf("the damaged store moved aside lost %s: %v", sst, err)
		}
	}
}
