package agent

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// The runner is asked to open the mailbox, the lease is acquired with the
// runner's query address, and only then is the runner activated, with the
// lease's epoch and the whole ttl as its deadline.
func TestAcquireThenActivate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	iOpen, _ := h.waitEvent(0, "runner open audit@p1 0")
	iAcq, _ := h.waitEvent(iOpen, "admin acquire audit@p1 p1 10.0.0.1:9090")
	_, act := h.waitEvent(iAcq, "runner activate audit@p1 ")
	if act.what != "runner activate audit@p1 5 valid_for=10s" {
		t.Fatalf("activation %q, want epoch 5 valid for the full ttl", act.what)
	}
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
	if v := h.lease("audit@p1"); v.State != StateActive || v.Epoch != 5 || !v.FenceAt.Equal(h.t0.Add(testTTL)) {
		t.Fatalf("lease %+v", v)
	}
	if got := testutil.ToFloat64(h.agent.m.held); got != 1 {
		t.Fatalf("leases held gauge %v", got)
	}
}

// The heartbeat at t0+3s is acknowledged; the next one (t0+6s) never is.
// The runner must be fenced exactly ttl after the acknowledged one was
// *sent* (t0+13s), not earlier, and a late answer to the lost heartbeat
// must not bring the old epoch back.
func TestFenceExactlyTTLAfterLastAckedSend(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5")
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitFor("first heartbeat acknowledged", func() bool { return h.lease("audit@p1").LastAckSent.Equal(h.t0.Add(testInterval)) })
	if v := h.lease("audit@p1"); !v.FenceAt.Equal(h.t0.Add(testInterval + testTTL)) {
		t.Fatalf("fence deadline %v, want sent time + ttl = %v", v.FenceAt, h.t0.Add(testInterval+testTTL))
	}
	_, ext := h.waitEvent(0, "runner extend audit@p1 5")
	if ext.what != "runner extend audit@p1 5 valid_for=10s" {
		t.Fatalf("extension %q", ext.what)
	}

	unblock := make(chan struct{})
	h.admin.setHeartbeat(func(in *adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
		<-unblock
		return &adminv1.MailboxHeartbeatResponse{Renewed: true, Epoch: in.GetEpoch()}, nil
	})
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitFor("second heartbeat sent", func() bool { return h.ev.count("admin heartbeat") == 2 })

	fenceAt := h.t0.Add(testInterval + testTTL)
	h.settle(2)
	h.clk.SetTime(fenceAt.Add(-time.Millisecond))
	h.settle(2)
	if n := h.ev.count("runner fence"); n != 0 {
		t.Fatalf("fenced before ttl had passed:\n%s", h.ev)
	}
	if h.agent.Ready() != nil {
		t.Fatal("not ready while the lease is still held")
	}
	h.clk.Step(time.Millisecond)
	iFence, fence := h.waitEvent(0, "runner fence audit@p1")
	if fence.what != "runner fence audit@p1 ttl_elapsed" || !fence.at.Equal(fenceAt) {
		t.Fatalf("fence %q at %v, want ttl_elapsed at exactly %v", fence.what, fence.at, fenceAt)
	}
	if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues("ttl_elapsed")); got != 1 {
		t.Fatalf("losses counted %v", got)
	}

	// Re-acquired at once (epoch 6), then the stale answer arrives.
	iAcq, _ := h.waitEvent(iFence, "admin acquire audit@p1")
	_, act := h.waitEvent(iAcq, "runner activate audit@p1")
	if !strings.HasPrefix(act.what, "runner activate audit@p1 6 ") {
		t.Fatalf("re-activation %q, want the new epoch 6", act.what)
	}
	h.admin.setHeartbeat(nil)
	close(unblock)
	h.waitFor("ready again", func() bool { return h.agent.Ready() == nil })
	for _, e := range h.ev.all()[iFence:] {
		if strings.HasPrefix(e.what, "runner activate audit@p1 5") || strings.HasPrefix(e.what, "runner extend audit@p1 5") {
			t.Fatalf("old epoch used after the fence: %q\n%s", e.what, h.ev)
		}
	}
}

// Heartbeats that fail outright (admin unreachable) are retried with
// backoff and never move the deadline; the fence still comes at ttl after
// the last acknowledged send.
func TestFailingHeartbeatsFenceAtDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5")
	h.admin.setHeartbeat(func(*adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
		return nil, status.Error(codes.Unavailable, "connection refused")
	})
	fenceAt := h.t0.Add(testTTL) // only the acquire was acknowledged
	for h.clk.Now().Before(fenceAt.Add(-time.Second)) {
		h.settle(2)
		h.clk.Step(time.Second)
	}
	h.waitFor("retries", func() bool { return h.ev.count("admin heartbeat") >= 3 })
	if n := h.ev.count("runner fence"); n != 0 {
		t.Fatalf("fenced before the deadline:\n%s", h.ev)
	}
	if v := h.lease("audit@p1"); !v.FenceAt.Equal(fenceAt) {
		t.Fatalf("deadline moved by failed heartbeats: %v", v.FenceAt)
	}
	h.settle(2)
	h.clk.Step(time.Second)
	_, fence := h.waitEvent(0, "runner fence audit@p1 ttl_elapsed")
	if fence.at.Before(fenceAt) {
		t.Fatalf("fenced at %v, before %v", fence.at, fenceAt)
	}
}

// Every explicit refusal fences at once (no waiting for ttl), is counted
// with its reason, and is followed by a new acquire; a NOT_LEADER answer is
// not a loss.
func TestRefusalFencesThenReacquires(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		reason adminv1.LeaseRefusalReason
		label  string
		inBand bool
	}{
		{"expired in band", adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED, "expired", true},
		{"not holder in band", adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER, "not_holder", true},
		{"stale epoch as status", adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_STALE_EPOCH, "stale_epoch", false},
		{"unknown lease as status", adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE, "unknown_lease", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.assign(1, "audit")
			h.waitEvent(0, "runner activate audit@p1 5")
			ref := &adminv1.LeaseRefusal{Reason: tc.reason, Message: "scripted", Current: &adminv1.Lease{RunnerId: "other", Epoch: 77}}
			h.admin.setHeartbeat(func(*adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
				if tc.inBand {
					return &adminv1.MailboxHeartbeatResponse{Refusal: ref}, nil
				}
				return nil, mesh.RefusalError(ref)
			})
			// Held by the other runner twice, then granted.
			refusals := 0
			h.admin.setAcquire(func(*adminv1.AcquireLeaseRequest) (*adminv1.AcquireLeaseResponse, error) {
				if refusals < 2 {
					refusals++
					return &adminv1.AcquireLeaseResponse{Refusal: &adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER, Current: ref.GetCurrent()}}, nil
				}
				return nil, nil
			})
			h.settle(2)
			h.clk.Step(testInterval)
			iFence, fence := h.waitEvent(0, "runner fence audit@p1")
			if fence.what != "runner fence audit@p1 "+tc.label || !fence.at.Equal(h.t0.Add(testInterval)) {
				t.Fatalf("fence %q at %v, want %s at once", fence.what, fence.at, tc.label)
			}
			if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues(tc.label)); got != 1 {
				t.Fatalf("loss %s counted %v", tc.label, got)
			}
			h.admin.setHeartbeat(nil)
			for h.ev.count("admin acquire") < 4 {
				h.settle(2)
				h.clk.Step(time.Second)
			}
			iAcq, _ := h.waitEvent(iFence, "admin acquire")
			_, act := h.waitEvent(iAcq, "runner activate audit@p1")
			if !strings.HasPrefix(act.what, "runner activate audit@p1 6 ") {
				t.Fatalf("re-activation %q, want epoch 6 after the refusals", act.what)
			}
			if n := h.ev.count("runner fence"); n != 1 {
				t.Fatalf("%d fences, want 1:\n%s", n, h.ev)
			}
		})
	}
}

func TestNotLeaderIsRetriedNotALoss(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5")
	h.admin.setHeartbeat(func(*adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
		return nil, mesh.RefusalError(&adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, LeaderAddress: "10.9.9.9:1"})
	})
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitFor("heartbeat failure handled", func() bool {
		return testutil.ToFloat64(h.agent.m.heartbeats.WithLabelValues("error")) == 1
	})
	h.admin.setHeartbeat(nil)
	h.settle(2)
	h.clk.Step(time.Second)
	h.waitFor("retried heartbeat acknowledged", func() bool {
		return h.lease("audit@p1").LastAckSent.Equal(h.t0.Add(testInterval + time.Second))
	})
	if n := h.ev.count("runner fence"); n != 0 {
		t.Fatalf("NOT_LEADER fenced the runner:\n%s", h.ev)
	}
}

// Unassigned: the runner drains (stops fetching, commits) the mailbox, then
// closes it, then the lease is released with its epoch; the other mailbox
// is untouched.
func TestUnassignClosesThenReleases(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit", "billing")
	h.waitEvent(0, "runner activate audit@p1")
	h.waitEvent(0, "runner activate billing@p1")
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
	epoch := h.lease("audit@p1").Epoch
	h.assign(2, "billing")
	iDrain, _ := h.waitEvent(0, "runner drain audit@p1")
	iClose, _ := h.waitEvent(iDrain, "runner close audit@p1")
	_, rel := h.waitEvent(iClose, "admin release audit@p1")
	if want := "admin release audit@p1 " + strconv.FormatUint(epoch, 10); rel.what != want {
		t.Fatalf("release %q, want %q", rel.what, want)
	}
	if h.ev.count("runner drain billing@p1")+h.ev.count("runner close billing@p1")+h.ev.count("admin release billing@p1") != 0 {
		t.Fatalf("billing touched:\n%s", h.ev)
	}
	if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("unassigned", "released")); got != 1 {
		t.Fatalf("releases counted %v", got)
	}
	// An older set from a lagging admin node changes nothing.
	h.assign(1, "audit", "billing")
	h.assign(3, "billing")
	h.waitFor("index 3 applied", func() bool {
		h.agent.mu.Lock()
		defer h.agent.mu.Unlock()
		return h.agent.lastIndex == 3
	})
	if n := h.ev.count("runner open audit@p1"); n != 1 {
		t.Fatalf("stale assignment set reopened audit:\n%s", h.ev)
	}
}

// SIGTERM: no heartbeat or acquire after the stop begins, the runner drains
// before any lease is released, every lease is released, and each only
// after the runner closed its mailbox.
func TestShutdownDrainsThenReleases(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit", "billing")
	h.waitEvent(0, "runner activate audit@p1")
	h.waitEvent(0, "runner activate billing@p1")
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
	if err := h.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	iDrain, _ := h.waitEvent(0, "runner drain")
	for _, id := range []string{"audit@p1", "billing@p1"} {
		iRel, _, ok := h.ev.find(0, "admin release "+id)
		if !ok || iRel < iDrain {
			t.Fatalf("%s released before the drain (or never):\n%s", id, h.ev)
		}
		if iClose, _, ok := h.ev.find(0, "runner close "+id); !ok || iClose > iRel {
			t.Fatalf("%s released before the runner closed it (or never closed):\n%s", id, h.ev)
		}
	}
	for _, e := range h.ev.all()[iDrain:] {
		if strings.HasPrefix(e.what, "admin heartbeat") || strings.HasPrefix(e.what, "admin acquire") || strings.HasPrefix(e.what, "runner activate") {
			t.Fatalf("%q after the drain:\n%s", e.what, h.ev)
		}
	}
	if h.agent.Ready() == nil {
		t.Fatal("ready after stop")
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ev := &events{}
	base := func() Config {
		return Config{ProxyID: "p1", AdvertiseAddr: "127.0.0.1:1", Admin: newFakeAdmin(ev), Runner: newFakeRunner(ev)}
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no proxy id", func(c *Config) { c.ProxyID = "" }, "proxy id is required"},
		{"@ in proxy id", func(c *Config) { c.ProxyID = "a@b" }, "must not contain '@'"},
		{"no advertise address", func(c *Config) { c.AdvertiseAddr = "" }, "advertise address"},
		{"interval not below ttl", func(c *Config) { c.LeaseTTL, c.HeartbeatInterval = time.Second, time.Second }, "must be below the lease ttl"},
		{"negative ttl", func(c *Config) { c.LeaseTTL = -time.Second }, "must not be negative"},
		{"negative runner-dead bound", func(c *Config) { c.RunnerDeadAfter = -time.Second }, "must not be negative"},
		{"runner-dead bound not below ttl", func(c *Config) {
			c.LeaseTTL, c.HeartbeatInterval, c.RunnerDeadAfter = 5*time.Second, time.Second, 5*time.Second
		}, "runner-dead bound 5s must be below the lease ttl"},
		{"unknown lease mode", func(c *Config) { c.LeaseMode = "lease" }, `lease mode "lease"`},
		{"sessions without a Sessions client", func(c *Config) {
			c.Admin = struct{ adminv1.ControlPlaneClient }{c.Admin}
		}, "needs a Sessions client"},
	}
	for _, tc := range tests {
		c := base()
		tc.edit(&c)
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if a, err := New(base()); err != nil || a.cfg.RunnerID != "p1" || a.cfg.LeaseMode != LeaseModeSession {
		t.Fatalf("defaults: %v, runner id %q (want the proxy id), lease mode %q (want session)", err, a.cfg.RunnerID, a.cfg.LeaseMode)
	}
}

// A runner that restarted has forgotten the mailbox: the next heartbeat's
// stats reveal it, and the sidecar opens it again under the lease it still
// holds, without a loss.
func TestRestartedRunnerIsReactivated(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	iAct, _ := h.waitEvent(0, "runner activate audit@p1 5")
	h.runner.forget("audit@p1")
	h.settle(2)
	h.clk.Step(testInterval)
	_, reopen := h.waitEvent(iAct, "runner open audit@p1 5")
	if !reopen.at.Equal(h.t0.Add(testInterval)) {
		t.Fatalf("reopened at %v", reopen.at)
	}
	if n := h.ev.count("runner fence"); n != 0 {
		t.Fatalf("fenced:\n%s", h.ev)
	}
	if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues("ttl_elapsed")); got != 0 {
		t.Fatalf("loss counted %v", got)
	}
}

// An unreachable admin cannot hold up a graceful stop beyond StopTimeout;
// the runner is still drained first and the failure is returned.
func TestShutdownBoundedWhenAdminHangs(t *testing.T) {
	t.Parallel()
	const stop = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.StopTimeout = stop })
	h.assign(1, "audit")
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
	h.admin.mu.Lock()
	h.admin.releaseHangs = true
	h.admin.mu.Unlock()
	start := time.Now()
	err := h.stop()
	if err == nil || !strings.Contains(err.Error(), "DeadlineExceeded") {
		t.Fatalf("stop: %v, want the release's deadline error", err)
	}
	if took := time.Since(start); took > stop+5*time.Second {
		t.Fatalf("stop took %v with StopTimeout %v", took, stop)
	}
	iDrain, _ := h.waitEvent(0, "runner drain")
	if i, _, ok := h.ev.find(0, "admin release audit@p1"); !ok || i < iDrain {
		t.Fatalf("release not attempted after the drain:\n%s", h.ev)
	}
}

// Unassigned and assigned again while the runner is still draining: the new
// open and acquire wait for the old close and release.
func TestReassignWaitsForClose(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5")
	gate := make(chan struct{})
	h.runner.mu.Lock()
	h.runner.closeGate = gate
	h.runner.mu.Unlock()
	h.assign(2)
	h.assign(3, "audit")
	h.waitFor("new worker registered", func() bool { return len(h.agent.Leases()) == 1 })
	if n := h.ev.count("runner open audit@p1"); n != 1 {
		t.Fatalf("reopened while the old close is pending:\n%s", h.ev)
	}
	close(gate)
	iRel, _ := h.waitEvent(0, "admin release audit@p1 5")
	iOpen, _ := h.waitEvent(iRel, "runner open audit@p1 0")
	_, act := h.waitEvent(iOpen, "runner activate audit@p1")
	if !strings.HasPrefix(act.what, "runner activate audit@p1 6 ") {
		t.Fatalf("activation %q", act.what)
	}
}

// The runner's control API fails every call from t0+1s. Its probes fail at
// t0+3s (down 3s, under the 5s bound: the heartbeat still goes) and t0+6s
// (past it): no heartbeat then, the fence is not confirmed, so the lease is
// released with its epoch when the deadline the runner was handed at
// activation (t0+10s) has passed, and nothing renews it meanwhile. Once the
// runner answers again the mailbox is opened and acquired as at start.
func TestDeadRunnerGivesLeaseBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
	h.runner.setDown(true)
	h.giveUpDownRunner(2, "runner down extend", func() {
		if n := h.ev.count("admin heartbeat"); n != 1 {
			t.Fatalf("%d heartbeats while the runner is down for less than the bound:\n%s", n, h.ev)
		}
	})
	iRel, rel := h.waitEvent(0, "admin release audit@p1")
	if rel.what != "admin release audit@p1 5" || !rel.at.Equal(h.t0.Add(testTTL)) {
		t.Fatalf("release %q at %v, want epoch 5 at t0+10s, when the runner's own deadline has passed", rel.what, rel.at)
	}
	h.waitFor("lease given up", func() bool { return h.lease("audit@p1").Epoch == 0 })
	if h.agent.Ready() == nil {
		t.Fatal("ready without the lease")
	}
	for range 3 {
		h.settle(2)
		h.clk.Step(time.Second)
		h.waitFor("open retried", func() bool { return h.ev.count("runner down open") > 0 })
	}
	if n, acq := h.ev.count("admin heartbeat"), h.ev.count("admin acquire"); n != 1 || acq != 1 {
		t.Fatalf("%d heartbeats and %d acquires in all while the runner is dead, want 1 and 1:\n%s", n, acq, h.ev)
	}
	if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues("runner_unreachable")); got != 1 {
		t.Fatalf("runner_unreachable losses %v", got)
	}
	if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("runner_unreachable", "released")); got != 1 {
		t.Fatalf("runner_unreachable releases %v", got)
	}

	h.runner.setDown(false)
	h.settle(2)
	h.clk.Step(time.Second)
	iOpen, _ := h.waitEvent(iRel, "runner open audit@p1 0")
	iAcq, _ := h.waitEvent(iOpen, "admin acquire audit@p1")
	_, act := h.waitEvent(iAcq, "runner activate audit@p1")
	if !strings.HasPrefix(act.what, "runner activate audit@p1 6 ") {
		t.Fatalf("re-activation %q, want epoch 6", act.what)
	}
	h.waitFor("ready again", func() bool { return h.agent.Ready() == nil })
}

// A runner that fails one probe (t0+3s) and answers the next (t0+6s), so
// never for the 5s bound, keeps the lease: renewed every interval, extended,
// never fenced or released.
func TestSlowRunnerKeepsLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5")
	h.runner.setDown(true)
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitEvent(0, "runner down extend")
	h.runner.setDown(false)
	for i := 2; i <= 4; i++ {
		h.settle(2)
		h.clk.Step(testInterval)
		sent := h.t0.Add(time.Duration(i) * testInterval)
		h.waitFor(fmt.Sprintf("heartbeat at t0+%v acknowledged", time.Duration(i)*testInterval), func() bool {
			return h.lease("audit@p1").LastAckSent.Equal(sent)
		})
	}
	h.waitEvent(0, "runner extend audit@p1 5")
	if v := h.lease("audit@p1"); v.State != StateActive || v.Epoch != 5 {
		t.Fatalf("lease %+v, want active at epoch 5", v)
	}
	if n := h.ev.count("runner fence") + h.ev.count("admin release") + h.ev.count("runner down fence"); n != 0 {
		t.Fatalf("a runner slow for less than the bound lost its lease:\n%s", h.ev)
	}
	if n := h.ev.count("admin heartbeat"); n != 4 {
		t.Fatalf("%d heartbeats, want 4 (one per interval, the failed probe's included):\n%s", n, h.ev)
	}
}
