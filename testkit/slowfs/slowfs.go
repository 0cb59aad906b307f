// Package slowfs serves a directory through FUSE as a loopback file system
// whose fsyncs a test can hold: a disk that stalls (a saturated or failing
// device, a throttled cloud volume) as the process writing to it sees it,
// with nothing but mount(2) and /dev/fuse, no dm-delay or fusermount.
//
// Only fsync and fsyncdir wait: reads and writes reach the page cache of the
// backing file system as they would on a real disk whose flushes are slow.
// One difference: the kernel's FUSE client holds a file's inode lock for
// the whole fsync, so a write to the file being synced waits too (raft-wal
// writes and syncs from one goroutine, so it never does that).
package slowfs

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrUnsupported says this process cannot mount a FUSE file system here.
var ErrUnsupported = errors.New("slowfs: FUSE unavailable")

// FS is one mounted loopback file system.
type FS struct {
	server     *fuse.Server
	mountpoint string

	mu sync.Mutex
	// stall is open while fsyncs are held; Release closes it.
	stall chan struct{}

	fsyncs, held atomic.Int64
}

// Mount serves backing at mountpoint (an existing empty directory). It needs
// root and /dev/fuse: without them the error wraps ErrUnsupported.
func Mount(backing, mountpoint string) (*FS, error) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("slowfs: loopback of %s: %w", backing, err)
	}
	f := &FS{mountpoint: mountpoint}
	raw := &stallingFS{RawFileSystem: fs.NewNodeFS(root, &fs.Options{}), fs: f}
	srv, err := fuse.NewServer(raw, mountpoint, &fuse.MountOptions{
		// mount(2) directly: there may be no fusermount binary.
		DirectMountStrict: true,
		FsName:            backing,
		Name:              "slowfs",
	})
	if err != nil {
		return nil, fmt.Errorf("%w: mount %s on %s: %v", ErrUnsupported, backing, mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		_ = syscall.Unmount(mountpoint, syscall.MNT_DETACH)
		return nil, fmt.Errorf("%w: mount %s on %s: %v", ErrUnsupported, backing, mountpoint, err)
	}
	f.server = srv
	return f, nil
}

// Stall holds every fsync from now until Release.
func (f *FS) Stall() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stall == nil {
		f.stall = make(chan struct{})
	}
}

// Release lets the held fsyncs through, each then reaching the backing file.
func (f *FS) Release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stall != nil {
		close(f.stall)
		f.stall = nil
	}
}

// Fsyncs counts the fsyncs asked of the file system and those that were held.
func (f *FS) Fsyncs() (total, held int64) { return f.fsyncs.Load(), f.held.Load() }

// Unmount releases any stall and unmounts, lazily (MNT_DETACH) when the file
// system is still busy, so a test never leaves a mount that blocks its
// temp-dir cleanup.
func (f *FS) Unmount() error {
	f.Release()
	if err := f.server.Unmount(); err != nil {
		if derr := syscall.Unmount(f.mountpoint, syscall.MNT_DETACH); derr != nil {
			return fmt.Errorf("slowfs: unmount %s: %v; lazy unmount: %w", f.mountpoint, err, derr)
		}
	}
	return nil
}

// wait blocks while fsyncs are held, or until the kernel interrupts the
// request (the caller was killed).
func (f *FS) wait(cancel <-chan struct{}) fuse.Status {
	f.fsyncs.Add(1)
	f.mu.Lock()
	stall := f.stall
	f.mu.Unlock()
	if stall == nil {
		return fuse.OK
	}
	f.held.Add(1)
	select {
	case <-stall:
		return fuse.OK
	case <-cancel:
		return fuse.EINTR
	}
}

// stallingFS holds fsyncs at the protocol level, so files and directories
// (raft-wal syncs its directory when it creates a segment) wait alike.
type stallingFS struct {
	fuse.RawFileSystem
	fs *FS
}

func (s *stallingFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if st := s.fs.wait(cancel); st != fuse.OK {
		return st
	}
	return s.RawFileSystem.Fsync(cancel, in)
}

func (s *stallingFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if st := s.fs.wait(cancel); st != fuse.OK {
		return st
	}
	return s.RawFileSystem.FsyncDir(cancel, in)
}
