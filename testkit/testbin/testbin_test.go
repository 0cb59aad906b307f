package testbin

import (
	"io"
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

// TestPublishKeepsRunningFiles: publishing a staged build makes out the
// staged file, leaves it alone when it already is, and a new build replaces
// out by a rename, so a file opened (or run) before keeps its contents.
func TestPublishKeepsRunningFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stage, out := filepath.Join(dir, "stage"), filepath.Join(dir, "out")
	write := func(content string) {
		t.Helper()
		// go build replaces its output by a new file, as here.
		_ = os.Remove(stage)
		if err := os.WriteFile(stage, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	same := func() bool {
		t.Helper()
		si, err := os.Stat(stage)
		if err != nil {
			t.Fatal(err)
		}
		oi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		return os.SameFile(si, oi)
	}
	write("one")
	if err := publish(stage, out); err != nil || !same() {
		t.Fatalf("first publish: %v, same file %v", err, same())
	}
	before, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := publish(stage, out); err != nil {
		t.Fatal(err)
	}
	if after, err := os.Stat(out); err != nil || !os.SameFile(before, after) {
		t.Fatalf("publish of an unchanged build replaced out: %v", err)
	}
	running, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	write("two")
	if err := publish(stage, out); err != nil || !same() {
		t.Fatalf("publish of a new build: %v, same file %v", err, same())
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "two" {
		t.Fatalf("out after a new build: %q %v, want two", b, err)
	}
	if b, err := io.ReadAll(running); err != nil || string(b) != "one" {
		t.Fatalf("the file opened before the new build reads %q %v, want one", b, err)
	}
}
