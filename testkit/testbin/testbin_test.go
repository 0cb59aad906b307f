package testbin

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPruneStale: another checkout's binaries untouched for longer than
// staleAfter go, a recent one and the current checkout's stay.
func TestPruneStale(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	now := time.Now()
	dirs := map[string]time.Time{
		"current": now.Add(-30 * 24 * time.Hour),
		"stale":   now.Add(-staleAfter - time.Hour),
		"recent":  now.Add(-time.Hour),
	}
	for name, mtime := range dirs {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "prism"), []byte("binary"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(dir, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	pruneStale(base, filepath.Join(base, "current"), now)
	for name, want := range map[string]bool{"current": true, "stale": false, "recent": true} {
		_, err := os.Stat(filepath.Join(base, name, "prism"))
		if got := err == nil; got != want {
			t.Errorf("%s kept = %v, want %v (%v)", name, got, want, err)
		}
	}
}
