package runner

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/internal/kafkatest"
)

// A mailbox id may be longer than a file name (a 253-byte namespace at a
// 253-byte proxy): its store still opens, in a directory whose name fits,
// distinct from a similar id's, and StoredIDs (prism runner rebuild --all)
// still lists it by its id.
func TestLongMailboxIDsGetAStore(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("n", 253) + "@" + strings.Repeat("p", 253)
	similar := strings.Repeat("n", 253) + "@" + strings.Repeat("p", 252) + "q"
	for _, id := range []string{long, similar, "short@p"} {
		if name := filepath.Base(Dir("/data", id)); len(name) > maxDirName {
			t.Errorf("Dir(%d-byte id) is a %d-byte name, longer than %d", len(id), len(name), maxDirName)
		}
	}
	if Dir("/data", long) == Dir("/data", similar) {
		t.Fatal("two long ids that differ only at their end share a directory")
	}
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "b.events"))
	dataDir := t.TempDir()
	r, err := New(Config{DataDir: dataDir, Brokers: c.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(MailboxConfig{ID: long, Topics: []string{"a.events"}}); err != nil {
		t.Fatalf("open a %d-byte mailbox id: %v", len(long), err)
	}
	if err := r.Open(MailboxConfig{ID: "short@p", Topics: []string{"b.events"}}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	ids, err := StoredIDs(dataDir)
	if err != nil || !slices.Equal(ids, []string{long, "short@p"}) {
		t.Fatalf("StoredIDs = %d ids %v, want the long id and short@p", len(ids), err)
	}
}
