package agent

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A runner that exits under a live sidecar (its control port refuses
// connections) serves nothing, so its lease goes at the first probe that
// finds it gone (t0+3s), in either lease mode, not once the deadline it was
// handed (t0+10s) has passed as for a runner that only does not answer
// (TestDeadRunnerGivesLeaseBack, TestSessionDeadRunnerGivesLeaseBack). No
// heartbeat is sent for it. Started again, it is opened, acquired and
// activated under a new epoch as soon as a dial to it connects, without
// waiting out a retry.
func TestGoneRunnerReleasesAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		session bool
		waiters int // the proxy heartbeat's and the worker's timers (and the session's keepalive and probe)
		release string
	}{
		{"mailbox mode", false, 2, "admin release audit@p1 5"},
		{"session mode", true, 4, "admin release-leases 1 audit@p1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := retireCase{session: tc.session}.harness(t)
			h.assign(1, "audit")
			h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
			h.runner.exit()
			h.settle(tc.waiters)
			h.clk.Step(testInterval)
			iRel, rel := h.waitEvent(0, tc.release)
			if probe := h.t0.Add(testInterval); !rel.at.Equal(probe) {
				t.Fatalf("%q at %v, want at the first probe after the exit (%v), before the runner's deadline t0+10s", rel.what, rel.at, probe)
			}
			if n := h.ev.count("admin heartbeat"); n != 0 {
				t.Fatalf("%d heartbeats for a gone runner:\n%s", n, h.ev)
			}
			h.waitFor("lease given up", func() bool { return h.lease("audit@p1").Epoch == 0 })
			losses := testutil.ToFloat64(h.agent.m.losses.WithLabelValues("runner_gone"))
			releases := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("runner_gone", "released"))
			if losses != 1 || releases != 1 {
				t.Fatalf("runner_gone losses %v and releases %v, want 1 and 1", losses, releases)
			}
			h.waitEvent(iRel, "runner refused open")

			h.runner.start()
			iOpen, _ := h.waitEvent(iRel, "runner open audit@p1 0")
			_, act := h.waitEvent(iOpen, "runner activate audit@p1")
			if !strings.HasPrefix(act.what, "runner activate audit@p1 6 ") || !act.at.Equal(rel.at) {
				t.Fatalf("%q at %v, want epoch 6 as soon as the runner listens again (%v)", act.what, act.at, rel.at)
			}
			h.waitFor("ready again", func() bool { return h.agent.Ready() == nil })
		})
	}
}

// A mailbox leaving the sidecar (unassigned, or at the stop: the kubelet
// stops a native sidecar after its runner exited) whose runner is gone is
// released at once, and the stop succeeds: the runner serves nothing, so
// neither the deadline it was handed (t0+10s, past the 4s stop) nor an
// unconfirmed drain holds the lease. Before, the stop left the lease to
// expire and failed.
func TestGoneRunnerRetireReleasesAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range retireCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.harness(t)
			h.assign(1, "audit")
			h.waitEvent(0, "runner activate audit@p1 5 valid_for=10s")
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil })
			h.runner.exit()
			if err := <-tc.retire(h, false); err != nil {
				t.Fatalf("stop with the runner gone: %v\n%s", err, h.ev)
			}
			_, e := h.waitEvent(0, tc.release("audit@p1", 5))
			if !e.at.Equal(h.t0) {
				t.Fatalf("%q at %v, want at once (t0)", e.what, e.at)
			}
			if got := testutil.ToFloat64(h.agent.m.releases.WithLabelValues("shutdown", "expiring")) +
				testutil.ToFloat64(h.agent.m.releases.WithLabelValues("unassigned", "expiring")); got != 0 {
				t.Fatalf("%v leases left to expire", got)
			}
		})
	}
}

// RunnerDialer calls a runner gone only when the last dial was refused and
// no connection is open: a listener that does not accept (the runner
// stopped, SIGSTOP: the kernel still completes the handshake) connects,
// and the next dial that connects closes Dialed.
func TestRunnerDialer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	d := NewRunnerDialer()
	ctx := context.Background()
	dialed := d.Dialed()
	// Nothing accepts: the listening socket alone completes the handshake.
	c, err := d.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial a listener that does not accept: %v", err)
	}
	select {
	case <-dialed:
	default:
		t.Fatal("Dialed not closed by a dial that connected")
	}
	ln.Close()
	if _, err := d.Dial(ctx, addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial with nothing listening: %v, want refused", err)
	}
	if d.Refusing() {
		t.Fatal("refusing while a connection is still open")
	}
	c.Close()
	c.Close() // closed once, counted once
	if !d.Refusing() {
		t.Fatal("not refusing: the last dial was refused and no connection is open")
	}
	dialed = d.Dialed()
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("listen again on %s: %v", addr, err)
	}
	defer ln.Close()
	c, err = d.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d.Refusing() {
		t.Fatal("refusing after a dial connected")
	}
	select {
	case <-dialed:
	case <-time.After(time.Second):
		t.Fatal("Dialed not closed when the runner listened again")
	}
}

// A runner that exits while being activated is not retried until the
// lease's deadline: its lease goes at once, in either lease mode, and the
// mailbox is opened and activated again once it listens.
func TestRunnerGoneDuringActivation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		session bool
		release string
	}{
		{"mailbox mode", false, "admin release audit@p1 5"},
		{"session mode", true, "admin release-leases 1 audit@p1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := retireCase{session: tc.session}.harness(t)
			gate := make(chan struct{})
			h.runner.mu.Lock()
			h.runner.activateGate = gate
			h.runner.mu.Unlock()
			h.assign(1, "audit")
			h.waitEvent(0, "runner activate held audit@p1")
			h.runner.mu.Lock()
			h.runner.activateGate = nil
			h.runner.mu.Unlock()
			h.runner.exit()
			close(gate)
			iRel, rel := h.waitEvent(0, tc.release)
			if !rel.at.Equal(h.t0) {
				t.Fatalf("%q at %v, want at once (t0)", rel.what, rel.at)
			}
			if n := h.ev.count("runner refused activate"); n != 1 {
				t.Fatalf("%d activations tried on the gone runner, want 1:\n%s", n, h.ev)
			}
			h.waitEvent(iRel, "runner refused open")
			h.runner.start()
			_, act := h.waitEvent(iRel, "runner activate audit@p1")
			if !strings.HasPrefix(act.what, "runner activate audit@p1 6 ") {
				t.Fatalf("%q, want epoch 6", act.what)
			}
		})
	}
}
