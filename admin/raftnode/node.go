// Package raftnode runs one member of the admin cluster's Raft group:
// hashicorp/raft with raft-wal as log and stable store, file snapshots and a
// TCP transport, or everything in memory for unit tests. It is generic over
// raft.FSM and knows nothing about admin state. The TCP transport runs over
// mutual TLS between members' admin identities when configured.
package raftnode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// Errors callers branch on.
var (
	// ErrNotLeader: the call needs the leader and this node is not it (or
	// lost leadership while waiting). Callers forward or retry.
	ErrNotLeader = errors.New("not the raft leader")
	// ErrLeadershipLost: leadership was lost after the entry was appended;
	// it may still commit. Callers must not blindly re-propose it.
	ErrLeadershipLost = errors.New("leadership lost while committing; outcome unknown")
	// ErrShutdown: the node is stopping.
	ErrShutdown = errors.New("raft node shut down")
)

// Peer is one voter of a static cluster.
type Peer struct {
	ID   string
	Addr string // raft address the others dial
}

// Timing holds the Raft timeouts. `prism admin` runs FastTiming unless told
// --raft-timing=wan (DefaultTiming): FastTiming meets RFC-038's failover
// on one host or a LAN, DefaultTiming tolerates long leader silences
// (docs/operations.md#raft-timing-and-leader-failover). A Config without
// one (in-process nodes, tests) gets DefaultTiming.
type Timing struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
}

// DefaultTiming is hashicorp/raft's default, tolerant of slow networks and
// of leader stalls up to a second, at about a second more failover.
func DefaultTiming() Timing {
	d := raft.DefaultConfig()
	return Timing{d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout, d.CommitTimeout}
}

// FastTiming targets sub-500ms failover on one host or a low-latency LAN.
// The lease stays below the heartbeat timeout so a partitioned leader steps
// down before a new one can be elected.
func FastTiming() Timing {
	return Timing{
		HeartbeatTimeout:   150 * time.Millisecond,
		ElectionTimeout:    150 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond,
		CommitTimeout:      20 * time.Millisecond,
	}
}

// Config describes one node.
type Config struct {
	ID string
	// DataDir holds the WAL and snapshots. Empty means in memory: the node
	// forgets everything on shutdown and talks over an in-memory transport.
	DataDir string
	// BindAddr is the TCP address the raft transport listens on.
	BindAddr string
	// Listener, when set, is used instead of listening on BindAddr (lets tests
	// bind 127.0.0.1:0 before the peer list is known).
	Listener net.Listener
	// Advertise is the address stored in the configuration for this node
	// (e.g. a proxy in front of it); defaults to the bound address.
	Advertise string
	// Peers is the full static voter set, this node included. When set and the
	// node has no state yet, it bootstraps with all of them as voters.
	Peers []Peer
	// Bootstrap makes a node without peers and without state the single voter
	// of a new cluster.
	Bootstrap bool
	// DialAddrs overrides the address dialed for a server id, e.g. to route
	// each pair of nodes through its own fault proxy.
	DialAddrs map[string]string
	// TLS, when set, runs the TCP transport over mutual TLS with this
	// node's identity, which must be admin/<ID>. A peer that connects must be
	// admin/<id> with id a server of the latest configuration (before this
	// node has one: of Peers or JoinPeers); a server dialed must be the
	// admin/<id> of the member raft dials at that address. Nil is plaintext
	// and unauthenticated.
	TLS *pki.Source
	// JoinPeers are the members of the cluster a node without state waits
	// to be added to (--join): nothing is bootstrapped from them, but over
	// TLS they are the identities accepted until raft replicates a
	// configuration to this node.
	JoinPeers []Peer

	Timing            Timing
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	// ApplyTimeout bounds Apply and membership changes when the context has
	// no earlier deadline.
	ApplyTimeout time.Duration
	// AcceptLogLoss lets a node whose log ends before the commit index it had
	// acknowledged start anyway, on what is left (ErrLogLoss otherwise). An
	// operator's decision for one start, after checking the other members.
	AcceptLogLoss bool
	// DiskStallTimeout, when positive, ends the process with ExitDiskStall
	// once a raft log or stable store write has been blocked this long (a
	// stalled disk; see diskstall.go for why fail-stop). Zero disables it.
	DiskStallTimeout time.Duration

	Logger  *slog.Logger
	Metrics Metrics

	// walSegmentSize is raft-wal's segment size (0: its 64 MiB); tests make
	// it small to have several segments.
	walSegmentSize int
}

// Metrics receives latencies; nil fields are skipped.
type Metrics struct {
	// Commit is the time from Apply to the leader's FSM having applied the
	// entry (replication to a quorum, fsync and apply).
	Commit func(time.Duration)
	// FSMApply is the time the FSM spends in Apply (or ApplyBatch).
	FSMApply func(time.Duration)
}

func (c *Config) withDefaults() error {
	if c.ID == "" {
		return errors.New("raftnode: node id is required")
	}
	if c.Timing == (Timing{}) {
		c.Timing = DefaultTiming()
	}
	d := raft.DefaultConfig()
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = d.SnapshotInterval
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.DataDir != "" && c.BindAddr == "" && c.Listener == nil {
		return errors.New("raftnode: a raft bind address is required with a data dir")
	}
	// The in-memory transport has no network, so TLS only matters with a
	// data dir (the TCP transport).
	if c.TLS != nil && c.DataDir != "" {
		if self := c.TLS.Identity(); self.Role != identity.Admin || self.Name != c.ID {
			return fmt.Errorf("raftnode: the TLS identity %s is not admin/%s, so the other members would refuse it", self, c.ID)
		}
	}
	return nil
}

// Node is a running Raft member.
type Node struct {
	cfg     Config
	log     *slog.Logger
	raft    *raft.Raft
	current atomic.Pointer[raft.Raft] // for the log adapter, which exists before raft
	trans   raft.Transport
	closer  func() error // closes transport and stores after raft shut down

	notifyCh chan bool
	obsCh    chan raft.Observation
	observer *raft.Observer
	stop     chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	lead    Leadership
	changed chan struct{}
	gen     uint64 // bumps on every leadership gain so stale barriers are ignored

	// startedEmpty: the stores held no raft state when the node started.
	startedEmpty bool

	gaps    prometheus.Histogram // contact.go
	checkMu sync.Mutex           // one checkHeartbeatNow at a time
}

// New opens (or creates) the node's stores, starts Raft, and bootstraps when
// configured to and no earlier state exists, so a restart rejoins with its
// state instead of forking a new cluster.
func New(cfg Config, fsm raft.FSM) (*Node, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.ID),
		notifyCh: make(chan bool, 8),
		obsCh:    make(chan raft.Observation, 64),
		stop:     make(chan struct{}),
		changed:  make(chan struct{}),
		gaps:     newContactGaps(),
	}
	level := hclog.Info
	if n.log.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	hl := newHclog(n.log, level, func() uint64 {
		if r := n.current.Load(); r != nil {
			return r.CurrentTerm()
		}
		return 0
	})

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.Timing.HeartbeatTimeout
	rc.ElectionTimeout = cfg.Timing.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.Timing.CommitTimeout
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.NotifyCh = n.notifyCh
	rc.Logger = hl
	rc.NoLegacyTelemetry = true
	// Concurrent acquires arrive together; let raft batch them into one append
	// (group commit: one fsync per batch). MaxAppendEntries stays at 64, above
	// any client concurrency we bench: 512 measured no better. Commit latency
	// is the leader's fsync, then the follower's, in series: hashicorp/raft
	// (through v1.8.0) stores the leader's entries before it replicates them.
	rc.BatchApplyCh = true
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raft config for %s: %w", cfg.ID, err)
	}

	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
		acked  uint64
	)
	var closers []func() error
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	if cfg.DataDir == "" {
		store := raft.NewInmemStore()
		logs, stable, snaps = store, store, raft.NewInmemSnapshotStore()
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(cfg.ID))
		n.trans = tr
		if cfg.Advertise == "" {
			cfg.Advertise = string(addr)
		}
		closers = append(closers, tr.Close)
	} else {
		walDir := filepath.Join(cfg.DataDir, "wal")
		if err := os.MkdirAll(walDir, 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", walDir, err)
		}
		// raft-wal's Close leaves its meta DB (and its file lock) open, so
		// own the meta DB to let a node restart in the same process.
		meta := &metadb.BoltMetaDB{}
		closers = append(closers, meta.Close)
		// Before raft-wal opens it: raft-wal would open a damaged log and
		// raft panic reading it.
		if err := checkWAL(walDir); err != nil {
			cleanup()
			return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
		}
		w, err := wal.Open(walDir, wal.WithLogger(hl.Named("wal")), wal.WithMetaStore(meta),
			wal.WithSegmentSize(cmp.Or(cfg.walSegmentSize, wal.DefaultSegmentSize)))
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("open wal in %s: %w; %s", walDir, err, walWayOut)
		}
		closers = append(closers, w.Close)
		logs, stable = w, w
		if cfg.DiskStallTimeout > 0 {
			sw := newStallWatch(cfg.DiskStallTimeout, walDir, n.log)
			logs, stable = stallLogStore{w, sw}, stallStableStore{w, sw}
		}
		fs, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hl.Named("snapshot"))
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("snapshot store in %s: %w", cfg.DataDir, err)
		}
		snaps = fs
		// Before raft reads the log: a node that lost entries must not vote
		// or lead as if it never had them.
		if acked, err = checkLogLoss(logs, stable, snaps, cfg.AcceptLogLoss, n.log); err != nil {
			cleanup()
			return nil, fmt.Errorf("node %s in %s: %w (its newest segment: %s); %s", cfg.ID, cfg.DataDir, err, newestSegment(walDir), walWayOut)
		}
		tr, err := newTCPTransport(cfg, n.peerSet(), hl.Named("transport"))
		if err != nil {
			cleanup()
			return nil, err
		}
		wt := newWatchedTransport(tr, n.newContactWatch(cfg.Timing.HeartbeatTimeout))
		n.trans = wt
		closers = append(closers, wt.Close)
		if cfg.Advertise == "" {
			cfg.Advertise = string(tr.LocalAddr())
		}
	}
	n.cfg = cfg
	n.closer = func() error { cleanup(); return nil }

	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("check existing raft state of %s: %w", cfg.ID, err)
	}
	n.startedEmpty = !existing
	if !existing {
		if boot, ok := cfg.bootstrapConfiguration(); ok {
			if err := raft.BootstrapCluster(rc, logs, stable, snaps, n.trans, boot); err != nil {
				cleanup()
				return nil, fmt.Errorf("bootstrap %s: %w", cfg.ID, err)
			}
			n.log.Info("bootstrapped raft cluster", "voters", len(boot.Servers))
		}
	} else {
		n.log.Info("restarting on existing raft state", "dir", cfg.DataDir)
	}

	r, err := raft.NewRaft(rc, wrapFSM(fsm, cfg.Metrics.FSMApply), logs, stable, snaps, n.trans)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("start raft %s: %w", cfg.ID, err)
	}
	n.raft = r
	n.current.Store(r)
	n.observer = raft.NewObserver(n.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			return true
		}
		return false
	})
	r.RegisterObserver(n.observer)
	n.wg.Add(1)
	go n.watchLeadership()
	if cfg.DataDir != "" {
		n.wg.Add(1)
		go n.recordAckedIndex(stable, acked)
	}
	return n, nil
}

func (c Config) bootstrapConfiguration() (raft.Configuration, bool) {
	if len(c.Peers) > 0 {
		var conf raft.Configuration
		for _, p := range c.Peers {
			conf.Servers = append(conf.Servers, raft.Server{
				Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr),
			})
		}
		return conf, true
	}
	if c.Bootstrap {
		return raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: raft.ServerID(c.ID), Address: raft.ServerAddress(c.Advertise),
		}}}, true
	}
	return raft.Configuration{}, false
}

// ID is the node's server id.
func (n *Node) ID() string { return n.cfg.ID }

// Addr is the raft address this node advertises.
func (n *Node) Addr() string { return n.cfg.Advertise }

func (n *Node) timeout(ctx context.Context) time.Duration {
	t := n.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < t {
			t = left
		}
	}
	if t <= 0 {
		t = time.Millisecond
	}
	return t
}

// Apply commits data through Raft on the leader and returns the FSM's answer
// and the entry's index. ErrNotLeader means nothing was appended here, so the
// caller may propose it elsewhere; any other error (ErrLeadershipLost, a
// timeout) leaves the outcome unknown: the entry may still commit.
func (n *Node) Apply(ctx context.Context, data []byte) (any, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	start := time.Now()
	f := n.raft.Apply(data, n.timeout(ctx))
	if err := f.Error(); err != nil {
		return nil, 0, mapErr(err)
	}
	if n.cfg.Metrics.Commit != nil {
		n.cfg.Metrics.Commit(time.Since(start))
	}
	return f.Response(), f.Index(), nil
}

func mapErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	case errors.Is(err, raft.ErrLeadershipLost):
		return ErrLeadershipLost
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrShutdown
	}
	return err
}

// ReadBarrier makes a following read of the local FSM linearizable (the
// ReadIndex protocol): it must run on a leader that has applied every entry of
// earlier terms; it takes the commit index, has confirm prove leadership with
// a quorum in a round that starts after that (admin/leadership's Since; raft's
// own VerifyLeader may count replies to heartbeats sent before a pause), and
// waits until the FSM has applied up to that index.
func (n *Node) ReadBarrier(ctx context.Context, confirm func(ctx context.Context, since time.Time) error) error {
	if l, _ := n.Leadership(); !l.IsLeader {
		return ErrNotLeader
	}
	readIndex := n.raft.CommitIndex()
	if err := confirm(ctx, time.Now()); err != nil {
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	for n.raft.AppliedIndex() < readIndex {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for apply index %d: %w", readIndex, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// LeaderTerm reads the current term and whether this node leads it. The
// term is read on both sides of the state, so a new term arriving between
// the reads never passes as leading.
func (n *Node) LeaderTerm() (uint64, bool) {
	t := n.raft.CurrentTerm()
	leader := n.raft.State() == raft.Leader
	return t, leader && n.raft.CurrentTerm() == t
}

// Term is the current raft term, as of the call.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// Voters returns the ids of the voting members other than this node and the
// quorum size of the whole voter set.
func (n *Node) Voters() (peers []string, quorum int, err error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, 0, mapErr(err)
	}
	voters := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(s.ID) != n.cfg.ID {
			peers = append(peers, string(s.ID))
		}
	}
	return peers, voters/2 + 1, nil
}

// AppliedIndex is the index of the last entry the FSM applied.
func (n *Node) AppliedIndex() uint64 { return n.raft.AppliedIndex() }

// Member is one server of the current configuration.
type Member struct {
	ID       string
	Addr     string
	Voter    bool
	IsLeader bool
}

// Members reads the latest configuration.
func (n *Node) Members() ([]Member, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, mapErr(err)
	}
	_, leaderID := n.raft.LeaderWithID()
	var out []Member
	for _, s := range f.Configuration().Servers {
		out = append(out, Member{
			ID: string(s.ID), Addr: string(s.Address),
			Voter: s.Suffrage == raft.Voter, IsLeader: s.ID == leaderID,
		})
	}
	return out, nil
}

// AddVoter adds (or updates the address of) a voting member. Leader only.
func (n *Node) AddVoter(ctx context.Context, id, addr string) (uint64, error) {
	f := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.timeout(ctx))
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("add voter %s at %s: %w", id, addr, mapErr(err))
	}
	n.log.Info("added voter", "peer", id, "addr", addr, "index", f.Index())
	return f.Index(), nil
}

// RemoveServer removes a member. Leader only.
func (n *Node) RemoveServer(ctx context.Context, id string) (uint64, error) {
	f := n.raft.RemoveServer(raft.ServerID(id), 0, n.timeout(ctx))
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("remove server %s: %w", id, mapErr(err))
	}
	n.log.Info("removed server", "peer", id, "index", f.Index())
	return f.Index(), nil
}

// Stats is a point-in-time view for metrics and status.
type Stats struct {
	State        string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64
	LastContact  time.Time
}

// Stats reads the node's counters.
func (n *Node) Stats() Stats {
	return Stats{
		State:        n.raft.State().String(),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
		LastIndex:    n.raft.LastIndex(),
		LastContact:  n.raft.LastContact(),
	}
}

// Snapshot forces a snapshot (and the log compaction that follows it).
func (n *Node) Snapshot() error {
	if err := n.raft.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return fmt.Errorf("snapshot %s: %w", n.cfg.ID, err)
	}
	return nil
}

// Shutdown stops Raft and closes the stores. A leader does not hand over
// leadership first: followers elect a new one after the heartbeat timeout.
func (n *Node) Shutdown() error {
	select {
	case <-n.stop:
		return nil
	default:
	}
	close(n.stop)
	err := n.raft.Shutdown().Error()
	n.raft.DeregisterObserver(n.observer)
	n.wg.Wait()
	if cerr := n.closer(); err == nil {
		err = cerr
	}
	n.setLeadership(func(l *Leadership) { *l = Leadership{} })
	if err != nil {
		return fmt.Errorf("shutdown %s: %w", n.cfg.ID, err)
	}
	return nil
}

// LeadershipTransfer asks the leader to hand leadership to another voter,
// used for graceful shutdown of a leader.
func (n *Node) LeadershipTransfer() error {
	return mapErr(n.raft.LeadershipTransfer().Error())
}

// timedFSM measures FSM.Apply for the apply-latency metric.
type timedFSM struct {
	raft.FSM
	observe func(time.Duration)
}

func (t *timedFSM) Apply(l *raft.Log) any {
	start := time.Now()
	r := t.FSM.Apply(l)
	t.observe(time.Since(start))
	return r
}

// timedBatchingFSM keeps raft's batched apply path for FSMs that have one.
type timedBatchingFSM struct {
	timedFSM
	batch raft.BatchingFSM
}

func (t *timedBatchingFSM) ApplyBatch(logs []*raft.Log) []any {
	start := time.Now()
	r := t.batch.ApplyBatch(logs)
	t.observe(time.Since(start))
	return r
}

func wrapFSM(fsm raft.FSM, observe func(time.Duration)) raft.FSM {
	if observe == nil {
		return fsm
	}
	t := timedFSM{FSM: fsm, observe: observe}
	if b, ok := fsm.(raft.BatchingFSM); ok {
		return &timedBatchingFSM{timedFSM: t, batch: b}
	}
	return &t
}

// IsRaftLeader reports raft's own view, which drops the moment this node
// steps down (Leadership().IsLeader additionally waits for the barrier).
func (n *Node) IsRaftLeader() bool { return n.raft.State() == raft.Leader }

// LastSnapshotIndex is the index of the latest snapshot, 0 if none.
func (n *Node) LastSnapshotIndex() uint64 {
	var idx uint64
	_, _ = fmt.Sscan(n.raft.Stats()["last_snapshot_index"], &idx)
	return idx
}
