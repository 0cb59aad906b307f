package raftnode

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// fakeWatch is a contactWatch over a fake raft: contact is when it last
// heard from its leader, checks counts heartbeat checks.
type fakeWatch struct {
	*contactWatch
	contact  atomic.Pointer[time.Time]
	follower atomic.Bool
	checks   chan struct{}
}

func newFakeWatch(t *testing.T, timeout time.Duration) *fakeWatch {
	f := &fakeWatch{checks: make(chan struct{}, 8)}
	f.follower.Store(true)
	f.heard(time.Now())
	f.contactWatch = &contactWatch{
		timeout:     timeout,
		lastContact: func() time.Time { return *f.contact.Load() },
		follower:    f.follower.Load,
		check:       func() { f.checks <- struct{}{} },
		self:        "n1",
		leader:      func() string { return "n0" },
		voters:      func() ([]string, error) { return []string{"n0", "n1", "n2"}, nil },
		gaps:        newContactGaps(),
		log:         quietLogger(),
		stop:        make(chan struct{}),
	}
	t.Cleanup(f.close)
	return f
}

func (f *fakeWatch) heard(at time.Time) { f.contact.Store(&at) }

func TestRefusedVoteChecksTheHeartbeat(t *testing.T) {
	t.Parallel()
	const timeout = 150 * time.Millisecond
	for _, tc := range []struct {
		name     string
		silent   time.Duration // since the leader's last contact when raft refused
		follower bool
		// heardAgain: the leader speaks again before the silence would
		// reach the timeout.
		heardAgain bool
		want       bool
		within     time.Duration // of the refusal, when want (loose: a loaded machine's timers run late)
	}{
		{name: "silent past the timeout: at once", silent: time.Second, follower: true, want: true, within: 100 * time.Millisecond},
		{name: "silent less: when the silence reaches the timeout", silent: 100 * time.Millisecond, follower: true, want: true, within: timeout},
		{name: "the leader speaks again", silent: 100 * time.Millisecond, follower: true, heardAgain: true},
		{name: "not a follower", silent: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeWatch(t, timeout)
			f.follower.Store(tc.follower)
			refusedAt := time.Now()
			f.heard(refusedAt.Add(-tc.silent))
			f.refused()
			if tc.heardAgain {
				f.heard(time.Now())
			}
			select {
			case <-f.checks:
				if !tc.want {
					t.Fatal("heartbeat checked, want no check")
				}
				if took := time.Since(refusedAt); took > tc.within || took < timeout-tc.silent-5*time.Millisecond {
					t.Fatalf("checked %v after the refusal, want by %v, not before %v", took, tc.within, timeout-tc.silent)
				}
			case <-time.After(2 * timeout):
				if tc.want {
					t.Fatal("heartbeat never checked")
				}
			}
		})
	}
}

// The watch acts only once raft's answer is on its way (acting before
// would make this node a candidate that grants the request and splits the
// vote), and only on a refusal; AppendEntries of one leader are timed.
func TestWatchedTransportRoutesAnswers(t *testing.T) {
	t.Parallel()
	f := newFakeWatch(t, 150*time.Millisecond)
	f.heard(time.Now().Add(-time.Second))
	tr := &watchedTransport{w: f.contactWatch}
	for _, tc := range []struct {
		req     any
		resp    any
		checked bool
	}{
		{&raft.RequestPreVoteRequest{}, &raft.RequestPreVoteResponse{Granted: false}, true},
		{&raft.RequestVoteRequest{}, &raft.RequestVoteResponse{Granted: false}, true},
		{&raft.RequestPreVoteRequest{}, &raft.RequestPreVoteResponse{Granted: true}, false},
		{&raft.RequestVoteRequest{}, &raft.RequestVoteResponse{Granted: true}, false},
	} {
		t.Run(fmt.Sprintf("%T granted %v", tc.resp, !tc.checked), func(t *testing.T) {
			answer := make(chan raft.RPCResponse, 1)
			rpc := raft.RPC{Command: tc.req, RespChan: answer}
			tr.note(&rpc)
			select {
			case <-f.checks:
				t.Fatal("heartbeat checked before raft answered")
			default:
			}
			rpc.Respond(tc.resp, nil)
			if got := <-answer; got.Response != tc.resp {
				t.Fatalf("the candidate got %v, want raft's %v", got.Response, tc.resp)
			}
			select {
			case <-f.checks:
				if !tc.checked {
					t.Fatal("heartbeat checked after a granted vote")
				}
			case <-time.After(100 * time.Millisecond):
				if tc.checked {
					t.Fatal("heartbeat not checked after a refused vote")
				}
			}
		})
	}

	for _, c := range []struct {
		leader string
		term   uint64
	}{{"a", 2}, {"a", 2}, {"a", 2}, {"b", 3}, {"a", 4}} {
		rpc := raft.RPC{Command: &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(c.leader)}, Term: c.term}}
		tr.note(&rpc)
	}
	// Two gaps of leader a in term 2; none across terms: those silences
	// were elections.
	if n := testutil.CollectAndCount(f.gaps); n != 1 {
		t.Fatalf("collected %d metrics, want the histogram", n)
	}
	if got := histogramCount(t, f.contactWatch); got != 2 {
		t.Fatalf("gaps observed = %d, want 2", got)
	}
}

func histogramCount(t *testing.T, w *contactWatch) uint64 {
	t.Helper()
	var m dto.Metric
	if err := w.gaps.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// A follower that lost its leader with the other survivor grants the
// survivor's vote at its own heartbeat timeout, not at its randomized tick:
// here the slow follower's timeout is 4 s and its ticks come every 4-8 s
// from its start, so without the watch it forgets the leader within 600 ms
// of the 4 s about one time in seven; with it, always.
func TestElectionAtTheFirstFollowersTimeout(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out a 4 s heartbeat timeout")
	}
	const slow = 2
	slowTiming := Timing{HeartbeatTimeout: 4 * time.Second, ElectionTimeout: 4 * time.Second,
		LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 20 * time.Millisecond}
	c := &testCluster{t: t, timing: map[int]Timing{slow: slowTiming}}
	startCluster(c, 3)
	lead := c.leader()
	if lead == slow {
		if err := c.nodes[slow].LeadershipTransfer(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a fast node to lead", func() bool {
			l, _ := c.nodes[slow].Leadership()
			return !l.IsLeader && l.LeaderID != "" && l.LeaderID != c.peers[slow].ID
		})
		lead = c.leader()
	}
	c.applyIdempotent(context.Background(), []byte("k=1"))
	c.waitValue(slow, "k", "1")

	stopped := time.Now()
	if err := c.nodes[lead].Shutdown(); err != nil {
		t.Fatal(err)
	}
	c.nodes[lead] = nil
	next := c.leader()
	if took, want := time.Since(stopped), slowTiming.HeartbeatTimeout+600*time.Millisecond; took > want {
		t.Fatalf("n%d elected %v after the leader stopped, want within %v", next, took, want)
	}
}
