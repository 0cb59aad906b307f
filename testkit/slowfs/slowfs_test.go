package slowfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestStallHoldsFsyncUntilRelease(t *testing.T) {
	mnt := t.TempDir()
	f, err := Mount(t.TempDir(), mnt)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("needs root and /dev/fuse: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	file, err := os.Create(filepath.Join(mnt, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.Write([]byte("entry")); err != nil {
		t.Fatal(err)
	}
	if err := file.Sync(); err != nil {
		t.Fatalf("fsync before the stall: %v", err)
	}

	f.Stall()
	done := make(chan error, 1)
	go func() { done <- file.Sync() }()
	select {
	case err := <-done:
		t.Fatalf("fsync returned during the stall: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	f.Release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("held fsync: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fsync still held after Release")
	}
	if total, held := f.Fsyncs(); total < 2 || held != 1 {
		t.Fatalf("fsyncs %d held %d, want at least 2 and 1", total, held)
	}
	// Reads are not held.
	got, err := os.ReadFile(filepath.Join(mnt, "wal"))
	if err != nil || string(got) != "entry" {
		t.Fatalf("read back %q, %v", got, err)
	}
}
