package raftnode

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// Seed is what Restore writes: the state of a new cluster's first snapshot.
type Seed struct {
	// Index and Term are the snapshot's raft index and term: the log
	// continues after Index, and Term is also the node's current term, so
	// its first election is for a later one.
	Index, Term uint64
	// Peers are the voters of the new cluster, this node included.
	Peers []Peer
	// FSM is the FSM snapshot's bytes, as its Persist writes them.
	FSM io.Reader
}

// Restore lays out a new node's data dir (the same layout New opens) from a
// snapshot, offline, as etcdutl snapshot restore does: raft's file snapshot
// store gets one snapshot at seed.Index/seed.Term whose configuration is
// seed.Peers, the stable store gets seed.Term as the current term, and the
// log is empty. New then finds existing state (so nothing is bootstrapped),
// restores the FSM from the snapshot and elects a leader of a term above
// seed.Term. Every node of the new cluster is restored from the same seed,
// so they start with equal logs. hashicorp/raft's RecoverCluster needs
// existing state and BootstrapCluster writes no FSM state; Raft.Restore
// needs a running leader and keeps its term: neither fits a cluster built
// from a file.
//
// It refuses a data dir that exists and is not empty, so it never mixes a
// snapshot into a node's earlier state, and on failure removes what it
// wrote, so a half-restored dir never starts.
func Restore(dataDir, id string, seed Seed) (err error) {
	if id == "" {
		return errors.New("restore: node id is required")
	}
	self := false
	conf := raft.Configuration{}
	for _, p := range seed.Peers {
		self = self || p.ID == id
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
	}
	if !self {
		return fmt.Errorf("restore: the peers do not include node %q", id)
	}
	if seed.Index == 0 || seed.Term == 0 {
		return fmt.Errorf("restore: snapshot index %d and term %d must both be above zero", seed.Index, seed.Term)
	}
	if err := emptyDir(dataDir); err != nil {
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		for _, sub := range []string{"wal", "snapshots"} {
			_ = os.RemoveAll(filepath.Join(dataDir, sub))
		}
	}()
	walDir := filepath.Join(dataDir, "wal")
	if err := os.MkdirAll(walDir, 0o750); err != nil {
		return fmt.Errorf("create %s: %w", walDir, err)
	}
	logger := hclog.NewNullLogger()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dataDir, 2, logger)
	if err != nil {
		return fmt.Errorf("snapshot store in %s: %w", dataDir, err)
	}
	// Create encodes the voters for version-0 readers through a transport;
	// an in-memory one encodes addresses as the TCP transport does.
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	sink, err := snaps.Create(raft.SnapshotVersionMax, seed.Index, seed.Term, conf, seed.Index, trans)
	if err != nil {
		return fmt.Errorf("create snapshot in %s: %w", dataDir, err)
	}
	if _, err := io.Copy(sink, seed.FSM); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write snapshot in %s: %w", dataDir, err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("finish snapshot in %s: %w", dataDir, err)
	}
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(walDir, wal.WithMetaStore(meta), wal.WithLogger(logger))
	if err != nil {
		_ = meta.Close()
		return fmt.Errorf("open wal in %s: %w", walDir, err)
	}
	err = w.SetUint64([]byte("CurrentTerm"), seed.Term)
	_ = w.Close()
	_ = meta.Close()
	if err != nil {
		return fmt.Errorf("set current term %d in %s: %w", seed.Term, walDir, err)
	}
	return nil
}

// emptyDir accepts a dir that does not exist or holds nothing.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("restore into %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("restore into %s: the data dir is not empty (it holds %s); restore only into a new node's empty dir", dir, entries[0].Name())
	}
	return nil
}
