package raftnode

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// ErrWALDamaged: a file of the node's raft-wal is not what raft-wal wrote (a
// flipped byte, a sealed segment cut short, a segment or the meta DB gone).
// raft-wal checks only the last commit of the newest segment when it opens,
// and reading a damaged entry later panics inside raft (raft.NewRaft decoding
// it: "short buffer"), so the node checks every segment before it starts.
var ErrWALDamaged = errors.New("raft-wal damaged")

// walWayOut is what an operator can do about a damaged or short log: the
// node's state is in the other members and in the snapshots.
const walWayOut = "the way out: restore this node from a snapshot (prism admin restore), " +
	"or remove it from the cluster (prismctl member remove ID) and rejoin it as a new member with an empty data dir (prism admin --join, prismctl member add)"

// raft-wal's segment format (github.com/hashicorp/raft-wal/segment/format.go):
// a 32-byte file header, then frames aligned to 8 bytes, each an 8-byte header
// (type, 3 reserved bytes, a little-endian length, or for a commit frame the
// CRC-32C of everything since the previous commit frame, the first one
// including the file header) and its padded payload. An all-zero header ends
// the data.
const (
	walFileHeaderLen  = 32
	walFrameHeaderLen = 8
	walMagic          = 0x58eb6b0d
	walFrameInvalid   = 0
	walFrameEntry     = 1
	walFrameIndex     = 2
	walFrameCommit    = 3
	walMetaFile       = "wal-meta.db"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segmentFile is a raft-wal segment on disk.
type segmentFile struct {
	path      string
	baseIndex uint64
	id        uint64
}

// walSegments lists the segment files of walDir, oldest first.
func walSegments(walDir string) ([]segmentFile, error) {
	names, err := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if err != nil {
		return nil, err
	}
	var segs []segmentFile
	for _, name := range names {
		var s segmentFile
		if n, err := fmt.Sscanf(filepath.Base(name), "%020d-%016x.wal", &s.baseIndex, &s.id); err != nil || n != 2 {
			continue
		}
		s.path = name
		segs = append(segs, s)
	}
	slices.SortFunc(segs, func(a, b segmentFile) int { return cmp.Compare(a.id, b.id) })
	return segs, nil
}

// checkWAL refuses a raft-wal directory that raft-wal would open but raft
// could not read: segment files without the meta DB that lists them, a
// segment whose header, frames or commit CRCs are wrong, or entries missing
// between a segment and the next one's base index (a segment cut short, or
// one gone). An unsealed segment's last commit is left to raft-wal, which
// rewinds a torn final write by itself (checkLogLoss then judges what that
// lost). A segment may hold more entries than the next one's base index
// says: raft-wal truncates a log's tail in its meta DB, not in the file. It
// reads every segment's data once.
func checkWAL(walDir string) error {
	segs, err := walSegments(walDir)
	if err != nil {
		return fmt.Errorf("list segments in %s: %w", walDir, err)
	}
	if len(segs) == 0 {
		return nil
	}
	meta := filepath.Join(walDir, walMetaFile)
	if _, err := os.Stat(meta); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s is missing beside %d segment files (it lists them and holds raft's term and vote); %s",
			ErrWALDamaged, meta, len(segs), walWayOut)
	}
	for i, s := range segs {
		entries, err := checkSegment(s)
		if err != nil {
			return fmt.Errorf("%w: segment %s: %v; %s", ErrWALDamaged, s.path, err, walWayOut)
		}
		if i == len(segs)-1 {
			continue
		}
		if next := segs[i+1].baseIndex; s.baseIndex+entries < next {
			return fmt.Errorf("%w: segment %s holds entries %d to %d but the next segment, %s, starts at %d (the segment is cut short, or a segment between them is gone); %s",
				ErrWALDamaged, s.path, s.baseIndex, s.baseIndex+entries-1, filepath.Base(segs[i+1].path), next, walWayOut)
		}
	}
	return nil
}

// checkSegment reads a segment's frames, checks its header and every
// commit's CRC, and returns how many entries its commits cover. A sealed
// segment (one with an index frame) must end with a commit; an unsealed
// one may end with a torn commit, which raft-wal rewinds.
func checkSegment(s segmentFile) (uint64, error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return 0, err
	}
	if len(b) < walFileHeaderLen {
		return 0, fmt.Errorf("%d bytes, shorter than its header", len(b))
	}
	if allZero(b) {
		// raft-wal writes a segment's header with its first commit, so a
		// segment it created and never wrote to (a restored node's empty log)
		// is all zeros: it holds no entries. Were it not the newest, the
		// check of the next segment's base index would catch it.
		return 0, nil
	}
	if binary.LittleEndian.Uint64(b[0:8]) != walMagic ||
		binary.LittleEndian.Uint64(b[8:16]) != s.baseIndex || binary.LittleEndian.Uint64(b[16:24]) != s.id {
		return 0, errors.New("header does not match its name")
	}
	var (
		off, crcStart          = walFileHeaderLen, 0
		entries, committed     uint64
		lastCommitEnd, commits int
		sealed                 bool
		badCommit              error
		badCommitEnd           int // the end of the first commit frame whose checksum is wrong
	)
	for off+walFrameHeaderLen <= len(b) {
		h := b[off : off+walFrameHeaderLen]
		typ, n := h[0], binary.LittleEndian.Uint32(h[4:8])
		if typ == walFrameInvalid {
			if !allZero(h) {
				return 0, fmt.Errorf("corrupt frame header at offset %d", off)
			}
			break
		}
		if h[1]|h[2]|h[3] != 0 {
			return 0, fmt.Errorf("corrupt frame header at offset %d", off)
		}
		switch typ {
		case walFrameEntry, walFrameIndex:
			size := walFrameHeaderLen + int(n) + pad8(int(n))
			if off+size > len(b) {
				return 0, fmt.Errorf("frame at offset %d runs past the end of the file (%d bytes): %w", off, len(b), io.ErrUnexpectedEOF)
			}
			if typ == walFrameEntry {
				entries++
			} else {
				sealed = true
			}
			off += size
		case walFrameCommit:
			if got := crc32.Checksum(b[crcStart:off], castagnoli); got != n && badCommit == nil {
				badCommit = fmt.Errorf("commit at offset %d: checksum %08x of the batch, %08x written", off, got, n)
				badCommitEnd = off + walFrameHeaderLen
			}
			commits++
			off += walFrameHeaderLen
			if badCommit == nil {
				committed = entries
			}
			crcStart, lastCommitEnd = off, off
		default:
			return 0, fmt.Errorf("unknown frame type %d at offset %d", typ, off)
		}
	}
	if badCommit != nil && (sealed || badCommitEnd != lastCommitEnd || lastCommitEnd != off) {
		// An unsealed segment whose last frame is its only bad commit is a torn final write,
		// raft-wal's to rewind; a bad commit anywhere else is damage.
		return 0, badCommit
	}
	if sealed && lastCommitEnd != off {
		return 0, fmt.Errorf("sealed segment ends at offset %d without a commit after its last frame", off)
	}
	return committed, nil
}

// newestSegment names the segment raft-wal appends to, for an error about
// the log's end, or the directory when it has none.
func newestSegment(walDir string) string {
	segs, err := walSegments(walDir)
	if err != nil || len(segs) == 0 {
		return walDir + " (no segment)"
	}
	return segs[len(segs)-1].path
}

func pad8(n int) int { return (8 - n%8) % 8 }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
