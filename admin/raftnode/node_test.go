package raftnode

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// kvFSM is the smallest useful state machine: "key=value" entries.
type kvFSM struct {
	mu sync.Mutex
	m  map[string]string
}

func newKV() *kvFSM { return &kvFSM{m: map[string]string{}} }

func (f *kvFSM) Apply(l *raft.Log) any {
	k, v, ok := strings.Cut(string(l.Data), "=")
	if !ok {
		return fmt.Errorf("bad entry %q", l.Data)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[k] = v
	return l.Index
}

func (f *kvFSM) get(k string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[k]
	return v, ok
}

func (f *kvFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := json.Marshal(f.m)
	return snap(b), err
}

func (f *kvFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	m := map[string]string{}
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		return err
	}
	f.mu.Lock()
	f.m = m
	f.mu.Unlock()
	return nil
}

type snap []byte

func (s snap) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}
func (s snap) Release() {}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitLeader(t *testing.T, n *Node) {
	t.Helper()
	waitFor(t, n.ID()+" to lead", func() bool { l, _ := n.Leadership(); return l.IsLeader })
}

func TestInmemSingleNode(t *testing.T) {
	t.Parallel()
	fsm := newKV()
	n, err := New(Config{ID: "solo", Bootstrap: true, Timing: FastTiming(), Logger: quietLogger()}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, n)
	l, changed := n.Leadership()
	if !l.IsLeader {
		select {
		case <-changed:
		case <-time.After(20 * time.Second):
			t.Fatal("no leadership change")
		}
	}
	waitLeader(t, n)
	if l, _ := n.Leadership(); l.LeaderID != "solo" || l.Term == 0 {
		t.Fatalf("leadership = %+v", l)
	}
	ctx := context.Background()
	resp, idx, err := n.Apply(ctx, []byte("a=1"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.(uint64) != idx {
		t.Fatalf("fsm saw index %v, apply returned %d", resp, idx)
	}
	resp, _, err = n.Apply(ctx, []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := resp.(error); !ok {
		t.Fatalf("fsm error not returned: %v", resp)
	}
	if err := n.ReadBarrier(ctx, confirmed); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("a quorum answered a later term")
	if err := n.ReadBarrier(ctx, func(context.Context, time.Time) error { return refused }); !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), refused.Error()) {
		t.Fatalf("read barrier whose confirmation failed: %v, want ErrNotLeader naming the cause", err)
	}
	if v, _ := fsm.get("a"); v != "1" {
		t.Fatalf("a = %q", v)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := n.Apply(cancelled, []byte("b=2")); !errors.Is(err, context.Canceled) {
		t.Fatalf("apply with cancelled ctx: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{
		{},
		{ID: "x", DataDir: t.TempDir()},
	} {
		if _, err := New(c, newKV()); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

type testCluster struct {
	t     *testing.T
	pki   *pkitest.PKI // when set, every node runs its transport over mTLS as admin/<id>
	dirs  []string
	peers []Peer
	fsms  []*kvFSM
	nodes []*Node
	// timing overrides FastTiming for some nodes, by index.
	timing map[int]Timing
	// dial is each node's DialAddrs, by index; beforeStart, when set, runs
	// once the peers' addresses are known (to fill dial).
	dial        map[int]map[string]string
	beforeStart func()
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func newTestCluster(t *testing.T, size int) *testCluster {
	return startCluster(&testCluster{t: t}, size)
}

func startCluster(c *testCluster, size int) *testCluster {
	t := c.t
	lns := make([]net.Listener, size)
	for i := range size {
		lns[i] = listen(t)
		c.dirs = append(c.dirs, t.TempDir())
		c.peers = append(c.peers, Peer{ID: fmt.Sprintf("n%d", i), Addr: lns[i].Addr().String()})
	}
	if c.beforeStart != nil {
		c.beforeStart()
	}
	c.fsms = make([]*kvFSM, size)
	c.nodes = make([]*Node, size)
	for i := range size {
		c.start(i, lns[i])
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n != nil {
				_ = n.Shutdown()
			}
		}
	})
	return c
}

func (c *testCluster) start(i int, ln net.Listener) {
	c.t.Helper()
	if ln == nil {
		l, err := net.Listen("tcp", c.peers[i].Addr)
		if err != nil {
			c.t.Fatalf("rebind %s: %v", c.peers[i].Addr, err)
		}
		ln = l
	}
	c.fsms[i] = newKV()
	cfg := Config{
		ID: c.peers[i].ID, DataDir: c.dirs[i], Listener: ln, Peers: c.peers,
		Timing: cmp.Or(c.timing[i], FastTiming()), SnapshotThreshold: 16, TrailingLogs: 8, SnapshotInterval: 100 * time.Millisecond,
		Logger: quietLogger(), DialAddrs: c.dial[i],
	}
	if c.pki != nil {
		cfg.TLS = c.pki.Source(identity.Admin, cfg.ID)
	}
	n, err := New(cfg, c.fsms[i])
	if err != nil {
		c.t.Fatal(err)
	}
	c.nodes[i] = n
}

// applyIdempotent applies cmd through whichever node leads, again after a
// lost leadership: a cluster just elected on a loaded machine may elect once
// more, and an idempotent cmd applied twice is the same as once.
func (c *testCluster) applyIdempotent(ctx context.Context, cmd []byte) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, err := c.nodes[c.leader()].Apply(ctx, cmd)
		if err == nil {
			return
		}
		if (!errors.Is(err, ErrLeadershipLost) && !errors.Is(err, ErrNotLeader)) || time.Now().After(deadline) {
			c.t.Fatalf("apply %s: %v", cmd, err)
		}
	}
}

func (c *testCluster) leader() int {
	c.t.Helper()
	idx := -1
	waitFor(c.t, "a leader", func() bool {
		for i, n := range c.nodes {
			if n == nil {
				continue
			}
			if l, _ := n.Leadership(); l.IsLeader {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

func (c *testCluster) waitValue(i int, k, v string) {
	c.t.Helper()
	waitFor(c.t, fmt.Sprintf("%s=%s on n%d", k, v, i), func() bool {
		got, _ := c.fsms[i].get(k)
		return got == v
	})
}

func TestThreeNodesOnDisk(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3)
	ctx := context.Background()
	lead := c.leader()
	for i, n := range c.nodes {
		waitFor(t, "followers to learn the leader", func() bool {
			l, _ := n.Leadership()
			return l.LeaderID == c.peers[lead].ID
		})
		if i != lead {
			if _, _, err := n.Apply(ctx, []byte("x=1")); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("apply on follower: %v", err)
			}
			if err := n.ReadBarrier(ctx, confirmed); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("read barrier on follower: %v", err)
			}
		}
	}
	for k := range 40 {
		if _, _, err := c.nodes[lead].Apply(ctx, fmt.Appendf(nil, "k%d=%d", k, k)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.waitValue(i, "k39", "39")
	}
	members, err := c.nodes[lead].Members()
	if err != nil || len(members) != 3 {
		t.Fatalf("members = %v, %v", members, err)
	}

	// Leader loss: the other two elect a new leader in a later term and keep
	// every acknowledged write.
	oldTerm := c.nodes[lead].Stats().Term
	if err := c.nodes[lead].Shutdown(); err != nil {
		t.Fatal(err)
	}
	c.nodes[lead] = nil
	next := c.leader()
	if next == lead {
		t.Fatal("stopped node still leads")
	}
	if term := c.nodes[next].Stats().Term; term <= oldTerm {
		t.Fatalf("new term %d not after %d", term, oldTerm)
	}
	for k := range 40 {
		if v, _ := c.fsms[next].get(fmt.Sprintf("k%d", k)); v != fmt.Sprint(k) {
			t.Fatalf("acknowledged write k%d lost: %q", k, v)
		}
	}
	for k := 40; k < 80; k++ {
		if _, _, err := c.nodes[next].Apply(ctx, fmt.Appendf(nil, "k%d=%d", k, k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.nodes[next].Snapshot(); err != nil {
		t.Fatal(err)
	}

	// Restart on the same dir: no re-bootstrap, catches up (via snapshot
	// install or log replay) with what it missed.
	c.start(lead, nil)
	c.waitValue(lead, "k79", "79")
	c.waitValue(lead, "k0", "0")
	if l, _ := c.nodes[lead].Leadership(); l.IsLeader {
		t.Fatal("restarted node took leadership from a healthy leader without a reason")
	}
}

func TestMembershipChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := New(Config{ID: "a", DataDir: dirA, Listener: listen(t), Bootstrap: true, Timing: FastTiming(), Logger: quietLogger()}, newKV())
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, a)
	waitLeader(t, a)
	if _, _, err := a.Apply(ctx, []byte("before=join")); err != nil {
		t.Fatal(err)
	}
	fsmB := newKV()
	b, err := New(Config{ID: "b", DataDir: dirB, Listener: listen(t), Timing: FastTiming(), Logger: quietLogger()}, fsmB)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, b)
	if _, err := a.AddVoter(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to replicate", func() bool { v, _ := fsmB.get("before"); return v == "join" })
	if ms, _ := a.Members(); len(ms) != 2 {
		t.Fatalf("members after add: %v", ms)
	}
	if _, err := a.RemoveServer(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if ms, _ := a.Members(); len(ms) != 1 || ms[0].ID != "a" || !ms[0].IsLeader {
		t.Fatalf("members after remove: %v", ms)
	}
	if _, err := b.AddVoter(ctx, "c", "127.0.0.1:1"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("add voter on non-leader: %v", err)
	}
}

func TestRestartSingleNodeKeepsState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	ln := listen(t)
	addr := ln.Addr().String()
	n, err := New(Config{ID: "s", DataDir: dir, Listener: ln, Bootstrap: true, Timing: FastTiming(), Logger: quietLogger()}, newKV())
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, n)
	if _, _, err := n.Apply(ctx, []byte("kept=yes")); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	fsm := newKV()
	n, err = New(Config{ID: "s", DataDir: dir, BindAddr: addr, Bootstrap: true, Timing: FastTiming(), Logger: quietLogger()}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, n)
	waitLeader(t, n)
	if v, _ := fsm.get("kept"); v != "yes" {
		t.Fatalf("state after restart: kept=%q", v)
	}
}

// confirmed stands in for admin/leadership in the single-process tests here:
// the multi-node confirmation is tested with real admin nodes.
func confirmed(context.Context, time.Time) error { return nil }

// shutdown stops n at the end of a test and fails the test if stopping fails.
func shutdown(t *testing.T, n *Node) {
	t.Helper()
	if err := n.Shutdown(); err != nil {
		t.Errorf("shutdown %s: %v", n.ID(), err)
	}
}
