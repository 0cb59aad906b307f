package sidecare2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/testwait"
)

// A runner that exits under a live sidecar, stopped (SIGTERM) or killed
// (kill -9), in either lease mode: its control port refuses connections,
// so the sidecar knows it serves nothing and gives its lease back at the
// first probe, well before the deadline it had handed the runner (at least
// ttl - interval after the exit, which is when the lease went before), and
// the admin lists neither lease nor route. Started again on the same
// address and data, the runner is opened, acquired and served under a new
// epoch within a couple of seconds of listening, on its old store. (A
// paused runner, SIGSTOP, keeps its listening socket and is never taken for
// gone: TestRunnerPausedKeepsLease, TestRunnerPausedPastBoundNeverServesStale.)
func TestRunnerExitReleasesLeaseAtOnce(t *testing.T) {
	for _, mode := range []string{"session", "mailbox"} {
		for _, how := range []string{"SIGTERM", "kill -9"} {
			t.Run(mode+" mode "+how, func(t *testing.T) { runnerExit(t, mode, how) })
		}
	}
}

func runnerExit(t *testing.T, mode, how string) {
	e := setup(t, 1, grpcAddrs, "--lease-mode", mode)
	admin := e.admins[0]
	epochA := e.heldBy(t, admin, "runner-a", e.runner, 0)
	e.tl.mark("runner-a serving, epoch %d (%s mode)", epochA, mode)
	const n = 20
	e.kafka.ProduceEnvelopes(t, topic, envelopes("ev", n)...)
	testwait.For(t, 30*time.Second, "events stored", func() (bool, string) {
		_, _, stored, err := mailboxStats(e.runner)
		return stored == n, fmt.Sprint(stored, err)
	})

	e.tl.mark("%s runner-a", how)
	if how == "SIGTERM" {
		if err := e.runner.Term(10 * time.Second); err != nil {
			t.Fatalf("runner stop: %v", err)
		}
	} else {
		e.runner.Kill()
	}
	exited := e.tl.mark("runner-a exited")
	var released time.Time
	testwait.For(t, ttl+grace+10*time.Second, "runner-a's lease and route gone", func() (bool, string) {
		l, err1 := leaseOf(admin)
		r, err2 := route(admin)
		if err1 != nil || err2 != nil || l != nil || r != nil {
			return false, fmt.Sprintf("lease %v route %v errs %v %v", l, r, err1, err2)
		}
		released = e.tl.mark("lease and route gone")
		return true, ""
	})
	if !e.sidecar.Alive() {
		t.Fatalf("the sidecar exited; the test is about a sidecar that lives on:\n%s", e.sidecar.Tail(30))
	}
	// The runner took an extension at most one interval before it exited,
	// so the deadline it was handed lies at least ttl - interval past the
	// exit: a release after that is the runner waited out, not known gone.
	if d, old := released.Sub(exited), ttl-interval; d >= old {
		t.Errorf("lease released %v after the runner exited, want before its old deadline (>= %v)", d, old)
	}
	if !e.sidecar.LogHas("runner gone", mailboxID) || !e.sidecar.LogHas("lease released", `"cause":"runner_gone"`, fmt.Sprintf(`"epoch":%d`, epochA)) {
		t.Fatalf("the sidecar did not give the lease back as its runner's being gone:\n%s", e.sidecar.Tail(30))
	}
	if v, err := web.Metric(e.sidecar.HTTPURL(), "prism_sidecar_lease_losses_total", `reason="runner_gone"`); err != nil || v != 1 {
		t.Errorf("runner_gone losses %v %v, want 1", v, err)
	}

	e.tl.mark("runner-a started again")
	e.runner.Restart()
	var listening time.Time
	testwait.For(t, 30*time.Second, "runner-a /healthz", func() (bool, string) {
		code, _, _, err := web.Get(e.runner.HTTPURL() + "/healthz")
		if err != nil || code != 200 {
			return false, fmt.Sprint(code, err)
		}
		listening = e.tl.mark("runner-a answers /healthz")
		return true, ""
	})
	epochA2 := e.heldBy(t, admin, "runner-a", e.runner, epochA)
	served := e.tl.mark("runner-a serving again, epoch %d", epochA2)
	t.Logf("timeline:\n%s", e.tl)
	if d := served.Sub(listening); d > 3*time.Second {
		t.Errorf("served again %v after the runner listened, want within 3s (reconnects are at most 500ms apart)", d)
	}
	if _, _, stored, err := mailboxStats(e.runner); err != nil || stored != n {
		t.Errorf("after the restart the runner serves %d events (err %v), want its store's %d", stored, err, n)
	}
	fmt.Printf("BENCH sidecar.runner_gone_release_ms %.1f ms\n", float64(released.Sub(exited).Microseconds())/1000)
	fmt.Printf("BENCH sidecar.runner_back_served_ms %.1f ms\n", float64(served.Sub(listening).Microseconds())/1000)
}
