package raftnode

import (
	"errors"
	"time"

	"github.com/hashicorp/raft"
)

// Leadership is what this node knows about the current leader.
type Leadership struct {
	// IsLeader is true once this node leads AND has applied every entry of
	// earlier terms (a barrier committed in its own term), so leader-only work
	// such as lease promotion sees the whole state.
	IsLeader bool
	// LeaderID and LeaderAddr name the known leader (possibly this node), or
	// are empty while there is none.
	LeaderID   string
	LeaderAddr string
	Term       uint64
}

// Leadership returns the current view and a channel closed at the next change,
// so a watcher never misses a transition and never blocks Raft.
func (n *Node) Leadership() (Leadership, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lead, n.changed
}

func (n *Node) setLeadership(update func(*Leadership)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	before := n.lead
	update(&n.lead)
	if n.lead == before {
		return
	}
	close(n.changed)
	n.changed = make(chan struct{})
	n.log.Info("leadership changed", "leader", n.lead.LeaderID, "is_leader", n.lead.IsLeader, "term", n.lead.Term)
}

// watchLeadership turns raft's notifications into Leadership updates. Raft
// blocks on NotifyCh, so the barrier of a new leader runs in its own goroutine.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case isLeader := <-n.notifyCh:
			n.mu.Lock()
			n.gen++
			gen := n.gen
			n.mu.Unlock()
			if isLeader {
				n.wg.Add(1)
				go n.establish(gen)
			} else {
				n.setLeadership(func(l *Leadership) {
					l.IsLeader = false
					l.Term = n.raft.CurrentTerm()
				})
			}
		case o := <-n.obsCh:
			switch d := o.Data.(type) {
			case raft.LeaderObservation:
				n.setLeadership(func(l *Leadership) {
					l.LeaderID, l.LeaderAddr = string(d.LeaderID), string(d.LeaderAddr)
					l.Term = n.raft.CurrentTerm()
				})
			case raft.RaftState:
				n.setLeadership(func(l *Leadership) { l.Term = n.raft.CurrentTerm() })
			}
		}
	}
}

// establish commits a barrier in the new term, retrying while this node still
// leads, then reports leadership.
func (n *Node) establish(gen uint64) {
	defer n.wg.Done()
	for {
		err := n.raft.Barrier(n.cfg.ApplyTimeout).Error()
		n.mu.Lock()
		current := n.gen == gen
		n.mu.Unlock()
		if !current {
			return
		}
		if err == nil {
			n.setLeadership(func(l *Leadership) {
				l.IsLeader = true
				l.LeaderID, l.LeaderAddr = n.cfg.ID, n.cfg.Advertise
				l.Term = n.raft.CurrentTerm()
			})
			return
		}
		if errors.Is(err, raft.ErrRaftShutdown) || errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return
		}
		n.log.Warn("leader barrier failed, retrying", "err", err)
		select {
		case <-n.stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
