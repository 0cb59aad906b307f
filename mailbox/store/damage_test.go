package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenDamagedTable: a database (several mailboxes' stores) whose table
// file was truncated or overwritten fails to open with ErrDamaged naming the
// file, where Badger alone panics on one of its own goroutines and takes the
// process down; so does a store opened alone.
func TestOpenDamagedTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, size int64)
	}{
		{"truncated to half", func(t *testing.T, path string, size int64) { must(t, os.Truncate(path, size/2)) }},
		{"truncated to a few bytes", func(t *testing.T, path string, _ int64) { must(t, os.Truncate(path, 3)) }},
		{"empty", func(t *testing.T, path string, _ int64) { must(t, os.Truncate(path, 0)) }},
		{"footer overwritten", func(t *testing.T, path string, size int64) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, size-8)
			must(t, errors.Join(err, f.Close()))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "db")
			db := openDB(t, dir)
			for m := range 3 {
				s := openIn(t, db, fmt.Sprintf("m%d@p", m))
				for i := range 70 {
					mustWrite(t, s, item(fmt.Sprint("id", i), int64(i)))
				}
				must(t, s.Close())
			}
			must(t, db.Close())
			ssts, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			if len(ssts) == 0 {
				t.Fatal("no table file written")
			}
			fi, err := os.Stat(ssts[0])
			must(t, err)
			tc.damage(t, ssts[0], fi.Size())
			db, err = OpenDB(DBOptions{Dir: dir, Logger: quiet})
			if err == nil {
				db.Close()
				t.Fatal("a damaged database opened")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), ssts[0]) {
				t.Fatalf("open the database: %v, want ErrDamaged naming %s", err, ssts[0])
			}
			s, err := Open(Options{Dir: dir, Logger: quiet})
			if err == nil {
				s.Close()
				t.Fatal("a damaged store opened alone")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), ssts[0]) {
				t.Fatalf("open alone: %v, want ErrDamaged naming %s", err, ssts[0])
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
