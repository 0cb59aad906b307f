// Package backup saves the admin cluster's replicated state to a file and
// builds a new cluster's data from one (RFC-038 "Disaster recovery"), as
// etcdctl snapshot save and etcdutl snapshot restore do for etcd.
//
// A snapshot file is the 8-byte magic "PRSMSNP1", then a length-delimited
// prism.admin.v1.SnapshotInfo (the raft index and term it was taken at, the
// FSM snapshot's format, length and SHA-256), then the FSM snapshot itself,
// byte for byte what admin/fsm persists into raft's snapshot store. Nothing
// follows it. Files are written to a temporary name, synced and renamed, so
// a crash leaves either the whole file or none.
package backup

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protodelim"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Magic opens every snapshot file; the trailing digit is the file layout's
// version.
const Magic = "PRSMSNP1"

// maxInfoSize bounds the header a reader accepts, so a corrupt length cannot
// make it allocate much.
const maxInfoSize = 1 << 20

// ErrCorrupt: the file is not a whole snapshot file as written here
// (truncated, altered, or something else entirely).
var ErrCorrupt = errors.New("corrupt snapshot file")

// Write writes a snapshot file's bytes to w: the header, then the FSM
// snapshot read from data, which must be exactly info.Size bytes hashing to
// info.Sha256 (checked while copying, so a short or altered stream fails
// rather than producing a file the restore would refuse later).
func Write(w io.Writer, info *adminv1.SnapshotInfo, data io.Reader) error {
	if len(info.GetSha256()) != sha256.Size {
		return fmt.Errorf("snapshot info has a %d-byte checksum, want SHA-256", len(info.GetSha256()))
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	if _, err := bw.WriteString(Magic); err != nil {
		return err
	}
	if _, err := protodelim.MarshalTo(bw, info); err != nil {
		return fmt.Errorf("write snapshot header: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(bw, h), io.LimitReader(data, int64(info.GetSize())+1))
	if err != nil {
		return fmt.Errorf("write fsm snapshot: %w", err)
	}
	if uint64(n) != info.GetSize() {
		return fmt.Errorf("fsm snapshot is %d bytes, its header says %d", n, info.GetSize())
	}
	if sum := h.Sum(nil); !bytes.Equal(sum, info.GetSha256()) {
		return fmt.Errorf("fsm snapshot hashes to %x, its header says %x", sum, info.GetSha256())
	}
	return bw.Flush()
}

// WriteFile writes a snapshot file at path atomically: a temporary file in
// the same directory, synced, renamed over path, and the directory synced.
func WriteFile(path string, info *adminv1.SnapshotInfo, data io.Reader) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary snapshot file in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err := Write(tmp, info, data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s to sync it: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Read reads a whole snapshot file from r and verifies it: the magic, a
// header, exactly the FSM snapshot bytes the header announces, and their
// checksum. Every failure wraps ErrCorrupt and says what is wrong.
func Read(r io.Reader) (*adminv1.SnapshotInfo, []byte, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	magic := make([]byte, len(Magic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != Magic {
		return nil, nil, fmt.Errorf("%w: does not start with %q: not a file prismctl snapshot save or prism admin --backup-dir wrote", ErrCorrupt, Magic)
	}
	info := &adminv1.SnapshotInfo{}
	if err := (protodelim.UnmarshalOptions{MaxSize: maxInfoSize}).UnmarshalFrom(br, info); err != nil {
		return nil, nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if len(info.GetSha256()) != sha256.Size {
		return nil, nil, fmt.Errorf("%w: header has a %d-byte checksum, want SHA-256", ErrCorrupt, len(info.GetSha256()))
	}
	// The size comes from the file, so read through a limit rather than
	// allocating what it claims.
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(br, int64(info.GetSize())+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read fsm snapshot: %w", err)
	}
	switch {
	case uint64(n) < info.GetSize():
		return nil, nil, fmt.Errorf("%w: truncated: the header announces %d bytes of FSM snapshot, the file holds %d", ErrCorrupt, info.GetSize(), n)
	case uint64(n) > info.GetSize():
		return nil, nil, fmt.Errorf("%w: bytes follow the %d bytes of FSM snapshot the header announces", ErrCorrupt, info.GetSize())
	}
	data := buf.Bytes()
	if sum := sha256.Sum256(data); !bytes.Equal(sum[:], info.GetSha256()) {
		return nil, nil, fmt.Errorf("%w: checksum mismatch: the header says sha256 %s, the FSM snapshot hashes to %s",
			ErrCorrupt, hex.EncodeToString(info.GetSha256()), hex.EncodeToString(sum[:]))
	}
	return info, data, nil
}

// ReadFile reads and verifies the snapshot file at path (Read).
func ReadFile(path string) (*adminv1.SnapshotInfo, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	info, data, err := Read(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return info, data, nil
}
