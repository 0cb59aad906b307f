package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The proxy heartbeat reports the runner's readiness (bound 5s: half the
// 10s ttl, under three 3s intervals): ready while the runner answers and
// while it has failed for less than the bound (t0+6s, down 3s: a runner
// slow or paused that long moves nothing), not ready from the first
// heartbeat past it (t0+9s, down 6s), on the registration an admin that
// forgot the proxy asks for too, and ready again at its first answer.
func TestProxyReportsRunnerReadiness(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i, step := range []struct {
		name         string
		down, forget bool
		notReady     bool
	}{
		{name: "runner answers"},
		{name: "down 3s, under the bound", down: true},
		{name: "down 6s, past the bound", down: true, notReady: true},
		{name: "still down, the admin forgot the proxy", down: true, forget: true, notReady: true},
		{name: "answers again"},
		{name: "answering"},
	} {
		h.runner.setDown(step.down)
		h.admin.mu.Lock()
		h.admin.forgetProxy = step.forget
		h.admin.mu.Unlock()
		h.settle(1)
		h.clk.Step(testInterval)
		h.waitFor(fmt.Sprintf("proxy heartbeat %d", i+1), func() bool {
			hbs, _ := h.admin.proxyReports()
			return len(hbs) > i
		})
		hbs, _ := h.admin.proxyReports()
		if hb := hbs[i]; hb.GetRunnerNotReady() != step.notReady || hb.GetRunnerId() != "p1" {
			t.Fatalf("%s (t0+%v): heartbeat %v, want runner p1 not ready %v", step.name, h.clk.Since(h.t0), hb, step.notReady)
		}
		if step.forget {
			h.waitFor("registered again", func() bool {
				_, regs := h.admin.proxyReports()
				return len(regs) == 2
			})
			if _, regs := h.admin.proxyReports(); !regs[1].GetRunnerNotReady() {
				t.Fatalf("registered again while the runner is not ready: %v", regs[1])
			}
		}
		if got, want := testutil.ToFloat64(h.agent.m.runnerReady), map[bool]float64{false: 1, true: 0}[step.notReady]; got != want {
			t.Fatalf("%s: prism_sidecar_runner_ready %v, want %v", step.name, got, want)
		}
	}
	if _, regs := h.admin.proxyReports(); regs[0].GetRunnerNotReady() {
		t.Fatalf("first registration %v: a runner not yet probed counts as ready", regs[0])
	}
}

// A probe that fails because the sidecar itself was stopped while it was
// in flight (SIGCONT 8s later, past the 5s bound, with the probe's 1s
// timeout fired first) counts for nothing (silence.go): the runner stays
// ready, where counting the pause would have reported it not ready and
// moved every namespace.
func TestRunnerProbeDiscountsSidecarPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.RPCTimeout = 2 * time.Second })
	for i, step := range []struct {
		name  string
		stall time.Duration
	}{
		{name: "runner answers at t0+3s"},
		{name: "sidecar paused 8s during the probe at t0+6s", stall: 8 * time.Second},
		{name: "answers after the pause"},
	} {
		h.runner.mu.Lock()
		h.runner.stall = step.stall
		h.runner.mu.Unlock()
		h.settle(1)
		h.clk.Step(testInterval)
		h.waitFor(fmt.Sprintf("proxy heartbeat %d", i+1), func() bool {
			hbs, _ := h.admin.proxyReports()
			return len(hbs) > i
		})
		if hbs, _ := h.admin.proxyReports(); hbs[i].GetRunnerNotReady() {
			t.Fatalf("%s: heartbeat %v reports the runner not ready", step.name, hbs[i])
		}
	}
	if _, _, ok := h.ev.find(0, "runner stats stalled"); !ok {
		t.Fatalf("no probe stalled:\n%s", h.ev)
	}
}
