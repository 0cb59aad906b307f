package agent

import (
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// stepUntil advances the fake clock by d until cond holds: a step may land
// before a goroutine arms its timer, so one step is not always enough.
func (h *harness) stepUntil(what string, d time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out stepping for %s; events:\n%s", what, h.ev)
		}
		h.clk.Step(d)
		for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end) && !cond(); {
			time.Sleep(time.Millisecond)
		}
	}
}

// reportedAfter is namespace ns's health in the first proxy heartbeat sent
// after the first n, if any.
func (h *harness) reportedAfter(n int, ns string) (*adminv1.NamespaceHealth, bool) {
	hbs, _ := h.admin.proxyReports()
	if len(hbs) <= n {
		return nil, false
	}
	for _, nh := range hbs[n].GetNamespaceHealth() {
		if nh.GetNamespace() == ns {
			return nh, true
		}
	}
	return nil, true
}

// A mailbox the runner cannot open is reported open_failed, with the
// runner's error, from OpenFailuresReported consecutive failures on (not
// before), and no longer once an open succeeds.
func TestOpenFailureReportedAfterBound(t *testing.T) {
	t.Parallel()
	// Retries an hour apart, heartbeats every testInterval: a heartbeat
	// step never retries the open, so each report sees a settled count.
	h := newHarness(t, func(c *Config) { c.Backoff.Duration = time.Hour })
	h.runner.failOpen("bad@p1", status.Error(codes.Internal, "open bad@p1: prepare bad@p1: store damaged: table 000001.sst truncated"))
	h.assign(1, "bad")
	h.waitFor("first open failure", func() bool { return h.lease("bad@p1").OpenFailures == 1 })

	report := func(what string) *adminv1.NamespaceHealth {
		h.t.Helper()
		hbs, _ := h.admin.proxyReports()
		n := len(hbs)
		var nh *adminv1.NamespaceHealth
		h.stepUntil(what, testInterval, func() bool {
			var ok bool
			nh, ok = h.reportedAfter(n, "bad")
			return ok
		})
		return nh
	}
	if nh := report("a heartbeat after one failure"); nh.GetOpenFailed() || nh.GetOpenFailure() != "" {
		t.Fatalf("reported %v after one failure, want no open_failed before %d", nh, OpenFailuresReported)
	}

	h.stepUntil("the bound of failures", time.Hour, func() bool { return h.lease("bad@p1").OpenFailures >= OpenFailuresReported })
	nh := report("a heartbeat past the bound")
	if !nh.GetOpenFailed() || nh.GetOpenFailure() != "open bad@p1: prepare bad@p1: store damaged: table 000001.sst truncated" ||
		nh.GetStatus() != adminv1.HealthStatus_HEALTH_STATUS_UNHEALTHY {
		t.Fatalf("reported %v past the bound, want open_failed with the runner's error", nh)
	}

	h.runner.failOpen("bad@p1", nil)
	h.stepUntil("an open that succeeds", time.Hour, func() bool { return h.lease("bad@p1").State != StateOpening })
	if v := h.lease("bad@p1"); v.OpenFailures != 0 || v.OpenError != "" {
		t.Fatalf("after a successful open: %+v, want the failures cleared", v)
	}
	if nh := report("a heartbeat after the open"); nh.GetOpenFailed() || nh.GetOpenFailure() != "" {
		t.Fatalf("reported %v after a successful open", nh)
	}
}

// Only the runner's answer that the store failed counts: an unreachable
// runner is the runner probe's business, not the mailbox's.
func TestStoreOpenFailedCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code codes.Code
		want bool
	}{
		{codes.Internal, true},
		{codes.Unavailable, false},
		{codes.DeadlineExceeded, false},
		{codes.FailedPrecondition, false},
	} {
		if got := storeOpenFailed(status.Error(tc.code, "x")); got != tc.want {
			t.Errorf("%s: storeOpenFailed %t, want %t", tc.code, got, tc.want)
		}
	}
	if got := truncate("ab☃", 3); got != "ab" {
		t.Errorf("truncate cut a rune: %q", got)
	}
}
