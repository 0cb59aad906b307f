package fsm

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// These tests run the FSM under real hashicorp/raft with its in-memory
// transport: log replication, batching and snapshot installation are raft's
// own, so they check the FSM against the contract raft actually exercises.

type raftNode struct {
	id    raft.ServerID
	addr  raft.ServerAddress
	trans *raft.InmemTransport
	fsm   *FSM
	raft  *raft.Raft
}

func startRaftNode(t *testing.T, id string, opts ...Option) *raftNode {
	t.Helper()
	addr, trans := raft.NewInmemTransport(raft.ServerAddress(id))
	cfg := raft.DefaultConfig()
	cfg.LocalID = raft.ServerID(id)
	cfg.Logger = hclog.NewNullLogger()
	cfg.HeartbeatTimeout = 500 * time.Millisecond
	cfg.ElectionTimeout = 500 * time.Millisecond
	cfg.LeaderLeaseTimeout = 250 * time.Millisecond
	cfg.CommitTimeout = 5 * time.Millisecond
	// Compact aggressively so a late joiner must install a snapshot.
	cfg.TrailingLogs = 1
	cfg.SnapshotThreshold = 1 << 30
	n := &raftNode{id: cfg.LocalID, addr: addr, trans: trans, fsm: New(opts...)}
	store := raft.NewInmemStore()
	r, err := raft.NewRaft(cfg, n.fsm, store, store, raft.NewInmemSnapshotStore(), trans)
	if err != nil {
		t.Fatalf("raft %s: %v", id, err)
	}
	n.raft = r
	t.Cleanup(func() { _ = r.Shutdown().Error() })
	return n
}

func connect(nodes ...*raftNode) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(b.addr, b.trans)
			}
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func threeNodeCluster(t *testing.T) (nodes []*raftNode, leader func() *raftNode) {
	t.Helper()
	var servers []raft.Server
	for i := range 3 {
		n := startRaftNode(t, fmt.Sprintf("n%d", i+1))
		nodes = append(nodes, n)
		servers = append(servers, raft.Server{ID: n.id, Address: n.addr})
	}
	connect(nodes...)
	if err := nodes[0].raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	leader = func() *raftNode {
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				return n
			}
		}
		return nil
	}
	waitFor(t, "a leader", func() bool { return leader() != nil })
	return nodes, leader
}

func propose(t *testing.T, leader *raftNode, cmd *adminv1.Command) any {
	t.Helper()
	data, err := Encode(cmd)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	f := leader.raft.Apply(data, 10*time.Second)
	if err := f.Error(); err != nil {
		t.Fatalf("raft apply: %v", err)
	}
	return f.Response()
}

func TestReplicasConvergeAndSnapshotsInstall(t *testing.T) {
	t.Parallel()
	nodes, leader := threeNodeCluster(t)
	l := leader()
	for _, cmd := range randomLog(11, 300) {
		if Validate(cmd) != nil {
			continue
		}
		propose(t, l, cmd)
	}
	last := l.raft.LastIndex()
	waitFor(t, "replicas to apply everything", func() bool {
		for _, n := range nodes {
			if n.fsm.AppliedIndex() < last {
				return false
			}
		}
		return true
	})
	want := dump(t, l.fsm)
	for _, n := range nodes {
		if !bytes.Equal(dump(t, n.fsm), want) {
			t.Fatalf("%s diverged from the leader", n.id)
		}
	}
	if err := l.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	rec := &recorder{}
	late := startRaftNode(t, "n4", WithLeaseObserver(rec))
	connect(append(nodes, late)...)
	if err := l.raft.AddVoter(late.id, late.addr, 0, 10*time.Second).Error(); err != nil {
		t.Fatalf("add voter: %v", err)
	}
	waitFor(t, "the late joiner to install the snapshot", func() bool { return late.fsm.AppliedIndex() >= last })
	if !bytes.Equal(tables(t, late.fsm), tables(t, l.fsm)) {
		t.Fatal("snapshot installed on the late joiner differs from the leader's state")
	}
	leases, _ := late.fsm.Leases()
	if ev := rec.Events(); len(leases) == 0 || len(ev) == 0 || ev[0] != fmt.Sprintf("restore %d", len(leases)) {
		t.Fatalf("late joiner has %d leases, observer saw %v: want it built by a snapshot restore", len(leases), ev)
	}
}

func TestConcurrentAcquiresThroughRaftGrantOnce(t *testing.T) {
	t.Parallel()
	_, leader := threeNodeCluster(t)
	l := leader()
	propose(t, l, c(0, register("proxy-01")))
	propose(t, l, c(0, createNS("audit-logs", "t")))
	// Each runner registers itself as the proxy's runner, then acquires:
	// the last registration is always followed by its runner's acquire, so
	// some acquire is granted, and once one is, every other runner is
	// refused (held by another, or not the proxy's runner).
	const runners = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted []string
	)
	for i := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runner := fmt.Sprintf("runner-%d", i)
			reg, _ := Encode(c(0, registerRunner("proxy-01", runner)))
			if l.raft.Apply(reg, 10*time.Second).Error() != nil {
				return
			}
			data, _ := Encode(c(0, acquire("audit-logs@proxy-01", runner)))
			f := l.raft.Apply(data, 10*time.Second)
			if f.Error() != nil {
				return
			}
			if res, ok := f.Response().(*adminv1.AcquireLeaseResponse); ok && res.GetGranted() {
				mu.Lock()
				granted = append(granted, res.GetLease().GetRunnerId())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(granted) != 1 {
		t.Fatalf("granted to %v, want exactly one runner", granted)
	}
	cur, _ := l.fsm.Lease("audit-logs@proxy-01")
	if cur.GetRunnerId() != granted[0] {
		t.Fatalf("holder %s, grant answered to %s", cur.GetRunnerId(), granted[0])
	}
}
