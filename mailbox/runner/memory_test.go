package runner

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// recordStoreOpens makes r's opens of its store record the options each
// was given.
func recordStoreOpens(r *Runner) func() []store.DBOptions {
	var mu sync.Mutex
	var got []store.DBOptions
	r.openDB = func(o store.DBOptions) (*store.DB, error) {
		mu.Lock()
		got = append(got, o)
		mu.Unlock()
		return store.OpenDB(o)
	}
	return func() []store.DBOptions {
		mu.Lock()
		defer mu.Unlock()
		return append([]store.DBOptions(nil), got...)
	}
}

// TestRunnerStoreTakesTheMemoryBudget: the runner's one store is sized from
// the memory budget as one database (store.MemoryFor(budget, 1)), opened
// once however many mailboxes open, prepared or opened, and in whatever
// order; without a budget it keeps Badger's defaults.
func TestRunnerStoreTakesTheMemoryBudget(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events"))
	for _, budget := range []int64{0, 32 << 20, 256 << 20} {
		t.Run(fmt.Sprint(budget), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			r, err := New(Config{DataDir: dir, Brokers: c.Brokers, MemoryBudget: budget})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			opens := recordStoreOpens(r)
			for i := range 5 {
				id := fmt.Sprintf("m%d@p", i)
				if i%2 == 0 {
					err = r.Open(MailboxConfig{ID: id, Topics: []string{"a.events"}})
				} else {
					err = r.Prepare(MailboxConfig{ID: id})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			got := opens()
			if len(got) != 1 {
				t.Fatalf("the runner's store opened %d times for 5 mailboxes, want once", len(got))
			}
			if want := store.MemoryFor(budget, 1); got[0].Memory != want {
				t.Errorf("the runner's store sized %+v, want %+v", got[0].Memory, want)
			}
			if got[0].Dir != StoreDir(dir) {
				t.Errorf("the runner's store at %s, want %s", got[0].Dir, StoreDir(dir))
			}
		})
	}
}
