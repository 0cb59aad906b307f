package agent

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// openRecorder is the fake runner noting each open's recover_from and
// history_before.
type openRecorder struct {
	*fakeRunner
	mu      sync.Mutex
	opens   map[string][]*runnerv1.RecoverySource
	befores map[string][]string
}

func (r *openRecorder) OpenMailbox(ctx context.Context, in *runnerv1.OpenMailboxRequest, opts ...grpc.CallOption) (*runnerv1.OpenMailboxResponse, error) {
	r.mu.Lock()
	if r.opens == nil {
		r.opens = map[string][]*runnerv1.RecoverySource{}
		r.befores = map[string][]string{}
	}
	r.opens[in.GetMailboxId()] = append(r.opens[in.GetMailboxId()], in.GetRecoverFrom())
	r.befores[in.GetMailboxId()] = append(r.befores[in.GetMailboxId()], in.GetHistoryBefore())
	r.mu.Unlock()
	return r.fakeRunner.OpenMailbox(ctx, in, opts...)
}

func (r *openRecorder) opened(id string) []*runnerv1.RecoverySource {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.opens[id])
}

func (r *openRecorder) historiesBefore(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.befores[id])
}

func (r *fakeRunner) allowedOf(id string) ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.allowed[id]
	return p, ok
}

// withRecovery is an assignment of ns on p1 in role, with a recovery source
// and peers.
func withRecovery(ns string, role adminv1.AssignmentRole, src *adminv1.RecoverySource, peers ...string) *adminv1.NamespaceAssignment {
	return &adminv1.NamespaceAssignment{
		Namespace: ns, MailboxId: ns + "@p1", Role: role, RecoverySource: src, RecoveryPeers: peers,
		Config: &adminv1.NamespaceConfig{Topics: []string{ns + ".events"}},
	}
}

// A move's destination is opened with the assignment's recovery source as
// recover_from; a mailbox in any other role is opened without, even if its
// assignment names a source.
func TestCatchingUpOpensWithRecoverySource(t *testing.T) {
	t.Parallel()
	for _, mode := range []LeaseMode{LeaseModeMailbox, LeaseModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			var rec *openRecorder
			h := newHarness(t, func(c *Config) {
				c.LeaseMode = mode
				rec = &openRecorder{fakeRunner: c.Runner.(*fakeRunner)}
				c.Runner = rec
			})
			src := &adminv1.RecoverySource{MailboxId: "in@p2", Address: "10.0.0.2:9090"}
			h.admin.assign <- &adminv1.WatchAssignmentsResponse{ProxyId: "p1", Index: 1, Assignments: []*adminv1.NamespaceAssignment{
				withRecovery("in", catchingUp, src),
				withRecovery("plain", catchingUp, nil),
				withRecovery("odd", serving, src),
			}}
			h.waitFor("active", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 3 })
			want := &runnerv1.RecoverySource{MailboxId: "in@p2", Address: "10.0.0.2:9090"}
			if got := rec.opened("in@p1"); len(got) == 0 || !proto.Equal(got[0], want) {
				t.Fatalf("in@p1 opened with %v, want recover_from %v", got, want)
			}
			for _, id := range []string{"plain@p1", "odd@p1"} {
				if got := rec.opened(id); len(got) == 0 || got[0] != nil {
					t.Fatalf("%s opened with %v, want no recover_from", id, got)
				}
			}
		})
	}
}

// A serving mailbox is opened with its assignment's prior mailbox as
// history_before, so the runner can say what an unplanned move lost; a
// move's destination (copied instead) and a namespace never assigned
// elsewhere are opened without.
func TestServingOpensWithHistoryBefore(t *testing.T) {
	t.Parallel()
	for _, mode := range []LeaseMode{LeaseModeMailbox, LeaseModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			var rec *openRecorder
			h := newHarness(t, func(c *Config) {
				c.LeaseMode = mode
				rec = &openRecorder{fakeRunner: c.Runner.(*fakeRunner)}
				c.Runner = rec
			})
			prior := func(a *adminv1.NamespaceAssignment) *adminv1.NamespaceAssignment {
				a.PriorMailboxId = a.GetNamespace() + "@p2"
				return a
			}
			h.admin.assign <- &adminv1.WatchAssignmentsResponse{ProxyId: "p1", Index: 1, Assignments: []*adminv1.NamespaceAssignment{
				prior(withRecovery("lost", serving, nil)),
				withRecovery("first", serving, nil),
				prior(withRecovery("moving", catchingUp, nil)),
			}}
			h.waitFor("active", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 3 })
			for id, want := range map[string]string{"lost@p1": "lost@p2", "first@p1": "", "moving@p1": ""} {
				if got := rec.historiesBefore(id); len(got) == 0 || got[0] != want {
					t.Fatalf("%s opened with history_before %q, want %q", id, got, want)
				}
			}
		})
	}
}

// The runner's recovery peers of a mailbox follow its assignment's: set
// when a move toward another proxy starts (also when the assignment comes
// before the runner has opened the mailbox), cleared when the move ends,
// and set again after the runner opens the mailbox afresh (it keeps them in
// memory only).
func TestRecoveryPeersFollowTheAssignment(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	gate := make(chan struct{})
	h.runner.mu.Lock()
	h.runner.openGate, h.runner.openGated = gate, "out@p1"
	h.runner.mu.Unlock()
	set := func(index uint64, peers ...string) {
		h.admin.assign <- &adminv1.WatchAssignmentsResponse{ProxyId: "p1", Index: index, Assignments: []*adminv1.NamespaceAssignment{
			withRecovery("out", serving, nil, peers...),
		}}
	}
	allowed := func(want ...string) func() bool {
		return func() bool { got, ok := h.runner.allowedOf("out@p1"); return ok && slices.Equal(got, want) }
	}
	set(1, "p2")
	h.waitIndex("runner open held out@p1")
	close(gate)
	h.waitFor("peers set once the mailbox is open", allowed("p2"))

	set(2)
	h.waitFor("peers cleared when the move ends", allowed())

	set(3, "p3")
	h.waitFor("peers of the next move", allowed("p3"))
	// The runner restarts and forgets the set; the worker's open of the
	// mailbox anew (as after a NotFound) makes the sidecar send it again.
	h.runner.mu.Lock()
	delete(h.runner.allowed, "out@p1")
	h.runner.mu.Unlock()
	if _, err := h.agent.cfg.Runner.OpenMailbox(context.Background(), &runnerv1.OpenMailboxRequest{MailboxId: "out@p1", Config: runnerConfig(withRecovery("out", serving, nil).GetConfig())}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("peers sent again after the open", allowed("p3"))
}

// The proxy heartbeat carries each mailbox's recovery as the runner reports
// it; a mailbox still copying is reported with neither a known lag nor
// stored positions, whatever the runner says, and once copied with both.
func TestProxyHeartbeatReportsRecovery(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assignRoles(1, roled{"in", catchingUp})
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 1 })
	started := timestamppb.New(time.Date(2026, 11, 22, 3, 0, 1, 0, time.UTC))
	setRecovery := func(r *runnerv1.RecoveryStatus) {
		h.runner.mu.Lock()
		h.runner.mb["in@p1"].Recovery = r
		h.runner.mu.Unlock()
	}
	h.runner.setLag("in@p1", proto.Int64(0))
	h.runner.setPositions("in@p1", &runnerv1.StoredPosition{Topic: "t", Partition: 0, NextOffset: 30})
	setRecovery(&runnerv1.RecoveryStatus{State: runnerv1.RecoveryState_RECOVERY_STATE_COPYING, SourceMailboxId: "in@p2", BytesCopied: 100, EventsCopied: 3, StartedAt: started,
		HistoryStartsAt: &timestamppb.Timestamp{Nanos: -1}})
	report := func(what string) *adminv1.NamespaceHealth {
		h.t.Helper()
		hbs, _ := h.admin.proxyReports()
		n := len(hbs)
		var nh *adminv1.NamespaceHealth
		h.stepUntil(what, testInterval, func() bool {
			got, ok := h.reportedAfter(n, "in")
			nh = got
			return ok
		})
		return nh
	}
	want := &adminv1.NamespaceHealth{Namespace: "in", Status: adminv1.HealthStatus_HEALTH_STATUS_HEALTHY, Recovery: &adminv1.RecoveryStatus{
		State: adminv1.RecoveryState_RECOVERY_STATE_COPYING, SourceMailboxId: "in@p2", BytesCopied: 100, EventsCopied: 3, StartedAt: started,
	}}
	if got := report("a heartbeat while copying"); !proto.Equal(got, want) {
		t.Fatalf("while copying: %v, want %v", got, want)
	}
	finished := timestamppb.New(started.AsTime().Add(time.Second))
	setRecovery(&runnerv1.RecoveryStatus{State: runnerv1.RecoveryState_RECOVERY_STATE_COPIED, SourceMailboxId: "in@p2", BytesCopied: 500, EventsCopied: 9,
		StartedAt: started, FinishedAt: finished, HistoryComplete: true})
	want = &adminv1.NamespaceHealth{Namespace: "in", Status: adminv1.HealthStatus_HEALTH_STATUS_HEALTHY, LagKnown: true,
		StoredPositions: []*adminv1.StoredPosition{{Topic: "t", Partition: 0, NextOffset: 30}},
		Recovery: &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPIED, SourceMailboxId: "in@p2", BytesCopied: 500, EventsCopied: 9,
			StartedAt: started, FinishedAt: finished, HistoryComplete: true}}
	if got := report("a heartbeat once copied"); !proto.Equal(got, want) {
		t.Fatalf("once copied: %v, want %v", got, want)
	}
}

// unimplementedAllow is a runner older than peer recovery.
type unimplementedAllow struct {
	*fakeRunner
	calls atomic.Int32
}

func (r *unimplementedAllow) AllowRecovery(context.Context, *runnerv1.AllowRecoveryRequest, ...grpc.CallOption) (*runnerv1.AllowRecoveryResponse, error) {
	r.calls.Add(1)
	return nil, status.Error(codes.Unimplemented, "unknown method AllowRecovery")
}

// A runner without peer recovery is asked once per set, not retried: it
// serves no copy, so there is nothing to allow (and no timer is armed).
func TestRecoveryPeersOnAnOlderRunner(t *testing.T) {
	t.Parallel()
	var old *unimplementedAllow
	h := newHarness(t, func(c *Config) {
		old = &unimplementedAllow{fakeRunner: c.Runner.(*fakeRunner)}
		c.Runner = old
	})
	h.admin.assign <- &adminv1.WatchAssignmentsResponse{ProxyId: "p1", Index: 1, Assignments: []*adminv1.NamespaceAssignment{
		withRecovery("out", serving, nil, "p2"),
	}}
	h.waitFor("active", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 1 })
	h.waitFor("asked", func() bool { return old.calls.Load() >= 1 })
	h.settle(2)
	h.clk.Step(time.Minute)
	h.settle(2)
	if n := old.calls.Load(); n > 2 {
		t.Fatalf("AllowRecovery asked %d times of a runner without it", n)
	}
	if len(h.agent.allow.pending()) != 0 {
		t.Fatalf("still pending: %v", h.agent.allow.pending())
	}
}
