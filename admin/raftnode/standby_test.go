package raftnode

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

func TestStagger(t *testing.T) {
	t.Parallel()
	const timeout = 150 * time.Millisecond
	voters := []string{"n2", "n0", "n1"}
	for _, tc := range []struct {
		self, leader string
		want         time.Duration
		ok           bool
	}{
		{"n1", "n0", 0, true},
		{"n2", "n0", 50 * time.Millisecond, true},
		{"n0", "n1", 0, true},
		{"n2", "n1", 50 * time.Millisecond, true},
		{"n0", "n2", 0, true},
		{"n1", "n2", 50 * time.Millisecond, true},
		// No known leader: ranked among all the voters.
		{"n0", "", 0, true},
		{"n1", "", 50 * time.Millisecond, true},
		{"n2", "", 100 * time.Millisecond, true},
		// A non-voter does not stand, nor does the leader itself.
		{"n9", "n0", 0, false},
		{"n0", "n0", 0, false},
	} {
		got, ok := stagger(tc.self, tc.leader, voters, timeout)
		if got != tc.want || ok != tc.ok {
			t.Errorf("stagger(%s, leader %q) = %v, %v; want %v, %v", tc.self, tc.leader, got, ok, tc.want, tc.ok)
		}
	}
	if voters[0] != "n2" || voters[1] != "n0" {
		t.Fatalf("stagger reordered its caller's voters: %v", voters)
	}
}

// standIfSilent checks when the silence reaches the timeout plus the
// stagger, not before, and otherwise says when to look again.
func TestStandIfSilent(t *testing.T) {
	t.Parallel()
	const timeout = 150 * time.Millisecond
	const slack = 20 * time.Millisecond // time passing within the call
	for _, tc := range []struct {
		name      string
		self      string
		silent    time.Duration
		follower  bool
		votersErr error
		check     bool
		// next is the wait returned; after hurrying raft the timeout and
		// the stagger, as the count starts again.
		next time.Duration
	}{
		{name: "first survivor heard 100 ms ago", self: "n1", silent: 100 * time.Millisecond, follower: true, next: 50 * time.Millisecond},
		{name: "first survivor silent past the timeout", self: "n1", silent: 160 * time.Millisecond, follower: true, check: true, next: timeout},
		{name: "second survivor silent past the timeout, not its stagger", self: "n2", silent: 160 * time.Millisecond, follower: true, next: 40 * time.Millisecond},
		{name: "second survivor silent past both", self: "n2", silent: 210 * time.Millisecond, follower: true, check: true, next: timeout + 50*time.Millisecond},
		{name: "not a follower", self: "n1", silent: time.Second, next: timeout},
		{name: "not a voter", self: "n9", silent: time.Second, follower: true, next: timeout},
		{name: "configuration unreadable", self: "n1", silent: time.Second, follower: true, votersErr: errors.New("shut down"), next: timeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeWatch(t, timeout)
			f.self = tc.self
			f.follower.Store(tc.follower)
			if tc.votersErr != nil {
				f.voters = func() ([]string, error) { return nil, tc.votersErr }
			}
			// A follower for longer than the silence.
			f.wasFollower = true
			f.heard(time.Now().Add(-tc.silent))
			next := f.standIfSilent()
			if next > tc.next || next < tc.next-slack {
				t.Errorf("look again in %v, want %v", next, tc.next)
			}
			select {
			case <-f.checks:
				if !tc.check {
					t.Fatal("heartbeat checked, want no check")
				}
			default:
				if tc.check {
					t.Fatal("heartbeat not checked")
				}
			}
			if got, want := f.hurried.Load(), map[bool]uint64{true: 1}[tc.check]; got != want {
				t.Fatalf("hurried = %d, want %d", got, want)
			}
		})
	}
}

// A node that just became a follower (at start, or after it stood and lost
// to another) counts its silence from then, not from the old leader's last
// word: raft restarts its timer there, and the new leader has not spoken.
// So does a node that hurried raft.
func TestStandCountsFromBecomingAFollower(t *testing.T) {
	t.Parallel()
	const timeout = 150 * time.Millisecond
	f := newFakeWatch(t, timeout)
	f.heard(time.Now().Add(-time.Second))
	f.follower.Store(false)
	f.standIfSilent()
	f.follower.Store(true)
	if next := f.standIfSilent(); next < timeout-20*time.Millisecond {
		t.Fatalf("a new follower looks again in %v, want about %v", next, timeout)
	}
	select {
	case <-f.checks:
		t.Fatal("a new follower hurried raft on its old leader's silence")
	default:
	}
	f.quietFrom = f.quietFrom.Add(-timeout)
	f.standIfSilent()
	select {
	case <-f.checks:
	default:
		t.Fatal("a follower silent for the timeout since it became one did not hurry raft")
	}
	if next := f.standIfSilent(); next < timeout-20*time.Millisecond {
		t.Fatalf("after hurrying raft it looks again in %v, want about %v", next, timeout)
	}
	if got := f.hurried.Load(); got != 1 {
		t.Fatalf("hurried = %d, want 1", got)
	}
}

// The voters are asked of raft once per leader, not at every look.
func TestStaggerReadsVotersPerLeader(t *testing.T) {
	t.Parallel()
	f := newFakeWatch(t, 150*time.Millisecond)
	var leader string
	reads := 0
	f.leader = func() string { return leader }
	f.voters = func() ([]string, error) { reads++; return []string{"n0", "n1", "n2"}, nil }
	for _, l := range []string{"n0", "n0", "n0", "n2", "n2", "", "n0"} {
		leader = l
		f.standIfSilent()
	}
	if reads != 4 {
		t.Fatalf("voters read %d times over 4 leaders, want 4", reads)
	}
}

// slowTiming has raft's own randomized checks come 2-4 s apart, so an
// election within a few hundred ms of HeartbeatTimeout is the watch's.
// The lease must stay within HeartbeatTimeout, and the heartbeats come
// every tenth of it: 0.2-0.4 s.
var slowTiming = Timing{HeartbeatTimeout: 2 * time.Second, ElectionTimeout: 2 * time.Second,
	LeaderLeaseTimeout: time.Second, CommitTimeout: 20 * time.Millisecond}

func timedCluster(t *testing.T, timing Timing) *testCluster {
	return &testCluster{t: t, timing: map[int]Timing{0: timing, 1: timing, 2: timing}}
}

// A leader gone is replaced when the survivors' silence reaches
// HeartbeatTimeout, not at raft's randomized ticks, which come 0-2 s after
// that here: the first survivor (the lower id) stands when its own silence
// does, and the second, refusing it, stands when its silence does (the
// leader's heartbeats to each come 0.2-0.4 s apart, so up to that later).
// Without the watch the survivors' ticks both miss the 300 ms allowed about
// three times in four.
func TestSilentLeaderReplacedAtTheTimeout(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out 2 s heartbeat timeouts")
	}
	c := startCluster(timedCluster(t, slowTiming), 3)
	lead := c.leader()
	c.applyIdempotent(context.Background(), []byte("k=1"))
	for i := range c.nodes {
		c.waitValue(i, "k", "1")
	}
	if err := c.nodes[lead].Shutdown(); err != nil {
		t.Fatal(err)
	}
	c.nodes[lead] = nil
	var due time.Time
	var hurried [3]uint64
	for i, n := range c.nodes {
		if n != nil {
			due = later(due, n.raft.LastContact().Add(slowTiming.HeartbeatTimeout))
			hurried[i] = n.trans.(*watchedTransport).w.hurried.Load()
		}
	}
	next := c.leader()
	// Quiet, the election ends within 300 ms of the due time; raft's own
	// check alone stands 0-2 s after it. The bound leaves a loaded CI
	// machine room (439 ms seen); a survivor's staggered check having had
	// raft stand is what tells the two apart.
	if late := time.Since(due); late > slowTiming.HeartbeatTimeout/2 {
		t.Fatalf("n%d elected %v after both survivors' silence reached the heartbeat timeout, want within %v", next, late, slowTiming.HeartbeatTimeout/2)
	}
	var h uint64
	for i, n := range c.nodes {
		if n != nil {
			h += n.trans.(*watchedTransport).w.hurried.Load() - hurried[i]
		}
	}
	if h == 0 {
		t.Errorf("n%d was elected with no survivor's staggered check having raft stand", next)
	}
}

// A leader silent for less than HeartbeatTimeout (its every connection
// held up, as by a pause of the process) keeps its term and followers, and
// the watch never hurries them.
func TestPausedLeaderKeepsItsFollowers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("pauses a leader with a 1 s heartbeat timeout")
	}
	timing := Timing{HeartbeatTimeout: time.Second, ElectionTimeout: time.Second,
		LeaderLeaseTimeout: time.Second, CommitTimeout: 20 * time.Millisecond}
	c := timedCluster(t, timing)
	// gates[i] holds up everything node i sends and is answered.
	var gates [3]sync.RWMutex
	c.beforeStart = func() {
		c.dial = map[int]map[string]string{}
		for i := range 3 {
			c.dial[i] = map[string]string{}
			for j, p := range c.peers {
				if j != i {
					c.dial[i][p.ID] = gatedProxy(t, p.Addr, &gates[i])
				}
			}
		}
	}
	startCluster(c, 3)
	lead := c.leader()
	c.applyIdempotent(context.Background(), []byte("k=1"))
	for i := range c.nodes {
		c.waitValue(i, "k", "1")
	}
	before, _ := c.nodes[lead].Leadership()
	// Each node hurried raft once at startup, with no leader yet.
	var hurried [3]uint64
	for i, n := range c.nodes {
		hurried[i] = n.trans.(*watchedTransport).w.hurried.Load()
	}
	for range 3 {
		gates[lead].Lock()
		time.Sleep(timing.HeartbeatTimeout * 6 / 10)
		gates[lead].Unlock()
		time.Sleep(timing.HeartbeatTimeout * 3 / 10)
	}
	c.applyIdempotent(context.Background(), []byte("k=2"))
	for i, n := range c.nodes {
		l, _ := n.Leadership()
		if l.Term != before.Term || l.LeaderID != before.LeaderID {
			t.Errorf("n%d: leader %s in term %d after the pauses, want %s in %d", i, l.LeaderID, l.Term, before.LeaderID, before.Term)
		}
		if h := n.trans.(*watchedTransport).w.hurried.Load() - hurried[i]; h != 0 {
			t.Errorf("n%d: raft hurried %d times while its leader was heard", i, h)
		}
	}
}

// gatedProxy forwards connections to target, both ways, each chunk only
// while gate is not locked.
func gatedProxy(t *testing.T, target string, gate *sync.RWMutex) string {
	t.Helper()
	ln := listen(t)
	t.Cleanup(func() { _ = ln.Close() })
	// A connection's two goroutines end when its nodes close it.
	pass := func(dst, src net.Conn) {
		defer func() { _ = dst.Close(); _ = src.Close() }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				gate.RLock()
				_, werr := dst.Write(buf[:n])
				gate.RUnlock()
				if werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			go pass(out, in)
			go pass(in, out)
		}
	}()
	return ln.Addr().String()
}
