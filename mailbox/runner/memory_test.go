package runner

import (
	"testing"

	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/mailbox/store"
)

// TestStoresSizedFromMemoryBudget: each store opened gets its share of the
// runner's memory budget among the stores open with it, prepared ones
// included; without a budget, Badger's defaults.
func TestStoresSizedFromMemoryBudget(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "b.events", "c.events"))
	const budget = 256 << 20
	for _, tc := range []struct {
		budget int64
		want   []store.Memory
	}{
		{budget, []store.Memory{store.MemoryFor(budget, 1), store.MemoryFor(budget, 2), store.MemoryFor(budget, 3)}},
		{0, []store.Memory{{}, {}, {}}},
	} {
		r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, MemoryBudget: tc.budget})
		if err != nil {
			t.Fatal(err)
		}
		var got []store.Memory
		r.openStore = func(o store.Options) (*store.Store, error) {
			got = append(got, o.Memory)
			return store.Open(o)
		}
		if err := r.Open(MailboxConfig{ID: "a@p", Topics: []string{"a.events"}}); err != nil {
			t.Fatal(err)
		}
		if err := r.Prepare(MailboxConfig{ID: "b@p", Topics: []string{"b.events"}}); err != nil {
			t.Fatal(err)
		}
		if err := r.Open(MailboxConfig{ID: "c@p", Topics: []string{"c.events"}}); err != nil {
			t.Fatal(err)
		}
		r.Close()
		if len(got) != len(tc.want) {
			t.Fatalf("budget %d: %d stores opened, want %d", tc.budget, len(got), len(tc.want))
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("budget %d: store %d sized %+v, want %+v", tc.budget, i, got[i], tc.want[i])
			}
		}
	}
}
