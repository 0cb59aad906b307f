package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A mailbox leaving the sidecar, unassigned or at shutdown, in either lease
// mode.
type retireCase struct {
	name     string
	session  bool
	shutdown bool
}

var retireCases = []retireCase{
	{"mailbox mode unassign", false, false},
	{"mailbox mode shutdown", false, true},
	{"session mode unassign", true, false},
	{"session mode shutdown", true, true},
}

func (tc retireCase) harness(t *testing.T, opts ...func(*Config)) *harness {
	if tc.session {
		opts = append(opts, sessionMode)
	}
	return newHarness(t, opts...)
}

// release is the admin call that gives the lease of id (granted at epoch in
// session 1) back: the session's close at shutdown in session mode.
func (tc retireCase) release(id string, epoch uint64) string {
	switch {
	case tc.session && tc.shutdown:
		return "admin close-session 1"
	case tc.session:
		return "admin release-leases 1 " + id
	default:
		return fmt.Sprintf("admin release %s %d", id, epoch)
	}
}

// retire unassigns audit@p1 (keeping billing@p1 when keep) or stops the
// agent, in the background.
func (tc retireCase) retire(h *harness, keep bool) chan error {
	done := make(chan error, 1)
	switch {
	case tc.shutdown:
		go func() { done <- h.stop() }()
	case keep:
		h.assign(2, "billing")
		close(done)
	default:
		h.assign(2)
		close(done)
	}
	return done
}

// Routes are per proxy, so the runner alone decides what it serves: the
// lease of a mailbox goes only after the runner closed it (drained first,
// so offsets are committed and queries in flight answered), never while it
// might still answer for it. On the old order (release, then close) the
// release comes first and this fails.
func TestRunnerClosesBeforeRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range retireCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.harness(t)
			h.assign(1, "audit", "billing")
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 2 })
			epochs := map[string]uint64{}
			for _, v := range h.agent.Leases() {
				epochs[v.MailboxID] = v.Epoch
			}
			if err := <-tc.retire(h, true); err != nil {
				t.Fatalf("stop: %v", err)
			}
			retired := []string{"audit@p1"}
			if tc.shutdown {
				retired = append(retired, "billing@p1")
			}
			for _, id := range retired {
				iDrain, _ := h.waitEvent(0, "runner drain")
				iClose, _ := h.waitEvent(iDrain, "runner close "+id)
				iRel, _ := h.waitEvent(0, tc.release(id, epochs[id]))
				if iRel < iClose {
					t.Fatalf("%s: lease released before the runner closed the mailbox:\n%s", id, h.ev)
				}
			}
			if !tc.shutdown {
				if n := h.ev.count("runner close billing@p1") + h.ev.count(tc.release("billing@p1", epochs["billing@p1"])); n != 0 {
					t.Fatalf("billing@p1 touched by audit's unassignment:\n%s", h.ev)
				}
			}
		})
	}
}

// The runner's control API is down when the mailbox leaves: neither the
// close nor the fence is confirmed, so the lease is released only once the
// deadline the runner was handed at activation (t0+10s) has passed, when
// it has fenced itself; not a moment before. On the old order the release
// came at once, at t0.
func TestUnreachableRunnerReleaseWaitsForDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range retireCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A stop long enough to wait the deadline out.
			h := tc.harness(t, func(c *Config) { c.StopTimeout = 15 * time.Second })
			h.assign(1, "audit")
			h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
			h.runner.setDown(true)
			done := tc.retire(h, false)
			iFence, _ := h.waitEvent(0, "runner down fence")
			if _, _, ok := h.ev.find(0, "runner down close"); !ok {
				t.Fatalf("no close tried before the fence:\n%s", h.ev)
			}
			// Waiting: the deadline's timer, plus the proxy heartbeat (and
			// the session's keepalive and probe) while not stopping.
			waiters := 1
			if !tc.shutdown {
				waiters = 2
				if tc.session {
					waiters = 4
				}
			}
			deadline := h.t0.Add(testTTL)
			h.settle(waiters)
			h.clk.SetTime(deadline.Add(-time.Millisecond))
			h.settle(waiters)
			rel := tc.release("audit@p1", 5)
			if _, _, ok := h.ev.find(0, rel); ok {
				t.Fatalf("released before the runner's deadline:\n%s", h.ev)
			}
			h.clk.Step(time.Millisecond)
			_, e := h.waitEvent(iFence, rel)
			if !e.at.Equal(deadline) {
				t.Fatalf("%q at %v, want at the runner's deadline %v", e.what, e.at, deadline)
			}
			if err := <-done; err != nil && !strings.Contains(err.Error(), "drain runner") {
				t.Fatalf("stop: %v", err)
			}
		})
	}
}

// A stop that ends before the unreachable runner's deadline releases
// nothing: the lease (in session mode, the whole session) is left to
// expire on the admin after ttl + grace, past that deadline, and counted.
func TestShutdownLeavesLeaseOfUnreachableRunner(t *testing.T) {
	t.Parallel()
	for _, tc := range retireCases {
		if !tc.shutdown {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.harness(t, func(c *Config) { c.StopTimeout = 300 * time.Millisecond })
			h.assign(1, "audit")
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
			h.runner.setDown(true)
			if err := h.stop(); err == nil || !strings.Contains(err.Error(), "lease of audit@p1 not released") {
				t.Fatalf("stop: %v, want audit@p1's lease named as not released", err)
			}
			h.waitEvent(0, "runner down fence")
			if n := h.ev.count("admin release") + h.ev.count("admin close-session"); n != 0 {
				t.Fatalf("a lease went while the runner may still serve it:\n%s", h.ev)
			}
			if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("shutdown", "expiring")); got != 1 {
				t.Fatalf("leases left to expire counted %v, want 1", got)
			}
		})
	}
}

// A shutdown while an unassigned mailbox waits out its unreachable runner's
// deadline ends the wait: its lease is left to expire, and in session mode
// the session is not closed, since closing it would end that lease too.
func TestShutdownDuringUnassignWaitKeepsLease(t *testing.T) {
	t.Parallel()
	for _, tc := range retireCases {
		if tc.shutdown {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.harness(t)
			h.assign(1, "audit")
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
			h.runner.setDown(true)
			if err := <-tc.retire(h, false); err != nil {
				// A stop with the runner down says so; what counts here is
				// the order of fence and release below.
				t.Logf("retire with the runner down: %v", err)
			}
			h.waitEvent(0, "runner down fence")
			// The unassign waits on the clock beside the proxy heartbeat
			// (and the session's keepalive and probe).
			if tc.session {
				h.settle(4)
			} else {
				h.settle(2)
			}
			if err := h.stop(); err != nil && !strings.Contains(err.Error(), "drain runner") {
				t.Fatalf("stop: %v", err)
			}
			if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("unassigned", "expiring")); got != 1 {
				t.Fatalf("leases left to expire counted %v, want 1", got)
			}
			if n := h.ev.count("admin release") + h.ev.count("admin close-session"); n != 0 {
				t.Fatalf("a lease went while the runner may still serve it:\n%s", h.ev)
			}
		})
	}
}

// In session mode, one mailbox the runner does not confirm closing keeps
// the session open at shutdown, since closing it would end that lease too:
// the other leases are released one by one once closed, and the session
// expires after ttl + grace.
func TestSessionShutdownKeepsSessionOfUnconfirmedMailbox(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sessionMode, func(c *Config) { c.StopTimeout = 300 * time.Millisecond })
	h.assign(1, "audit", "billing")
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 2 })
	h.runner.mu.Lock()
	h.runner.stuck = "audit@p1"
	h.runner.mu.Unlock()
	if err := h.stop(); err == nil || !strings.Contains(err.Error(), "lease of audit@p1 not released") {
		t.Fatalf("stop: %v, want audit@p1's lease named as not released", err)
	}
	iClose, _ := h.waitEvent(0, "runner close billing@p1")
	h.waitEvent(iClose, "admin release-leases 1 billing@p1")
	h.waitEvent(0, "runner stuck fence audit@p1")
	if n := h.ev.count("admin close-session") + h.ev.count("admin release-leases 1 audit@p1"); n != 0 {
		t.Fatalf("audit@p1's lease ended while the runner may still serve it:\n%s", h.ev)
	}
	if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("shutdown", "expiring")); got != 1 {
		t.Fatalf("leases left to expire counted %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("shutdown", "released")); got != 1 {
		t.Fatalf("leases released counted %v, want 1 (billing@p1)", got)
	}
}
