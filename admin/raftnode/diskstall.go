package raftnode

import (
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// ExitDiskStall is the exit code of a node whose raft log or stable store
// write stayed blocked past Config.DiskStallTimeout.
const ExitDiskStall = 75

// A leader whose disk stalls keeps leading: hashicorp/raft's per-follower
// replication goroutines go on heartbeating while its main loop sits in
// StoreLogs, so no follower starts an election and nothing commits until the
// disk answers, if ever. Nothing that would move leadership gets through
// either: LeadershipTransfer and Shutdown are both handled by that blocked
// main loop. So the watchdog stops the process (fail-stop): the replication
// goroutines die with it, the followers miss its heartbeats and elect a new
// leader within the election timeout, and a supervisor restarts the node,
// which rejoins as a follower once its disk answers.

// stallWatch times writes and exits once one is blocked past timeout.
type stallWatch struct {
	timeout   time.Duration
	path      string
	log       *slog.Logger
	afterFunc func(time.Duration, func()) interface{ Stop() bool }
	exit      func(code int)
	once      sync.Once
}

func newStallWatch(timeout time.Duration, path string, log *slog.Logger) *stallWatch {
	return &stallWatch{timeout: timeout, path: path, log: log, exit: os.Exit,
		afterFunc: func(d time.Duration, f func()) interface{ Stop() bool } { return time.AfterFunc(d, f) }}
}

// time runs write, exiting the process if it is still blocked after timeout.
func (w *stallWatch) time(op string, write func() error) error {
	t := w.afterFunc(w.timeout, func() {
		w.once.Do(func() {
			w.log.Error("raft disk write stalled: exiting so that another node leads",
				"op", op, "path", w.path, "blocked", w.timeout, "exit_code", ExitDiskStall)
			w.exit(ExitDiskStall)
		})
	})
	defer t.Stop()
	return write()
}

// stallLogStore times the writes of a raft.LogStore.
type stallLogStore struct {
	raft.LogStore
	w *stallWatch
}

func (s stallLogStore) StoreLog(l *raft.Log) error {
	return s.w.time("StoreLog", func() error { return s.LogStore.StoreLog(l) })
}

func (s stallLogStore) StoreLogs(ls []*raft.Log) error {
	return s.w.time("StoreLogs", func() error { return s.LogStore.StoreLogs(ls) })
}

func (s stallLogStore) DeleteRange(lo, hi uint64) error {
	return s.w.time("DeleteRange", func() error { return s.LogStore.DeleteRange(lo, hi) })
}

// IsMonotonic passes raft-wal's answer through: raft deletes the whole log
// after restoring a snapshot only on a monotonic store.
func (s stallLogStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// stallStableStore times the writes of a raft.StableStore (the term and
// vote, written on raft's election path).
type stallStableStore struct {
	raft.StableStore
	w *stallWatch
}

func (s stallStableStore) Set(k, v []byte) error {
	return s.w.time("Set", func() error { return s.StableStore.Set(k, v) })
}

func (s stallStableStore) SetUint64(k []byte, v uint64) error {
	return s.w.time("SetUint64", func() error { return s.StableStore.SetUint64(k, v) })
}
