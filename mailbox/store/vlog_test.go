package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// vlogStore writes a store whose value log spans several files (1 MiB each) and closes it cleanly; it returns
// the store's directory and its value-log files, oldest first.
func vlogStore(t *testing.T) (string, []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mbox")
	s := openDir(t, dir, Options{vlogFileSize: 1 << 20})
	items := seqItems(800, 4096) // about 3 MiB of values
	for i := 0; i < len(items); i += 100 {
		mustWrite(t, s, items[i:i+100]...)
	}
	must(t, s.Close())
	return dir, vlogFiles(t, dir)
}

// vlogFiles are dir's value-log files holding entries, oldest first.
func vlogFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	must(t, err)
	var out []string
	for _, n := range names {
		if fi, err := os.Stat(n); err == nil && fi.Size() > vlogHeaderSize {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(fidOf(t, a), fidOf(t, b)) })
	if len(out) < 3 {
		t.Fatalf("value log in %d files with entries, want 3 or more", len(out))
	}
	return out
}

func fidOf(t *testing.T, path string) uint64 {
	t.Helper()
	fid, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".vlog"), 10, 32)
	must(t, err)
	return fid
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	must(t, err)
	b[0] ^= 0x10
	_, err = f.WriteAt(b, off)
	must(t, err)
}

// midEntries is the middle of a value-log file's entries, past its header:
// the newest file may hold one small entry, and the middle of the whole file
// then falls in the header, whose bytes no entry's checksum covers.
func midEntries(size int64) int64 { return vlogHeaderSize + (size-vlogHeaderSize)/2 }

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	must(t, err)
	return fi.Size()
}

func wantDamaged(t *testing.T, dir, file string) {
	t.Helper()
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err == nil {
		s.Close()
		t.Fatalf("a store with a damaged value log %s opened", file)
	}
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), file) {
		t.Fatalf("open: %v, want ErrDamaged naming %s", err, file)
	}
}

// TestOpenDamagedValueLog: a value-log file cut short or with a flipped byte, sealed or the newest, fails the
// store's open with ErrDamaged naming the file, where Badger alone opens it (it reads only the newest file, and
// truncates that one silently at the damage) and queries then answer "corrupt record".
func TestOpenDamagedValueLog(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		pick   func(files []string) string
		damage func(t *testing.T, path string, size int64)
	}{
		{"sealed truncated", func(f []string) string { return f[0] }, func(t *testing.T, p string, size int64) { must(t, os.Truncate(p, size/2+7)) }},
		{"sealed flipped byte", func(f []string) string { return f[0] }, func(t *testing.T, p string, size int64) { flipByte(t, p, midEntries(size)) }},
		{"sealed shorter than its header", func(f []string) string { return f[0] }, func(t *testing.T, p string, _ int64) { must(t, os.Truncate(p, 7)) }},
		{"newest truncated", func(f []string) string { return f[len(f)-1] }, func(t *testing.T, p string, size int64) { must(t, os.Truncate(p, size-100)) }},
		{"newest flipped byte", func(f []string) string { return f[len(f)-1] }, func(t *testing.T, p string, size int64) { flipByte(t, p, midEntries(size)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, files := vlogStore(t)
			path := tc.pick(files)
			tc.damage(t, path, fileSize(t, path))
			wantDamaged(t, dir, path)
		})
	}
}

// An intact store opens, records its sealed files as verified, and opens again reading only what is new; a
// verified file cut short afterwards is still found, by its size.
func TestValueLogVerifiedOnce(t *testing.T) {
	t.Parallel()
	dir, files := vlogStore(t)
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatalf("an intact store: %v", err)
	}
	must(t, s.Close())
	// Open sealed the newest file (Badger writes on into a new one), so this open reads it and records it too.
	s = openDir(t, dir, Options{})
	if st, err := s.Stats(context.Background()); err != nil || st.GetTotalEvents() != 800 {
		t.Fatalf("reopened store: %v events, %v; want 800", st.GetTotalEvents(), err)
	}
	must(t, s.Close())
	verified := readVerified(dir)
	for _, f := range files {
		if size, ok := verified[fidOf(t, f)]; !ok || size != fileSize(t, f) {
			t.Fatalf("sealed %s (%d bytes) not recorded as verified: %v", f, fileSize(t, f), verified)
		}
	}

	must(t, os.Truncate(files[0], fileSize(t, files[0])-4096))
	wantDamaged(t, dir, files[0])
}

// A newest file left by a crash (preallocated: zeros past its last write), its last entry torn or not, opens:
// that write was never acknowledged, and Badger drops it.
func TestValueLogCrashTailOpens(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		tear int64 // bytes cut off the last entry before the zeros
	}{
		{"zeros after the last entry", 0},
		{"last entry torn", 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, files := vlogStore(t)
			newest := files[len(files)-1]
			size := fileSize(t, newest)
			f, err := os.OpenFile(newest, os.O_RDWR, 0)
			must(t, err)
			must(t, f.Truncate(size-tc.tear))
			must(t, f.Truncate(2<<20)) // the preallocation, a hole
			must(t, f.Close())
			s, err := Open(Options{Dir: dir, Logger: quiet, vlogFileSize: 1 << 20})
			if err != nil {
				t.Fatalf("a crashed store: %v", err)
			}
			must(t, s.Close())
		})
	}
}

// vlogEntry is one entry as Badger writes it to the value log.
func vlogEntry(key, value []byte) []byte {
	b := []byte{0, 0}
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = binary.AppendUvarint(b, uint64(len(value)))
	b = binary.AppendUvarint(b, 0)
	b = append(append(b, key...), value...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// TestCheckNewestValueLog checks constructed newest files whose last entry's CRC ends in a zero byte, as one
// file in 256 does: TestOpenDamagedValueLog's "newest flipped byte" passed such a file once in a while,
// reading the zero as the start of a crash's zeros and the flipped byte as its torn last write.
func TestCheckNewestValueLog(t *testing.T) {
	t.Parallel()
	const prealloc = 1 << 20
	var entries [][]byte
	for i := 0; len(entries) < 20; i++ {
		e := vlogEntry([]byte(fmt.Sprintf("key-%03d", len(entries))), []byte(fmt.Sprintf("value %d", i)))
		if len(entries) < 19 || e[len(e)-1] == 0 {
			entries = append(entries, e)
		}
	}
	file := make([]byte, vlogHeaderSize)
	for _, e := range entries {
		file = append(file, e...)
	}
	lastEntry := int64(len(file) - len(entries[len(entries)-1]))
	flipped := func(off int64) func([]byte) []byte {
		return func(b []byte) []byte { b[off] ^= 0x10; return b }
	}
	cases := []struct {
		name      string
		size      int64 // the file's size, zeros past its data; 0: its data's
		damage    func([]byte) []byte
		wantError bool
	}{
		{"closed intact", 0, nil, false},
		{"closed, a committed entry flipped", 0, flipped(vlogHeaderSize + 5), true},
		{"closed, the last entry flipped", 0, flipped(lastEntry + 5), true},
		{"closed, cut inside its last entry", 0, func(b []byte) []byte { return b[:len(b)-3] }, true},
		{"crashed intact", prealloc, nil, false},
		{"crashed, its last write torn", prealloc, func(b []byte) []byte { return b[:len(b)-3] }, false},
		{"crashed, its last write flipped", prealloc, flipped(lastEntry + 5), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := slices.Clone(file)
			if tc.damage != nil {
				b = tc.damage(b)
			}
			path := filepath.Join(t.TempDir(), "000001.vlog")
			must(t, os.WriteFile(path, b, 0o600))
			if tc.size > 0 {
				must(t, os.Truncate(path, tc.size))
			}
			err := checkValueLog(path, true, prealloc)
			if (err != nil) != tc.wantError {
				t.Fatalf("check: %v, want an error: %v", err, tc.wantError)
			}
		})
	}
}
