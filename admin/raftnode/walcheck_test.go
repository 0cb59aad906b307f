package raftnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// walNode is the config of a single node on dir whose raft-wal segments
// hold about 40 entries of writeWAL's each.
func walNode(t *testing.T, dir string) Config {
	return Config{ID: "s", DataDir: dir, Listener: listen(t), Bootstrap: true, Timing: FastTiming(), Logger: quietLogger(),
		walSegmentSize: 16 << 10}
}

// writeWAL writes a single node's log of a few hundred entries to dir and
// stops it, returning the wal segment files, oldest first.
func writeWAL(t *testing.T, dir string) []string {
	t.Helper()
	n, err := New(walNode(t, dir), newKV())
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, n)
	for i := range 300 {
		if _, _, err := n.Apply(context.Background(), []byte(fmt.Sprintf("k%d=%s", i, strings.Repeat("v", 200)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	segs, err := walSegments(filepath.Join(dir, "wal"))
	if err != nil || len(segs) < 3 {
		t.Fatalf("%d wal segments in %s (%v), want several", len(segs), dir, err)
	}
	var paths []string
	for _, s := range segs {
		paths = append(paths, s.path)
	}
	return paths
}

// dataEnd is where a segment's frames end (its first all-zero frame header).
func dataEnd(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := walFileHeaderLen
	for off+walFrameHeaderLen <= len(b) && !allZero(b[off:off+walFrameHeaderLen]) {
		off += walFrameHeaderLen
		if b[off-walFrameHeaderLen] != walFrameCommit {
			n := int(binary.LittleEndian.Uint32(b[off-4 : off]))
			off += n + pad8(n)
		}
	}
	return off
}

func flip(t *testing.T, path string, at int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x40
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedWALRefusesToStart: a node whose raft-wal was damaged (a flipped
// byte inside a segment, a segment cut short, a file gone) refuses to start
// with an error naming the file and the way out, never a panic; the same log
// undamaged starts and keeps its state.
func TestDamagedWALRefusesToStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string, segs []string) string // returns the file the error must name
	}{
		{name: "flipped byte in a sealed segment", damage: func(t *testing.T, dir string, segs []string) string {
			flip(t, segs[1], dataEnd(t, segs[1])/2)
			return segs[1]
		}},
		{name: "flipped byte early in the newest segment", damage: func(t *testing.T, dir string, segs []string) string {
			tail := segs[len(segs)-1]
			flip(t, tail, walFileHeaderLen+walFrameHeaderLen+2)
			return tail
		}},
		{name: "sealed segment cut short", damage: func(t *testing.T, dir string, segs []string) string {
			if err := os.Truncate(segs[1], int64(dataEnd(t, segs[1])/2)); err != nil {
				t.Fatal(err)
			}
			return segs[1]
		}},
		{name: "newest segment cut short", damage: func(t *testing.T, dir string, segs []string) string {
			tail := segs[len(segs)-1]
			if err := os.Truncate(tail, int64(walFileHeaderLen+walFrameHeaderLen)); err != nil {
				t.Fatal(err)
			}
			return tail
		}},
		{name: "sealed segment missing", damage: func(t *testing.T, dir string, segs []string) string {
			if err := os.Remove(segs[1]); err != nil {
				t.Fatal(err)
			}
			return filepath.Base(segs[2])
		}},
		{name: "meta missing", damage: func(t *testing.T, dir string, segs []string) string {
			meta := filepath.Join(dir, "wal", walMetaFile)
			if err := os.Remove(meta); err != nil {
				t.Fatal(err)
			}
			return meta
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			segs := writeWAL(t, dir)
			file := tc.damage(t, dir, segs)
			n, err := New(walNode(t, dir), newKV())
			if err == nil {
				_ = n.Shutdown()
				t.Fatalf("started on a damaged wal (%s)", file)
			}
			for _, want := range []string{file, "restore this node from a snapshot", "rejoin it as a new member"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
}

func TestUndamagedWALStarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeWAL(t, dir)
	if err := checkWAL(filepath.Join(dir, "wal")); err != nil {
		t.Fatalf("checkWAL on an undamaged log: %v", err)
	}
	fsm := newKV()
	n, err := New(walNode(t, dir), fsm)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, n)
	waitLeader(t, n)
	waitFor(t, "the log replayed", func() bool { v, _ := fsm.get("k299"); return v != "" })
}

// A restored node's log is one segment raft-wal created and never wrote
// (its header comes with the first commit): all zeros, and sound.
func TestRestoredEmptyLogPassesTheCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := Restore(dir, "a1", Seed{Index: 10, Term: 5, Peers: []Peer{{ID: "a1", Addr: "127.0.0.1:1"}}, FSM: strings.NewReader("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := checkWAL(filepath.Join(dir, "wal")); err != nil {
		t.Fatalf("a restored data dir fails the wal check: %v", err)
	}
}
