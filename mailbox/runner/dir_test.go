package runner

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// A mailbox id may be longer than a file name (a 253-byte namespace at a
// 253-byte proxy): it still opens in the runner's store, and StoredIDs
// (prism runner rebuild --all) lists it by its id. The directory an older
// version kept such a mailbox's store in has a name that fits, distinct
// from a similar id's, and OldLayoutIDs finds it by the id file in it.
func TestLongMailboxIDsGetAStore(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("n", 253) + "@" + strings.Repeat("p", 253)
	similar := strings.Repeat("n", 253) + "@" + strings.Repeat("p", 252) + "q"
	for _, id := range []string{long, similar, "short@p"} {
		if name := filepath.Base(OldDir("/data", id)); len(name) > maxDirName {
			t.Errorf("OldDir(%d-byte id) is a %d-byte name, longer than %d", len(id), len(name), maxDirName)
		}
	}
	if OldDir("/data", long) == OldDir("/data", similar) {
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
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	ids, err := StoredIDs(dataDir)
	if err != nil || !slices.Equal(ids, []string{long, "short@p"}) {
		t.Fatalf("StoredIDs = %d ids %v, want the long id and short@p", len(ids), err)
	}

	// As an older runner left the store of the similar id.
	old := OldDir(dataDir, similar)
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, idFile), []byte(similar), 0o600); err != nil {
		t.Fatal(err)
	}
	if ids, err := OldLayoutIDs(dataDir); err != nil || !slices.Equal(ids, []string{similar}) {
		t.Fatalf("OldLayoutIDs = %d ids %v, want the similar id", len(ids), err)
	}
}
