package raftnode

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// contactWatch sits between raft's TCP transport and raft, on the RPCs this
// node receives, for two things.
//
// It times the gaps between a leader's AppendEntries (heartbeats included),
// which are what a follower's heartbeat timeout waits on: how close the
// cluster runs to an election nobody wanted
// (prism_admin_raft_leader_contact_gap_seconds).
//
// And it ends the wait for a dead leader at the first follower's timeout,
// not the last one's. hashicorp/raft refuses a vote or pre-vote while it
// knows a leader, and forgets the leader only at its own heartbeat check,
// which runs at randomized ticks of HeartbeatTimeout to twice that: a
// follower that lost the leader HeartbeatTimeout ago still refuses the
// first candidate until its next tick. With two followers left the
// election so waited for the later of their two ticks (the failover
// benchmark's traces, BENCHMARKS.md). Raft's own rule (Ongaro's thesis,
// §4.2.3; etcd's raft) refuses only within the minimum election timeout of
// hearing from a leader. So after raft refuses a vote or pre-vote, if this
// follower has not heard from its leader for HeartbeatTimeout, the watch
// has raft run its heartbeat check now (or at the moment the silence
// reaches HeartbeatTimeout), the check raft's own tick would run: it
// forgets the leader and stands. The refused candidate waits out its
// election timer meanwhile, so it grants this node's pre-vote and vote
// rather than splitting the vote with it. A follower that still hears
// from its leader (a candidate cut off from it alone) is never hurried.
//
// And it makes the first follower's timeout deterministic (standBy): raft's
// own check runs at those randomized ticks, so a dead leader was noticed
// HeartbeatTimeout to twice that after its last word (a p99 of ~370 ms
// under --raft-timing fast, BENCHMARKS.md). The watch has raft run the
// check once the silence reaches HeartbeatTimeout plus this follower's
// stagger: its rank among the voters other than the leader, sorted by id,
// times a third of HeartbeatTimeout (standOffset). A check is raft's: it
// stands only if raft too has not heard from a leader for HeartbeatTimeout.
type contactWatch struct {
	timeout time.Duration
	// lastContact and follower read raft; nil-safe before raft runs.
	lastContact func() time.Time
	follower    func() bool
	// check has raft run its heartbeat check now.
	check func()
	// self, leader and voters place this node among the voters for its
	// stagger; voters asks raft, so it is asked once per leader.
	self   string
	leader func() string
	voters func() ([]string, error)
	gaps   prometheus.Histogram
	log    *slog.Logger
	stop   chan struct{}

	// Owned by standBy's goroutine.
	votersOf   string // the leader voters was read under
	voterIDs   []string
	votersRead bool
	// quietFrom: the silence is counted from here when the leader's last
	// word is older: when this node was last seen becoming a follower (at
	// start, or after it stood and lost: its last contact is then the old
	// leader's, and the new one has had no time to speak), or last
	// hurried raft. Raft's own timer restarts at the same moments.
	quietFrom   time.Time
	wasFollower bool
	// hurried counts the checks standBy had raft run.
	hurried atomic.Uint64

	mu         sync.Mutex
	prev       time.Time
	prevLeader string
	prevTerm   uint64
	pending    *time.Timer
}

// contactGapBuckets resolve the gaps around the fast timing's 150 ms
// heartbeat timeout and the default's 1 s, and the heartbeats' own
// interval (a tenth of the timeout to a fifth: 15-30 ms under fast).
var contactGapBuckets = []float64{.005, .01, .015, .02, .03, .04, .05, .06, .075, .1, .125, .15, .2, .3, .5, .75, 1, 2, 5}

func newContactGaps() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "prism_admin_raft_leader_contact_gap_seconds",
		Help: "Time between consecutive AppendEntries (heartbeats included) this follower received from its leader; " +
			"a gap past the heartbeat timeout (--raft-timing) may start an election, and is then not counted (the next contact is of a new term).",
		Buckets: contactGapBuckets,
	})
}

// contact notes an AppendEntries from leader in term. Only gaps within
// one leader's term are timed: across terms the silence is an election's.
func (w *contactWatch) contact(leader string, term uint64) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if leader == w.prevLeader && term == w.prevTerm && !w.prev.IsZero() {
		gap := now.Sub(w.prev)
		w.gaps.Observe(gap.Seconds())
		if gap >= w.timeout {
			w.log.Warn("no word from the leader for longer than the heartbeat timeout", "leader", leader, "term", term,
				"silent", gap, "heartbeat_timeout", w.timeout)
		}
	}
	w.prev, w.prevLeader, w.prevTerm = now, leader, term
}

// refused is called after raft refused a vote or pre-vote.
func (w *contactWatch) refused() {
	if !w.follower() {
		return
	}
	silent := time.Since(w.lastContact())
	if silent >= w.timeout {
		w.check()
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending != nil {
		return
	}
	// The leader's last word came just before the candidate's request:
	// raft's own check would forget it at a tick from now.
	w.pending = time.AfterFunc(w.timeout-silent, func() {
		w.mu.Lock()
		w.pending = nil
		w.mu.Unlock()
		select {
		case <-w.stop:
			return
		default:
		}
		if w.follower() && time.Since(w.lastContact()) >= w.timeout {
			w.check()
		}
	})
}

// standBy has raft check the heartbeat when this follower's silence reaches
// HeartbeatTimeout plus its stagger, until the watch closes. It wakes about
// once a HeartbeatTimeout: at the deadline the last contact set, which is
// moved on if the leader spoke since.
func (w *contactWatch) standBy() {
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		t.Reset(w.standIfSilent())
	}
}

// standIfSilent has raft check the heartbeat if this follower has been
// without its leader for HeartbeatTimeout plus its stagger, and returns when
// to look again.
func (w *contactWatch) standIfSilent() time.Duration {
	now := time.Now()
	if !w.follower() {
		w.wasFollower = false
		return w.timeout
	}
	if !w.wasFollower {
		w.wasFollower, w.quietFrom = true, now
	}
	offset, ok := w.standOffset()
	if !ok {
		return w.timeout
	}
	due := w.timeout + offset
	silent := now.Sub(later(w.lastContact(), w.quietFrom))
	if silent < due {
		return due - silent
	}
	w.hurried.Add(1)
	w.log.Info("no word from the leader for the heartbeat timeout and this node's stagger: raft checks now",
		"leader", w.votersOf, "silent", silent, "heartbeat_timeout", w.timeout, "stagger", offset)
	w.check()
	// Raft now stands, or keeps a leader it heard from meanwhile; either
	// way the count starts again, as raft's timer does.
	w.quietFrom = now
	return due
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// standOffset is how long past HeartbeatTimeout of silence this follower
// waits before it has raft stand: its rank among the voters other than the
// leader it knows (all of them without one), sorted by id, times a third of
// HeartbeatTimeout (50 ms under --raft-timing fast). Not ok when this node
// is not a voter (raft would not stand) or the voters cannot be read.
//
// Why the stagger, and why a third. With PreVote a pre-vote binds no one:
// a follower that has itself stood knows no leader, so it grants any
// pre-vote with a log as long as its own. Two followers standing within one
// pre-vote round trip of each other would both pass the pre-vote, both vote
// for themselves in the next term and split it, and the cluster would wait
// out a randomized election timeout (150-300 ms more under fast) for a
// second round. Staggered, the first survivor (rank 0, no offset: the
// leader's death is noticed HeartbeatTimeout after its last word) stands
// while the second still knows the leader, so the second refuses its
// pre-vote; that refusal has the second stand at once (refused, above),
// while the first, its pre-vote lost, waits out its election timer and so
// grants the second's pre-vote and vote: one candidate. The second stands
// on its own only a third of the timeout later, far past a pre-vote's round
// trip (a loopback RPC: under a millisecond idle, tens of ms on this
// 2-core machine at its worst, BENCHMARKS.md). What this cannot order is
// raft's own randomized tick, which still runs and may stand the second
// follower within that round trip of the first.
func (w *contactWatch) standOffset() (time.Duration, bool) {
	leader := w.leader()
	if !w.votersRead || leader != w.votersOf {
		ids, err := w.voters()
		if err != nil {
			w.log.Warn("raft configuration for the heartbeat stagger", "err", err)
			return 0, false
		}
		w.voterIDs, w.votersOf, w.votersRead = ids, leader, true
	}
	return stagger(w.self, w.votersOf, w.voterIDs, w.timeout)
}

// stagger is self's offset among voters without leader: its rank, sorted
// by id, times a third of timeout. Not ok when self is not among them.
func stagger(self, leader string, voters []string, timeout time.Duration) (time.Duration, bool) {
	others := slices.DeleteFunc(slices.Clone(voters), func(id string) bool { return id == leader })
	slices.Sort(others)
	rank := slices.Index(others, self)
	if rank < 0 {
		return 0, false
	}
	return time.Duration(rank) * timeout / 3, true
}

func (w *contactWatch) close() {
	close(w.stop)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending != nil {
		w.pending.Stop()
	}
}

// watchedTransport is raft's TCP transport with a contactWatch on what it
// delivers.
type watchedTransport struct {
	*raft.NetworkTransport
	w    *contactWatch
	out  chan raft.RPC
	once sync.Once
}

func newWatchedTransport(tr *raft.NetworkTransport, w *contactWatch) *watchedTransport {
	t := &watchedTransport{NetworkTransport: tr, w: w, out: make(chan raft.RPC)}
	go t.pump(tr.Consumer())
	go w.standBy()
	return t
}

func (t *watchedTransport) Consumer() <-chan raft.RPC { return t.out }

// SetHeartbeatHandler sees the heartbeats, which the transport hands to
// raft directly, not through Consumer.
func (t *watchedTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		t.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		t.note(&rpc)
		cb(rpc)
	})
}

func (t *watchedTransport) Close() error {
	t.once.Do(t.w.close)
	return t.NetworkTransport.Close()
}

func (t *watchedTransport) pump(in <-chan raft.RPC) {
	for {
		select {
		case <-t.w.stop:
			return
		case rpc := <-in:
			t.note(&rpc)
			select {
			case t.out <- rpc:
			case <-t.w.stop:
				return
			}
		}
	}
}

// note records a leader's contact, and on a vote or pre-vote request
// routes raft's answer through the watch, which acts once raft has answered:
// hurrying the check before would make this node a candidate that grants
// the request and splits the vote with it.
func (t *watchedTransport) note(rpc *raft.RPC) {
	switch req := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		t.w.contact(string(req.ID), req.Term)
	case *raft.RequestVoteRequest, *raft.RequestPreVoteRequest:
		answer := rpc.RespChan
		mine := make(chan raft.RPCResponse, 1)
		rpc.RespChan = mine
		go func() {
			select {
			case <-t.w.stop:
			case resp := <-mine:
				answer <- resp
				if !granted(resp.Response) {
					t.w.refused()
				}
			}
		}()
	}
}

func granted(resp any) bool {
	switch r := resp.(type) {
	case *raft.RequestVoteResponse:
		return r.Granted
	case *raft.RequestPreVoteResponse:
		return r.Granted
	}
	return false
}

func (n *Node) newContactWatch(timeout time.Duration) *contactWatch {
	return &contactWatch{
		timeout: timeout,
		lastContact: func() time.Time {
			if r := n.current.Load(); r != nil {
				return r.LastContact()
			}
			return time.Now()
		},
		follower: func() bool {
			r := n.current.Load()
			return r != nil && r.State() == raft.Follower
		},
		check: n.checkHeartbeatNow,
		self:  n.cfg.ID,
		leader: func() string {
			if r := n.current.Load(); r != nil {
				_, id := r.LeaderWithID()
				return string(id)
			}
			return ""
		},
		voters: n.voterIDs,
		gaps:   n.gaps,
		log:    n.log,
		stop:   make(chan struct{}),
	}
}

// voterIDs reads the voters of raft's latest configuration.
func (n *Node) voterIDs() ([]string, error) {
	r := n.current.Load()
	if r == nil {
		return nil, ErrShutdown
	}
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("read raft configuration: %w", err)
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			ids = append(ids, string(s.ID))
		}
	}
	return ids, nil
}

// checkHeartbeatNow has raft run its follower heartbeat check at once: raft
// runs it when its reloadable HeartbeatTimeout drops, so the timeout drops
// by a nanosecond and is put back. Raft compares the silence with whichever
// it reads, the same timeout to a nanosecond.
func (n *Node) checkHeartbeatNow() {
	r := n.current.Load()
	if r == nil {
		return
	}
	n.checkMu.Lock()
	defer n.checkMu.Unlock()
	rc := r.ReloadableConfig()
	rc.HeartbeatTimeout = n.cfg.Timing.HeartbeatTimeout - time.Nanosecond
	if err := r.ReloadConfig(rc); err != nil {
		n.log.Warn("raft heartbeat check", "err", err)
		return
	}
	rc.HeartbeatTimeout = n.cfg.Timing.HeartbeatTimeout
	if err := r.ReloadConfig(rc); err != nil {
		n.log.Error("restore raft heartbeat timeout", "timeout", rc.HeartbeatTimeout, "err", err)
	}
}

// ContactGaps exports prism_admin_raft_leader_contact_gap_seconds (empty on
// an in-memory node, whose transport has no watch).
func (n *Node) ContactGaps() prometheus.Collector { return n.gaps }
