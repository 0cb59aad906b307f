package agent

import (
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/boottime"
)

const testBootID = "6a1b0c8e-0000-4000-8000-000000000002"

// withBoottime gives the agent a boot clock that runs with its fake clock,
// at boot when the harness starts.
func withBoottime(boot time.Duration) func(*Config) {
	return func(c *Config) {
		clk := c.Clock
		t0 := clk.Now()
		c.Boottime = func() (boottime.Stamp, bool) {
			return boottime.Stamp{BootID: testBootID, Since: boot + clk.Since(t0)}, true
		}
	}
}

// Every validity handed to the runner carries its end as an instant on the
// boot clock the runner shares: valid_for alone counts from receipt, which a
// paused runner may delay past the lease's end.
func TestRunnerValidityCarriesTheBoottimeBound(t *testing.T) {
	t.Parallel()
	const boot = time.Hour
	for _, tc := range []struct {
		name    string
		opts    []func(*Config)
		noBulk  bool
		waiters int
	}{
		{"mailbox lease", nil, false, 2},
		{"session", []func(*Config){sessionMode}, false, 4},
		{"session without bulk extend", []func(*Config){sessionMode}, true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, append(tc.opts, withBoottime(boot))...)
			h.runner.mu.Lock()
			h.runner.noBulk = tc.noBulk
			h.runner.mu.Unlock()
			h.assign(1, "audit")
			h.waitEvent(0, "runner activate audit@p1")
			h.settle(tc.waiters)
			h.clk.Step(testInterval)
			h.waitEvent(0, "runner extend audit@p1")
			calls := map[string]int{}
			for _, g := range h.runner.grants() {
				calls[g.call]++
				// The clock does not move between a send and its
				// receipt here: the bound is the receipt's boot clock
				// plus valid_for.
				want := boot + g.at.Sub(h.t0) + g.validFor
				if g.bound.GetBootId() != testBootID || time.Duration(g.bound.GetValidUntilBoottime()) != want {
					t.Errorf("%s %s valid_for=%v at %v: bound %v, want boot id %s until %v", g.call, g.id, g.validFor, g.at.Sub(h.t0), g.bound, testBootID, want)
				}
			}
			if calls["activate"] == 0 || calls["extend"] == 0 {
				t.Fatalf("validities handed %v, want activations and extensions", calls)
			}
		})
	}
}

// A host without a boot clock sends valid_for alone, with no boot clock bound.
func TestRunnerValidityWithoutBoottime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.Boottime = func() (boottime.Stamp, bool) { return boottime.Stamp{}, false } })
	h.assign(1, "audit")
	h.waitEvent(0, "runner activate audit@p1")
	for _, g := range h.runner.grants() {
		if g.bound != nil {
			t.Fatalf("%s carries bound %v without a boot clock", g.call, g.bound)
		}
	}
}
