package raftnode

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"
)

// Suffrage is a server's part in the latest configuration.
type Suffrage int

// A server is not in the configuration, or in it as a non-voter or a voter.
const (
	NotMember Suffrage = iota
	Nonvoter
	Voter
)

// Suffrage reads this node's part in its latest configuration.
func (n *Node) Suffrage() (Suffrage, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return NotMember, mapErr(err)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) != n.cfg.ID {
			continue
		}
		if s.Suffrage == raft.Voter {
			return Voter, nil
		}
		return Nonvoter, nil
	}
	return NotMember, nil
}

// StartedEmpty reports whether the node's stores held no raft state when it
// started: only such a node may ask to join (a node with state that is not
// a member was removed, and must not add itself back).
func (n *Node) StartedEmpty() bool { return n.startedEmpty }

// CommitIndex is the latest index known committed.
func (n *Node) CommitIndex() uint64 { return n.raft.CommitIndex() }

// AddNonvoter adds a member that receives the log but does not vote, so it
// catches up before it counts for a quorum. An existing member keeps its
// suffrage (a voter is not demoted) and takes addr. Leader only.
func (n *Node) AddNonvoter(ctx context.Context, id, addr string) (uint64, error) {
	f := n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.timeout(ctx))
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("add non-voter %s at %s: %w", id, addr, mapErr(err))
	}
	n.log.Info("added non-voter", "peer", id, "addr", addr, "index", f.Index())
	return f.Index(), nil
}
