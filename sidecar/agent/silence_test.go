package agent

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// The runner's silence, with probes of a 1s timeout every 3s (the end of
// one to the send of the next): each step is one probe, sent at sent
// seconds and ended at end, answered or failed, and the silence after it.
func TestSilenceCountsOnlyTheSidecarsRunningTime(t *testing.T) {
	t.Parallel()
	errDown := errors.New("connection refused")
	type probe struct {
		sent, end float64
		failed    bool
		heard     float64 // the runner's last answer to any call, if > 0
		want      float64 // seconds of silence after it
	}
	for _, tc := range []struct {
		name   string
		probes []probe
	}{
		{name: "answers", probes: []probe{{sent: 3, end: 3, want: 0}, {sent: 6, end: 6.5, want: 0}}},
		{name: "fails at once: the silence runs from the last answer", probes: []probe{
			{sent: 3, end: 3, failed: true, want: 3}, {sent: 6, end: 6, failed: true, want: 6}, {sent: 9, end: 9, want: 0},
		}},
		{name: "times out: counted to the end of the timeout", probes: []probe{
			{sent: 3, end: 4, failed: true, want: 4}, {sent: 7, end: 8, failed: true, want: 8},
		}},
		{name: "fails a little past its timeout (scheduling): counted to its timeout", probes: []probe{
			{sent: 3, end: 4.5, failed: true, want: 4},
		}},
		{name: "sidecar paused 8s with the probe in flight: the probe counts for nothing", probes: []probe{
			{sent: 3, end: 11, failed: true, want: 0}, {sent: 14, end: 14, failed: true, want: 3},
			{sent: 17, end: 17, failed: true, want: 6},
		}},
		{name: "paused mid-silence with the probe in flight: the silence before stays, the pause adds nothing", probes: []probe{
			{sent: 3, end: 3, failed: true, want: 3}, {sent: 6, end: 14, failed: true, want: 3},
			{sent: 17, end: 17, failed: true, want: 6},
		}},
		{name: "sidecar paused 7s between probes (its timer late): the gap counts one interval", probes: []probe{
			{sent: 10, end: 10, failed: true, want: 3}, {sent: 13, end: 14, failed: true, want: 7},
		}},
		{name: "paused between probes mid-silence", probes: []probe{
			{sent: 3, end: 4, failed: true, want: 4}, {sent: 20, end: 20, failed: true, want: 7},
		}},
		{name: "an answer after a pause ends the silence", probes: []probe{
			{sent: 3, end: 3, failed: true, want: 3}, {sent: 6, end: 30, want: 0}, {sent: 33, end: 33, failed: true, want: 3},
		}},
		{name: "stats time out but the runner answers other calls: silent only since", probes: []probe{
			{sent: 3, end: 4, failed: true, heard: 3.5, want: 0.5}, {sent: 7, end: 8, failed: true, heard: 7.5, want: 0.5},
			{sent: 11, end: 12, failed: true, heard: 7.5, want: 4.5},
		}},
		{name: "an answer before a pause does not count the pause", probes: []probe{
			{sent: 3, end: 3, failed: true, heard: 1, want: 2}, {sent: 20, end: 20, failed: true, heard: 1, want: 5},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t0 := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
			at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
			sil := newSilence(t0, time.Second, 3*time.Second)
			for i, p := range tc.probes {
				var err error
				if p.failed {
					err = errDown
				}
				var heard time.Time
				if p.heard > 0 {
					heard = at(p.heard)
				}
				want := time.Duration(p.want * float64(time.Second))
				if got := sil.observe(at(p.sent), at(p.end), err, heard); got != want || sil.down() != want {
					t.Fatalf("probe %d %+v: silence %v (down %v), want %v", i, p, got, sil.down(), want)
				}
			}
		})
	}
}

// A worker counts the silence from its own activation at the earliest: the
// runner answered it, whatever the session's probes saw before.
func TestSilenceSinceActivation(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	sil := newSilence(t0, time.Second, 3*time.Second)
	sil.observe(t0.Add(3*time.Second), t0.Add(3*time.Second), errors.New("down"), time.Time{})
	sil.observe(t0.Add(6*time.Second), t0.Add(6*time.Second), errors.New("down"), time.Time{})
	for _, tc := range []struct {
		activated time.Duration
		want      time.Duration
	}{
		{activated: 0, want: 6 * time.Second},
		{activated: 4 * time.Second, want: 2 * time.Second},
		{activated: 7 * time.Second, want: 0},
	} {
		if got := sil.since(t0.Add(tc.activated)); got != tc.want {
			t.Errorf("activated at t0+%v: silence %v, want %v", tc.activated, got, tc.want)
		}
	}
}

// The proxy heartbeat's probe (bound 5s, probe timeout 1s): the runner
// answers at t0+3s; the sidecar is stopped for 8s with the probe of t0+6s
// in flight; the runner then fails from t0+17s. The stopped probe counts
// for nothing, so at t0+17s the runner has been silent 3s, not 14s since
// its last answer, and stays ready; at t0+20s, 6s, it is reported not
// ready: the bound still holds after a pause.
func TestRunnerProbeIgnoresSidecarPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.RPCTimeout = 2 * time.Second })
	for i, step := range []struct {
		name     string
		stall    time.Duration
		down     bool
		notReady bool
	}{
		{name: "runner answers at t0+3s"},
		{name: "sidecar paused 8s during the probe at t0+6s", stall: 8 * time.Second},
		{name: "runner fails at t0+17s, 3s of silence", down: true},
		{name: "runner fails at t0+20s, 6s of silence", down: true, notReady: true},
	} {
		h.runner.mu.Lock()
		h.runner.stall = step.stall
		h.runner.mu.Unlock()
		h.runner.setDown(step.down)
		h.settle(1)
		h.clk.Step(testInterval)
		h.waitFor(fmt.Sprintf("proxy heartbeat %d", i+1), func() bool {
			hbs, _ := h.admin.proxyReports()
			return len(hbs) > i
		})
		if hbs, _ := h.admin.proxyReports(); hbs[i].GetRunnerNotReady() != step.notReady {
			t.Fatalf("%s (t0+%v): heartbeat %v, want runner not ready %v", step.name, h.clk.Since(h.t0), hbs[i], step.notReady)
		}
	}
	if _, e, ok := h.ev.find(0, "runner stats stalled"); !ok || !e.at.Equal(h.t0.Add(2*testInterval)) {
		t.Fatalf("no probe stalled at t0+6s:\n%s", h.ev)
	}
}

// Mailbox mode: the runner fails its probe at t0+3s (3s of silence, under
// the 5s bound); the sidecar is then stopped for 4s with the probe of
// t0+6s in flight (its timeout 1s), which old code counted as the runner
// silent until t0+7s, past the bound, and gave a live runner's lease up.
// The stopped probe counts for nothing: the heartbeat still goes, and once
// the runner answers (t0+13s) the lease is held on under its epoch.
func TestMailboxProbeIgnoresSidecarPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.RPCTimeout = 2 * time.Second })
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
	h.runner.setDown(true)
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitFor("the failed probe's heartbeat", func() bool { return h.ev.count("admin heartbeat") == 1 })
	h.runner.setDown(false)
	h.runner.mu.Lock()
	h.runner.stall, h.runner.stallID = 4*time.Second, "audit@p1"
	h.runner.mu.Unlock()
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitFor("the stopped probe's heartbeat", func() bool { return h.ev.count("admin heartbeat") == 2 })
	h.waitFor("the heartbeat after the pause acknowledged", func() bool {
		return h.lease("audit@p1").LastAckSent.Equal(h.t0.Add(10 * time.Second))
	})
	h.settle(2)
	h.clk.Step(testInterval)
	h.waitFor("heartbeat at t0+13s acknowledged", func() bool {
		return h.lease("audit@p1").LastAckSent.Equal(h.t0.Add(13 * time.Second))
	})
	if v := h.lease("audit@p1"); v.State != StateActive || v.Epoch != 5 {
		t.Fatalf("lease %+v, want active at epoch 5", v)
	}
	if n := h.ev.count("runner down fence") + h.ev.count("runner fence") + h.ev.count("admin release"); n != 0 {
		t.Fatalf("the sidecar's own pause cost a live runner its lease:\n%s", h.ev)
	}
	if got := testutil.ToFloat64(h.agent.m.losses.WithLabelValues("runner_unreachable")); got != 0 {
		t.Fatalf("runner_unreachable losses %v", got)
	}
}

// Session mode: the sidecar is stopped from t0 to t0+7s between probes,
// so the session's probe due at t0+3s goes at t0+7s, and the runner, busy
// catching up, fails it. Old code counted the runner silent 7s since its
// activation, past the 5s bound, and gave the lease up; the late timer's
// gap counts one interval (3s), so the lease is kept, and the next probe's
// answer (t0+10s) ends the silence.
func TestSessionProbeIgnoresSidecarPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sessionMode)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
	h.runner.setDown(true)
	h.settle(4)
	h.clk.Step(7 * time.Second)
	h.waitEvent(0, "runner down stats")
	h.waitFor("the keepalive after the pause acknowledged", func() bool {
		return h.lease("audit@p1").LastAckSent.Equal(h.t0.Add(7 * time.Second))
	})
	h.runner.setDown(false)
	h.settle(4)
	h.clk.Step(testInterval)
	h.waitFor("the keepalive at t0+10s acknowledged", func() bool {
		return h.lease("audit@p1").LastAckSent.Equal(h.t0.Add(10 * time.Second))
	})
	if v := h.lease("audit@p1"); v.State != StateActive || v.Epoch != 5 {
		t.Fatalf("lease %+v, want active at epoch 5", v)
	}
	if n := h.ev.count("runner down fence") + h.ev.count("runner fence") + h.ev.count("admin release"); n != 0 {
		t.Fatalf("the sidecar's own pause cost a live runner its lease:\n%s", h.ev)
	}
}

// A runner too busy to answer its stats in time (DeadlineExceeded from
// t0+3s on, as when it opens a thousand stores on two cores) but answering
// the sidecar's other calls (each heartbeat's extend) is not taken for
// dead: silent only since its last answer to any call, it keeps the lease
// and the proxy reports it ready, where counting the stats alone gave the
// lease up at t0+6s and reported it not ready at t0+9s.
func TestBusyRunnerAnsweringOtherCallsKeepsLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
	h.runner.mu.Lock()
	h.runner.statsErr = status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	h.runner.mu.Unlock()
	for i := 1; i <= 4; i++ {
		h.settle(2)
		h.clk.Step(testInterval)
		sent := h.t0.Add(time.Duration(i) * testInterval)
		h.waitFor(fmt.Sprintf("heartbeat at t0+%v acknowledged and extended", time.Duration(i)*testInterval), func() bool {
			return h.lease("audit@p1").LastAckSent.Equal(sent) && h.ev.count("runner extend audit@p1") == i
		})
		h.waitFor(fmt.Sprintf("proxy heartbeat %d", i), func() bool {
			hbs, _ := h.admin.proxyReports()
			return len(hbs) >= i
		})
	}
	if hbs, _ := h.admin.proxyReports(); slices.ContainsFunc(hbs, (*adminv1.ProxyHeartbeatRequest).GetRunnerNotReady) {
		t.Fatalf("a busy runner answering its other calls reported not ready: %v", hbs)
	}
	if v := h.lease("audit@p1"); v.State != StateActive || v.Epoch != 5 {
		t.Fatalf("lease %+v, want active at epoch 5", v)
	}
	if n := h.ev.count("runner fence") + h.ev.count("admin release"); n != 0 || h.ev.count("runner stats failed") < 8 {
		t.Fatalf("a busy runner answering its other calls lost its lease, or was not probed:\n%s", h.ev)
	}
}
