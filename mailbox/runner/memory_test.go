package runner

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/mailbox/store"
)

// recordSizes makes r's store opens record the memory each store is given,
// by mailbox directory.
func recordSizes(r *Runner) func() map[string]store.Memory {
	var mu sync.Mutex
	got := map[string]store.Memory{}
	r.openStore = func(o store.Options) (*store.Store, error) {
		mu.Lock()
		got[o.Dir] = o.Memory
		mu.Unlock()
		return store.Open(o)
	}
	return func() map[string]store.Memory {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]store.Memory, len(got))
		for dir, m := range got {
			out[dir] = m
		}
		return out
	}
}

// share is the footprint of one store of n sharing budget equally.
func share(budget int64, n int) int64 { return footprint(store.MemoryFor(budget, n)) }

// TestStoresShareTheMemoryBudget: the stores' Badger memtables and caches,
// whose sizes are fixed at open, stay within the memory budget's half
// however many open and in whatever order: each store gets an equal share
// among the mailboxes planned (ExpectedMailboxes, or the ones opening
// together), never more than the open stores leave free, and a closed
// store's share goes to the next. Only when the stores' floor times their
// number exceeds the half do they go over it, and the runner logs it.
func TestStoresShareTheMemoryBudget(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events"))
	floor := footprint(store.MemoryFor(2, 1))
	const budget = 256 << 20
	half := int64(budget / 2)
	for _, tc := range []struct {
		name     string
		budget   int64
		expected int
		together bool // the prepares arrive together, as a sidecar's do
		n        int
		// wantEach is every store's footprint in open order (the last
		// repeated); 0 is Badger's defaults, no budget. wantNext is the
		// footprint of a store opened once the first has closed.
		wantEach []int64
		wantNext int64
		wantWarn bool
	}{
		{name: "one after another, planned", budget: budget, expected: 5, n: 5,
			wantEach: []int64{share(budget, 5)}, wantNext: share(budget, 5)},
		{name: "arriving together", budget: budget, together: true, n: 5,
			wantEach: []int64{share(budget, 5)}, wantNext: share(budget, 5)},
		// The third store finds the first two holding the half.
		{name: "more than planned", budget: budget, expected: 2, n: 4,
			wantEach: []int64{share(budget, 2), share(budget, 2), floor}, wantNext: share(budget, 4), wantWarn: true},
		{name: "floors over the budget", budget: 32 << 20, together: true, n: 3,
			wantEach: []int64{floor}, wantNext: floor, wantWarn: true},
		{name: "no budget", n: 3, wantEach: []int64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs lockedBuffer
			r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, MemoryBudget: tc.budget, ExpectedMailboxes: tc.expected,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			sizes := recordSizes(r)
			ids := make([]string, tc.n)
			for i := range ids {
				ids[i] = fmt.Sprintf("m%d@p", i)
			}
			if tc.together {
				// Every open waits for a turn to open a store until all have begun.
				for range cap(r.storeOpens) {
					r.storeOpens <- struct{}{}
				}
				errs := make(chan error, tc.n)
				for _, id := range ids {
					go func() { errs <- r.Prepare(MailboxConfig{ID: id}) }()
				}
				waitFor(t, "every prepare begun", func() bool { r.mu.RLock(); defer r.mu.RUnlock(); return len(r.opening) == tc.n })
				for range cap(r.storeOpens) {
					<-r.storeOpens
				}
				for range ids {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
			} else {
				for i, id := range ids {
					// Opened and prepared stores alike hold their share.
					if i%2 == 0 {
						err = r.Open(MailboxConfig{ID: id, Topics: []string{"a.events"}})
					} else {
						err = r.Prepare(MailboxConfig{ID: id})
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			got := sizes()
			var sum int64
			for i, id := range ids {
				m, ok := got[Dir(r.cfg.DataDir, id)]
				if !ok {
					t.Fatalf("%s: no store opened", id)
				}
				if tc.budget == 0 && m != (store.Memory{}) {
					t.Errorf("%s sized %+v without a budget, want Badger's defaults", id, m)
				}
				if want := tc.wantEach[min(i, len(tc.wantEach)-1)]; footprint(m) != want {
					t.Errorf("store %d (%s) holds %d bytes, want %d", i, id, footprint(m), want)
				}
				sum += footprint(m)
			}
			if bound := max(half, int64(tc.n)*floor); tc.budget > 0 && !tc.wantWarn && sum > bound {
				t.Errorf("%d stores hold %d bytes, over the budget's half %d", tc.n, sum, bound)
			}
			if warned := strings.Contains(logs.String(), "level=WARN msg=\"the mailbox stores' Badger memory is over the memory budget's half"); warned != tc.wantWarn {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.wantWarn, logs.String())
			}
			if tc.budget == 0 {
				return
			}
			// A store closed gives its share to the next.
			if _, _, open := r.Mailbox(ids[0]); open {
				err = r.CloseMailbox(ids[0])
			} else {
				err = r.Discard(ids[0])
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Prepare(MailboxConfig{ID: "next@p"}); err != nil {
				t.Fatal(err)
			}
			if next := footprint(sizes()[Dir(r.cfg.DataDir, "next@p")]); next != tc.wantNext {
				t.Errorf("the store opened after the first closed holds %d bytes, want %d", next, tc.wantNext)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if r.memoryHeld != 0 || len(r.memory) != 0 {
				t.Errorf("closed runner still holds %d bytes for %v", r.memoryHeld, r.memory)
			}
		})
	}
}
