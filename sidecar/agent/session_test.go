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

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func namespaces(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("ns%03d", i)
	}
	return out
}

// activations returns the epoch each mailbox was last activated under,
// from the runner's events.
func activations(h *harness) map[string]uint64 {
	out := map[string]uint64{}
	for _, e := range h.ev.all() {
		f := strings.Fields(e.what)
		if len(f) >= 4 && f[0] == "runner" && f[1] == "activate" {
			epoch, _ := strconv.ParseUint(f[3], 10, 64)
			out[f[2]] = epoch
		}
	}
	return out
}

// Fifty mailboxes assigned together are acquired in one AcquireLeases call
// in one session, each activated under its own epoch; then one keepalive
// per interval renews them all (no per-mailbox heartbeat), and after each
// every runner mailbox is extended to ttl from the keepalive's send.
func TestSessionOneKeepAlivePerInterval(t *testing.T) {
	t.Parallel()
	const n = 50
	h := newHarness(t, sessionMode)
	h.assign(1, namespaces(n)...)
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
	if got := h.ev.count("admin acquire-leases"); got != 1 {
		t.Fatalf("%d AcquireLeases calls, want 1:\n%s", got, h.ev)
	}
	_, batch := h.waitEvent(0, "admin acquire-leases 1 ")
	if ids := strings.Split(strings.Fields(batch.what)[3], ","); len(ids) != n {
		t.Fatalf("the batch named %d mailboxes, want %d", len(ids), n)
	}
	epochs := map[uint64]bool{}
	for id, e := range activations(h) {
		if v := h.lease(id); v.Epoch != e || v.SessionID != 1 || v.State != StateActive || !v.FenceAt.Equal(h.t0.Add(testTTL)) {
			t.Fatalf("lease %+v, activated under %d", v, e)
		}
		epochs[e] = true
	}
	if len(epochs) != n {
		t.Fatalf("%d distinct epochs for %d mailboxes", len(epochs), n)
	}
	if got := testutil.ToFloat64(h.agent.m.held); got != n {
		t.Fatalf("leases held gauge %v", got)
	}

	const rounds = 3
	for i := 1; i <= rounds; i++ {
		h.settle(n + 3)
		h.clk.Step(testInterval)
		sent := h.t0.Add(time.Duration(i) * testInterval)
		h.waitFor(fmt.Sprintf("keepalive %d acknowledged and every mailbox extended", i), func() bool {
			return h.ev.count("runner extend") == i*n
		})
		// The session's extender and the workers both follow the
		// keepalive: wait for every worker to have seen it too.
		h.waitFor(fmt.Sprintf("every lease renewed by keepalive %d", i), func() bool {
			for _, v := range h.agent.Leases() {
				if v.LastAckSent.Before(sent) {
					return false
				}
			}
			return true
		})
		for _, v := range h.agent.Leases() {
			if !v.LastAckSent.Equal(sent) || !v.FenceAt.Equal(sent.Add(testTTL)) {
				t.Fatalf("lease %+v after the keepalive sent at %v", v, sent)
			}
		}
	}
	if ka, hb := h.ev.count("admin keepalive"), h.ev.count("admin heartbeat"); ka != rounds || hb != 0 {
		t.Fatalf("%d keepalives and %d mailbox heartbeats for %d intervals, want %d and 0", ka, hb, rounds, rounds)
	}
	if got := testutil.ToFloat64(h.agent.m.keepalives.WithLabelValues("renewed")); got != rounds {
		t.Fatalf("keepalives counted %v", got)
	}
	if got, want := testutil.ToFloat64(h.agent.m.sessionsOpened), 1.0; got != want {
		t.Fatalf("sessions opened %v", got)
	}
	if got := h.agent.sessionLeases(); got != n {
		t.Fatalf("leases in the session %v", got)
	}
}

// A refused keepalive fences every mailbox of the session at once, counted
// with the refusal's reason; the sidecar opens a new session and acquires
// them all again, under new, higher epochs.
func TestSessionRefusedKeepAliveFencesEveryMailbox(t *testing.T) {
	t.Parallel()
	tests := []struct {
		reason adminv1.LeaseRefusalReason
		label  string
	}{
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION, "unknown_session"},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED, "expired"},
	}
	for _, tc := range tests {
		t.Run(tc.label, func(t *testing.T) {
			t.Parallel()
			const n = 3
			h := newHarness(t, sessionMode)
			h.assign(1, namespaces(n)...)
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
			before := activations(h)
			h.admin.setKeepAlive(func(*adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error) {
				return &adminv1.KeepAliveSessionResponse{Refusal: &adminv1.LeaseRefusal{Reason: tc.reason}}, nil
			})
			h.settle(n + 3)
			h.clk.Step(testInterval)
			iRefused, _ := h.waitEvent(0, "admin keepalive 1")
			for _, ns := range namespaces(n) {
				_, f := h.waitEvent(iRefused, "runner fence "+ns+"@p1")
				if f.what != "runner fence "+ns+"@p1 "+tc.label || !f.at.Equal(h.t0.Add(testInterval)) {
					t.Fatalf("fence %q at %v, want %s at once", f.what, f.at, tc.label)
				}
			}
			h.admin.setKeepAlive(nil)
			h.waitEvent(iRefused, "admin open-session")
			h.waitFor("every mailbox active again in session 2", func() bool {
				for _, v := range h.agent.Leases() {
					if v.State != StateActive || v.SessionID != 2 {
						return false
					}
				}
				return true
			})
			after := activations(h)
			for id, e := range before {
				if after[id] <= e {
					t.Fatalf("%s re-activated under epoch %d, want above %d", id, after[id], e)
				}
			}
			if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues(tc.label)); got != n {
				t.Fatalf("%s losses %v, want %d", tc.label, got, n)
			}
			if got := testutil.ToFloat64(h.agent.m.keepalives.WithLabelValues("refused")); got != 1 {
				t.Fatalf("refused keepalives %v", got)
			}
			if got := testutil.ToFloat64(h.agent.m.sessionsOpened); got != 2 {
				t.Fatalf("sessions opened %v", got)
			}
		})
	}
}

// Keepalives that fail outright never move the session's validity: every
// mailbox is fenced exactly ttl after the open was sent (the last
// acknowledged send), not earlier.
func TestSessionValidityRunsOut(t *testing.T) {
	t.Parallel()
	const n = 3
	h := newHarness(t, sessionMode)
	h.assign(1, namespaces(n)...)
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
	h.admin.setKeepAlive(func(*adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error) {
		return nil, status.Error(codes.Unavailable, "connection refused")
	})
	fenceAt := h.t0.Add(testTTL)
	for h.clk.Now().Before(fenceAt.Add(-time.Second)) {
		h.settle(n + 3)
		h.clk.Step(time.Second)
	}
	h.waitFor("retries", func() bool { return h.ev.count("admin keepalive") >= 3 })
	if got := h.ev.count("runner fence"); got != 0 {
		t.Fatalf("fenced before the deadline:\n%s", h.ev)
	}
	h.settle(n + 3)
	h.clk.Step(time.Second)
	for _, ns := range namespaces(n) {
		_, f := h.waitEvent(0, "runner fence "+ns+"@p1 ttl_elapsed")
		if !f.at.Equal(fenceAt) {
			t.Fatalf("fenced at %v, want %v", f.at, fenceAt)
		}
	}
	if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues("ttl_elapsed")); got != n {
		t.Fatalf("ttl_elapsed losses %v", got)
	}
}

// An admin cluster without the Sessions service answers Unimplemented: the
// sidecar holds each lease on its own (LeaseModeMailbox).
func TestSessionFallsBackToMailboxMode(t *testing.T) {
	t.Parallel()
	// An old admin from the start: set before the agent runs.
	oldAdmin := func(c *Config) {
		c.Admin.(*fakeAdmin).setOpen(func(*adminv1.OpenSessionRequest) (*adminv1.OpenSessionResponse, error) {
			return nil, status.Error(codes.Unimplemented, "unknown service prism.admin.v1.Sessions")
		})
	}
	h := newHarness(t, sessionMode, oldAdmin)
	h.assign(1, "audit")
	iAcq, _ := h.waitEvent(0, "admin acquire audit@p1 p1")
	h.waitEvent(iAcq, "runner activate audit@p1 5 ")
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitEvent(0, "admin heartbeat audit@p1 5")
	if got := h.ev.count("admin open-session"); got != 1 {
		t.Fatalf("%d opens, want 1 (then mailbox mode for good)", got)
	}
	if got := h.ev.count("admin acquire-leases") + h.ev.count("admin keepalive"); got != 0 {
		t.Fatalf("session calls after the fallback:\n%s", h.ev)
	}
}

// On stop the runner drains first, then closes every mailbox, then one
// CloseSession ends every lease: no lease is released on its own.
func TestSessionShutdownClosesSession(t *testing.T) {
	t.Parallel()
	const n = 3
	h := newHarness(t, sessionMode)
	h.assign(1, namespaces(n)...)
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	iDrain, _ := h.waitEvent(0, "runner drain")
	iClose, _ := h.waitEvent(iDrain, "admin close-session 1")
	for _, ns := range namespaces(n) {
		if i, _, ok := h.ev.find(iDrain, "runner close "+ns+"@p1"); !ok || i > iClose {
			t.Fatalf("session closed before the runner closed %s (or never closed it):\n%s", ns, h.ev)
		}
	}
	if got := h.ev.count("admin release"); got != 0 {
		t.Fatalf("%d releases besides the close:\n%s", got, h.ev)
	}
}

// Unassigning one mailbox releases its lease alone, in its session, once
// the runner closed it; the others stay held.
func TestSessionUnassignReleasesInSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sessionMode)
	h.assign(1, "a", "b")
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 2 })
	h.assign(2, "a")
	iDrain, _ := h.waitEvent(0, "runner drain b@p1")
	iClose, _ := h.waitEvent(iDrain, "runner close b@p1")
	h.waitEvent(iClose, "admin release-leases 1 b@p1")
	if v := h.lease("a@p1"); v.State != StateActive {
		t.Fatalf("a@p1 %+v, want still active", v)
	}
	if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("unassigned", "released")); got != 1 {
		t.Fatalf("unassigned releases %v", got)
	}
}

// A dead runner's lease is given back in its session, as in mailbox mode:
// fenced at the first probe past the bound, released once the runner's own
// deadline (t0+10s) has passed, acquired again once the runner answers.
func TestSessionDeadRunnerGivesLeaseBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sessionMode)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
	h.runner.setDown(true)
	h.giveUpDownRunner(4, "runner down stats", func() {})
	iRel, rel := h.waitEvent(0, "admin release-leases")
	if rel.what != "admin release-leases 1 audit@p1" || !rel.at.Equal(h.t0.Add(testTTL)) {
		t.Fatalf("release %q at %v, want in session 1 at t0+10s", rel.what, rel.at)
	}
	h.waitFor("lease given up", func() bool { return h.lease("audit@p1").Epoch == 0 })
	h.runner.setDown(false)
	h.waitFor("runner answers again", func() bool {
		if h.clk.Waiters() == 4 {
			h.clk.Step(time.Second)
		}
		_, _, ok := h.ev.find(iRel, "runner activate audit@p1")
		return ok
	})
	if acts := activations(h); acts["audit@p1"] != 6 {
		t.Fatalf("re-activated under %d, want 6", acts["audit@p1"])
	}
	if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("runner_unreachable", "released")); got != 1 {
		t.Fatalf("runner_unreachable releases %v", got)
	}
	if got := h.ev.count("admin acquire-leases"); got != 2 {
		t.Fatalf("%d acquire batches, want the first and the one after the runner came back:\n%s", got, h.ev)
	}
}

// A runner stopped (SIGSTOP) rather than killed: its calls time out, so an
// extension sent after the last keepalive may have been taken before it
// stopped answering, moving its deadline to the one it last confirmed
// (t0+10s) plus the valid_for sent (10s) at most. The lease is released
// only once that has passed (t0+20s), never at the confirmed deadline,
// where the runner, resumed, could still serve beside the next holder.
func TestSessionPausedRunnerReleasesPastUnansweredExtension(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sessionMode)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
	h.runner.mu.Lock()
	h.runner.paused = true
	h.runner.mu.Unlock()
	h.settle(4)
	h.clk.Step(testInterval)
	h.waitEvent(0, "runner paused bulk-extend")
	h.settle(4)
	h.clk.Step(testInterval)
	_, giveUp := h.waitEvent(0, "runner paused fence")
	if !giveUp.at.Equal(h.t0.Add(2 * testInterval)) {
		t.Fatalf("gave up at %v, want at the first probe past the bound (t0+6s)", giveUp.at)
	}
	// Past the confirmed deadline: nothing released yet.
	for h.clk.Since(h.t0) < 2*testTTL {
		if _, _, ok := h.ev.find(0, "admin release-leases"); ok {
			t.Fatalf("released at t0+%v, before the unanswered extension's bound (t0+20s):\n%s", h.clk.Since(h.t0), h.ev)
		}
		h.clk.Step(time.Second)
		time.Sleep(2 * time.Millisecond)
	}
	_, rel := h.waitEvent(0, "admin release-leases")
	if rel.what != "admin release-leases 1 audit@p1" || rel.at.Before(h.t0.Add(2*testTTL)) {
		t.Fatalf("release %q at t0+%v, want in session 1 at t0+20s", rel.what, rel.at.Sub(h.t0))
	}
}

// Mailboxes assigned together whose first runner open failed are still
// acquired together once the runner answers: one AcquireLeases call.
func TestSessionBatchWaitsForRetriedOpens(t *testing.T) {
	t.Parallel()
	const n = 5
	h := newHarness(t, sessionMode)
	h.runner.setDown(true)
	h.assign(1, namespaces(n)...)
	h.waitFor("every open failed", func() bool { return h.ev.count("runner down open") == n })
	h.settle(n + 3)
	h.runner.setDown(false)
	h.clk.Step(time.Second)
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
	if got := h.ev.count("admin acquire-leases"); got != 1 {
		t.Fatalf("%d AcquireLeases calls, want 1:\n%s", got, h.ev)
	}
}

// A batch waits for every mailbox whose first runner open is still in
// flight, however slow, not only for a second: a slow runner does not split
// the mailboxes assigned together.
func TestSessionBatchWaitsForSlowOpens(t *testing.T) {
	t.Parallel()
	const n = 5
	h := newHarness(t, sessionMode)
	gate := make(chan struct{})
	h.runner.mu.Lock()
	h.runner.openGate, h.runner.openGated = gate, "ns004@p1"
	h.runner.mu.Unlock()
	h.assign(1, namespaces(n)...)
	h.waitEvent(0, "runner open held ns004@p1")
	h.waitFor("the others queued", func() bool { return h.ev.count("runner open ns") == n-1 })
	h.settle(3) // proxy heartbeat, keepalive, probe
	h.clk.Step(2 * batchLinger)
	h.settle(3)
	if got := h.ev.count("admin acquire-leases"); got != 0 {
		t.Fatalf("a batch went while a first open was in flight:\n%s", h.ev)
	}
	close(gate)
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
	if got := h.ev.count("admin acquire-leases"); got != 1 {
		t.Fatalf("%d AcquireLeases calls, want 1:\n%s", got, h.ev)
	}
}

// After each acknowledged keepalive the runner's deadlines of every mailbox
// of the session are extended in one ExtendMailboxes; a runner that answers
// it Unimplemented (not upgraded) gets one ExtendMailbox per mailbox from
// then on, and is asked for the bulk call only once.
func TestSessionExtendsEveryMailboxInOneCall(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		noBulk         bool
		bulk, fallback int // per round
	}{
		{"bulk", false, 1, 0},
		{"older runner", true, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n, rounds = 20, 3
			h := newHarness(t, sessionMode, func(c *Config) { c.Runner.(*fakeRunner).noBulk = tc.noBulk })
			h.assign(1, namespaces(n)...)
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == n })
			for i := 1; i <= rounds; i++ {
				h.settle(n + 3)
				h.clk.Step(testInterval)
				sent := h.t0.Add(time.Duration(i) * testInterval)
				h.waitFor(fmt.Sprintf("round %d's extensions", i), func() bool { return h.ev.count("runner extend ") == i*n })
				for _, e := range h.ev.all() {
					if strings.HasPrefix(e.what, "runner extend ") && e.at.Equal(sent) && !strings.HasSuffix(e.what, fmt.Sprintf("valid_for=%v", testTTL)) {
						t.Fatalf("%q: want the session's time left, %s", e.what, testTTL)
					}
				}
			}
			if got := h.ev.count("runner bulk-extend ") - h.ev.count("runner bulk-extend unimplemented"); got != tc.bulk*rounds {
				t.Fatalf("%d ExtendMailboxes calls in %d rounds, want %d:\n%s", got, rounds, tc.bulk*rounds, h.ev)
			}
			if got := h.ev.count("runner bulk-extend unimplemented"); got != tc.fallback {
				t.Fatalf("asked an older runner for ExtendMailboxes %d times, want %d", got, tc.fallback)
			}
			for _, v := range h.agent.Leases() {
				if v.State != StateActive {
					t.Fatalf("lease %+v after the extensions", v)
				}
			}
		})
	}
}

// An activation that outlasts the validity the worker read before it (held
// from t0 to t0+12s, the session renewed every 3s meanwhile) is followed
// by the renewals made during it: the lease is kept, not fenced at t0+10s
// as if no keepalive had been acknowledged.
func TestSessionSlowActivationKeepsRenewals(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sessionMode)
	gate := make(chan struct{})
	h.runner.mu.Lock()
	h.runner.activateGate = gate
	h.runner.mu.Unlock()
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate held audit@p1")
	for i := 1; i <= 4; i++ {
		h.settle(3) // the keepalive, the session's probe, the proxy heartbeat
		h.clk.Step(testInterval)
		h.waitFor(fmt.Sprintf("keepalive %d", i), func() bool { return h.ev.count("admin keepalive") >= i })
	}
	h.settle(3)
	h.runner.mu.Lock()
	h.runner.activateGate = nil
	h.runner.mu.Unlock()
	close(gate)
	want := h.t0.Add(4*testInterval + testTTL)
	h.waitFor("active under the last renewal", func() bool {
		v := h.lease("audit@p1")
		return v.State == StateActive && v.FenceAt.Equal(want)
	})
	if _, e, ok := h.ev.find(0, "runner fence"); ok {
		t.Fatalf("fenced at %v after a slow activation:\n%s", e.at, h.ev)
	}
	if got := testutil.CollectAndCount(h.agent.m.losses); got != 0 {
		t.Fatalf("%d lease losses after a slow activation", got)
	}
}
