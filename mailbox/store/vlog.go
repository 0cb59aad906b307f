package store

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Badger's value log, as v4 writes it (memtable.go encodeEntry, value.go):
// a file <fid>.vlog starts with a 20-byte header (key id, IV) and holds
// entries back to back, each meta byte, user meta byte, uvarint key length,
// uvarint value length, uvarint expiry, key, value, and the CRC-32C
// (big-endian) of all of it. Nothing else: no index, no end marker, no
// transaction marks (Badger strips them from the value log). Badger reads
// only the newest file on open and truncates it at the first entry that
// does not check, silently: a flipped byte there drops every later value,
// acknowledged ones included, and a damaged older file is found only when a
// query reads the value ("corrupt record"). checkValueLogs reads the files
// first so that such a store fails to open with ErrDamaged naming the file,
// like a damaged table (verify.go), and its mailbox is marked failed and can
// be rebuilt from Kafka.
//
// What it finds, and what it cannot:
//   - A sealed file (every file but the newest) is written whole and closed
//     at its last entry, so every byte must belong to an entry that checks:
//     a flipped byte, a file cut short inside an entry, garbage appended, a
//     file shorter than its header are all found. A file cut exactly at an
//     entry boundary looks whole (nothing records where it ended); a query
//     reading a value past its end fails ("corrupt record").
//   - The newest file: closed cleanly, Badger truncated it at its last
//     entry, so the same rule holds. Left by a crash it is still at the size
//     Badger created it with, twice the value-log file size (or more, when a
//     write outgrew it), zero past the last write, and its last write may be
//     torn (a kill -9 inside the copy into the mapping, a power loss before
//     the write's fsync, never acknowledged): entries must check up to a
//     point, and past it at most tornTail bytes of anything before zeros to
//     the end. A flipped byte within tornTail of the end of a crashed file's
//     data is taken for a torn write and dropped by Badger, as raft-wal does
//     with its last commit. The size, not trailing zeros, tells a crashed
//     file: a cleanly closed one ends in its last entry's CRC, whose last
//     byte is zero once in 256 files, and would be taken for a crashed file
//     whose flipped byte was a torn write. (A cleanly closed file reaches
//     the crashed size only if one write was larger than a value-log file,
//     128 MiB; it is then read as a crashed one.)
//   - The memtable logs (.mem) are not read here: Badger replays them on
//     open the same way, truncating at the first bad entry.
//
// Cost: every byte of a file not yet verified is read and checksummed:
// 514 MiB of value log in 135-166 ms on the shared 2-core machine, page
// cache warm (a cold cache reads at the disk's speed); store.Open of that
// store took 162 ms reading every file, 81 ms with the record below.
// A sealed file that checked is recorded with its size in vlogVerifiedFile
// and on later opens only its size is compared (a cut is found, a flip in
// the middle is not, and Badger checks no value's CRC on read: a query
// finds it only if the record no longer decodes), so an open reads the
// newest file and the one sealed since the last open, at most two files of
// 128 MiB, however large the store. A lost or unreadable record just means a full read.

// vlogVerifiedFile lists the sealed value-log files that checked, "<fid>
// <size>" per line.
const vlogVerifiedFile = "prism-vlog-verified"

const (
	vlogHeaderSize = 20
	// maxVlogKey is Badger's own bound on a key in the value log.
	maxVlogKey = 1 << 16
	// tornTail is how much data past the last entry that checks a crashed
	// newest file may hold before its zeros: its last write, torn. The
	// store's writes are one ingest batch (2,000 records of about a KiB
	// compressed to less by default) and Badger's value-log writes one or a
	// few of them at once.
	tornTail = 8 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checkValueLogs checks every value-log file of the store at dir (see
// above) and records the sealed ones that checked. prealloc is the size
// Badger creates a value-log file with, twice ValueLogFileSize.
func checkValueLogs(dir string, prealloc int64) error {
	names, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil {
		return fmt.Errorf("list value logs in %s: %w", dir, err)
	}
	type vlog struct {
		fid  uint64
		path string
	}
	var files []vlog
	for _, name := range names {
		fid, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(name), ".vlog"), 10, 32)
		if err != nil {
			continue // not a name Badger gives
		}
		files = append(files, vlog{fid, name})
	}
	if len(files) == 0 {
		return nil
	}
	slices.SortFunc(files, func(a, b vlog) int { return cmp.Compare(a.fid, b.fid) })
	verified := readVerified(dir)
	checked := map[uint64]int64{}
	for i, f := range files {
		newest := i == len(files)-1
		fi, err := os.Stat(f.path)
		if err != nil {
			return fmt.Errorf("value log %s: %w", f.path, err)
		}
		if size, ok := verified[f.fid]; ok && !newest {
			if size != fi.Size() {
				return fmt.Errorf("%w: value log %s: %d bytes, %d when it was verified", ErrDamaged, f.path, fi.Size(), size)
			}
			checked[f.fid] = size
			continue
		}
		if err := checkValueLog(f.path, newest, prealloc); err != nil {
			return fmt.Errorf("%w: value log %s: %v", ErrDamaged, f.path, err)
		}
		if !newest {
			checked[f.fid] = fi.Size()
		}
	}
	if !maps.Equal(checked, verified) {
		writeVerified(dir, checked)
	}
	return nil
}

// checkValueLog reads one value-log file's entries; the newest, when at
// least prealloc bytes (left by a crash), may end in a torn write.
func checkValueLog(path string, newest bool, prealloc int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size < vlogHeaderSize {
		if newest {
			return nil // created and never written: Badger starts it afresh
		}
		return fmt.Errorf("%d bytes, shorter than its %d-byte header", size, vlogHeaderSize)
	}
	end, err := entriesEnd(f, size)
	if err != nil {
		return err
	}
	if end == size {
		return nil
	}
	if !newest || size < prealloc {
		return fmt.Errorf("entry at offset %d does not check (bytes %d to %d are no entries)", end, end, size)
	}
	data, err := dataEnd(f, end, size)
	if err != nil {
		return err
	}
	switch {
	case data == end:
		return nil // a crash's preallocated zeros
	case data == size:
		return fmt.Errorf("entry at offset %d does not check and the file goes on to its end (%d bytes): cut short or overwritten", end, size)
	case data-end > tornTail:
		return fmt.Errorf("entry at offset %d does not check, %d bytes of data follow it", end, data-end)
	}
	return nil
}

// entriesEnd is the offset where the entries that check end, reading from
// the header on.
func entriesEnd(f *os.File, size int64) (int64, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, vlogHeaderSize, size-vlogHeaderSize), 1<<20)
	off := int64(vlogHeaderSize)
	var buf []byte
	for off < size {
		n, ok, err := readEntry(r, &buf)
		if err != nil {
			return 0, fmt.Errorf("read at offset %d: %w", off, err)
		}
		if !ok {
			break
		}
		off += n
	}
	return off, nil
}

// readEntry reads one entry from r into *buf, saying its length and whether
// it is whole and its checksum matches.
func readEntry(r *bufio.Reader, buf *[]byte) (n int64, ok bool, err error) {
	var hdr [2 + 3*binary.MaxVarintLen64]byte
	h := hdr[:0]
	short := func(err error) (int64, bool, error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, false, nil
		}
		return 0, false, err
	}
	for range 2 {
		b, err := r.ReadByte()
		if err != nil {
			return short(err)
		}
		h = append(h, b)
	}
	var lens [3]uint64
	for i := range lens {
		v, err := binary.ReadUvarint(byteRecorder{r, &h})
		if err != nil {
			return short(err)
		}
		lens[i] = v
	}
	klen, vlen := lens[0], lens[1]
	if klen > maxVlogKey || vlen > 1<<32 {
		return 0, false, nil
	}
	kv := int(klen + vlen)
	if cap(*buf) < kv+4 {
		*buf = make([]byte, kv+4)
	}
	b := (*buf)[:kv+4]
	if _, err := io.ReadFull(r, b); err != nil {
		return short(err)
	}
	sum := crc32.Update(crc32.Checksum(h, castagnoli), castagnoli, b[:kv])
	if sum != binary.BigEndian.Uint32(b[kv:]) {
		return 0, false, nil
	}
	return int64(len(h) + kv + 4), true, nil
}

// byteRecorder reads bytes from r, appending each to *h.
type byteRecorder struct {
	r *bufio.Reader
	h *[]byte
}

func (b byteRecorder) ReadByte() (byte, error) {
	c, err := b.r.ReadByte()
	if err == nil {
		*b.h = append(*b.h, c)
	}
	return c, err
}

// dataEnd is the offset past the last byte that is not zero in f's bytes
// from off to size (off if there is none). It reads only the extents that
// hold data: a crashed newest file is mostly a hole.
func dataEnd(f *os.File, off, size int64) (int64, error) {
	last := off
	buf := make([]byte, 1<<20)
	for off < size {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			start = off // no SEEK_DATA on this filesystem: read it all
		}
		stop, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil || stop > size {
			stop = size
		}
		for p := start; p < stop; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), stop-p)], p)
			if n == 0 && err != nil {
				return 0, fmt.Errorf("read at offset %d: %w", p, err)
			}
			if t := bytes.TrimRight(buf[:n], "\x00"); len(t) > 0 {
				last = p + int64(len(t))
			}
			p += int64(n)
		}
		off = stop
	}
	return last, nil
}

// readVerified is the record of sealed files that checked, empty when it
// is missing or unreadable (every file is then read).
func readVerified(dir string) map[uint64]int64 {
	out := map[uint64]int64{}
	b, err := os.ReadFile(filepath.Join(dir, vlogVerifiedFile))
	if err != nil {
		return out
	}
	for line := range strings.Lines(string(b)) {
		fidS, sizeS, ok := strings.Cut(strings.TrimSpace(line), " ")
		fid, err1 := strconv.ParseUint(fidS, 10, 32)
		size, err2 := strconv.ParseInt(sizeS, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return map[uint64]int64{}
		}
		out[fid] = size
	}
	return out
}

// writeVerified replaces the record. Failing to is no reason not to open:
// the next open reads the files again.
func writeVerified(dir string, sizes map[uint64]int64) {
	var b strings.Builder
	for _, fid := range slices.Sorted(maps.Keys(sizes)) {
		fmt.Fprintf(&b, "%d %d\n", fid, sizes[fid])
	}
	tmp := filepath.Join(dir, vlogVerifiedFile+".tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), fileMode); err != nil {
		return
	}
	if err := os.Rename(tmp, filepath.Join(dir, vlogVerifiedFile)); err != nil {
		_ = os.Remove(tmp)
	}
}
