package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
)

// ErrLogLoss: the node's log ends before an index it had acknowledged as
// committed, so entries it stored were lost (a torn write, a disk that
// acknowledged an fsync it had not done). Raft cannot see this itself: a node
// with a short log votes and leads as if it had never had the entries.
var ErrLogLoss = errors.New("raft log lost entries this node acknowledged")

// keyAckedIndex is this package's key in raft's stable store (raft-wal's meta
// DB, beside the log, so a log that loses its tail keeps it). It holds a
// commit index this node knew: every entry up to it was in this node's log
// (a follower commits only what it stored, the leader only what it stored
// and a quorum acknowledged), and no committed entry is ever legitimately
// removed, except into a snapshot.
var keyAckedIndex = []byte("prism_acked_commit_index")

// ackedIndexEvery is how often the commit index is written there: one meta DB
// fsync per period at most, off the commit path. The mark trails the real
// commit index by up to a period, so a loss of fewer entries than one period
// commits can go unnoticed; lease epochs stay monotonic regardless
// (admin/fsm's epoch carries the term).
const ackedIndexEvery = 50 * time.Millisecond

// checkLogLoss compares what the stores hold (the log's last index, or the
// newest snapshot's) with the acknowledged mark. A shortfall is logged as an
// error naming both indexes and refused with ErrLogLoss, unless accept (an
// operator's decision to run on what is left): then the mark is lowered to
// what the node has. It returns the mark in force.
func checkLogLoss(logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, accept bool, log *slog.Logger) (uint64, error) {
	mark, err := stable.GetUint64(keyAckedIndex)
	if err != nil {
		return 0, fmt.Errorf("read acknowledged commit index: %w", err)
	}
	have, err := logs.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("read last log index: %w", err)
	}
	metas, err := snaps.List()
	if err != nil {
		return 0, fmt.Errorf("list snapshots: %w", err)
	}
	if len(metas) > 0 { // newest first
		have = max(have, metas[0].Index)
	}
	if have >= mark {
		return mark, nil
	}
	log.Error("raft log lost acknowledged entries: it ends before the commit index this node acknowledged; a node with a short log must not lead or vote until an operator decides",
		"acknowledged_index", mark, "last_index", have, "accept_log_loss", accept)
	if !accept {
		return 0, fmt.Errorf("%w: log ends at index %d, acknowledged %d; start with --accept-log-loss to run on what is left", ErrLogLoss, have, mark)
	}
	if err := stable.SetUint64(keyAckedIndex, have); err != nil {
		return 0, fmt.Errorf("lower acknowledged commit index to %d: %w", have, err)
	}
	return have, nil
}

// recordAckedIndex writes the commit index to the stable store whenever it
// has grown past written, every ackedIndexEvery, until the node stops.
func (n *Node) recordAckedIndex(stable raft.StableStore, written uint64) {
	defer n.wg.Done()
	t := time.NewTicker(ackedIndexEvery)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		ci := n.raft.CommitIndex()
		if ci <= written {
			continue
		}
		if err := stable.SetUint64(keyAckedIndex, ci); err != nil {
			n.log.Warn("record acknowledged commit index", "index", ci, "err", err)
			continue
		}
		written = ci
	}
}
