package sidecare2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/testwait"
)

// The sidecar's default runner-dead bound with the suites' lease timing:
// three heartbeat intervals, at most half the ttl.
var runnerDeadAfter = min(3*interval, ttl/2)

// kill -9 of the runner while its sidecar lives: the sidecar stops renewing
// and releases the lease itself (cause runner_unreachable) once the runner
// cannot serve under it: the dead runner never confirms the fence, so that
// is when the deadline it was last handed has passed, at most ttl after its
// last answer, and before the admin would expire an unrenewed lease
// (ttl + grace). A standby runner of the same proxy then takes the
// mailbox. (The namespace does not move to another proxy: placement
// follows the proxies that heartbeat, and this proxy's sidecar still does.)
func TestRunnerKill9ReleasesLease(t *testing.T) {
	e := setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epochA := e.heldBy(t, admin, "runner-a", e.runner, 0)
	e.tl.mark("runner-a serving, epoch %d", epochA)
	runnerB := startRunner(t, "runner-b", e.kafka.Brokers)
	sidecarB := startSidecar(t, "sidecar-b", "runner-b", runnerB, admin.GRPCAddr)
	testwait.For(t, 30*time.Second, "sidecar-b waiting for the lease", func() (bool, string) {
		return sidecarB.LogHas("lease refused"), sidecarB.Tail(3)
	})

	killed := e.tl.mark("kill -9 runner-a")
	e.runner.Kill()
	var released time.Time
	testwait.For(t, ttl+grace+10*time.Second, "runner-a's lease released", func() (bool, string) {
		l, err := leaseOf(admin)
		if err != nil || (l != nil && l.GetRunnerId() == "runner-a") {
			return false, fmt.Sprintf("lease %v err %v", l, err)
		}
		released = e.tl.mark("runner-a's lease gone (now %v)", l)
		return true, ""
	})
	epochB := e.heldBy(t, admin, "runner-b", runnerB, epochA)
	e.tl.mark("runner-b serving, epoch %d", epochB)
	t.Logf("timeline:\n%s", e.tl)

	if !e.sidecar.Alive() {
		t.Fatal("sidecar-a exited; the test is about a sidecar that lives on")
	}
	if !e.sidecar.LogHas("runner unreachable past the bound", mailboxID) || !e.sidecar.LogHas("lease released", `"cause":"runner_unreachable"`, fmt.Sprintf(`"epoch":%d`, epochA)) {
		t.Fatalf("sidecar-a did not give the lease back itself:\n%s", e.sidecar.Tail(30))
	}
	// The runner answered its last probe at most one interval before the
	// kill; it is given up on runnerDeadAfter plus one interval and one
	// probe timeout (one interval) after that answer, and the lease is
	// released once the deadline it was handed then (ttl) has passed. The
	// second is for polling and scheduling on a loaded machine.
	bound := max(runnerDeadAfter+2*interval, ttl) + time.Second
	if d := released.Sub(killed); d > bound || d >= ttl+grace {
		t.Errorf("lease released %v after the runner died, want within %v and before the admin's own expiry (%v)", d, bound, ttl+grace)
	}
	if v, err := web.Metric(e.sidecar.HTTPURL(), "prism_sidecar_lease_losses_total", `reason="runner_unreachable"`); err != nil || v != 1 {
		t.Errorf("runner_unreachable losses %v %v", v, err)
	}
	fmt.Printf("BENCH sidecar.runner_dead_release_ms %.1f ms\n", float64(released.Sub(killed).Microseconds())/1000)
}

// A runner paused (SIGSTOP) for less than the runner-dead bound, and longer
// than a probe's timeout (one interval), keeps its lease: same epoch after
// SIGCONT, still renewed, nothing lost or released.
func TestRunnerPausedKeepsLease(t *testing.T) {
	e := setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epoch := e.heldBy(t, admin, "runner-a", e.runner, 0)
	base := e.sidecar.HTTPURL()
	pause := runnerDeadAfter / 2
	e.tl.mark("SIGSTOP runner-a for %v (bound %v)", pause, runnerDeadAfter)
	e.runner.Pause()
	time.Sleep(pause)
	e.runner.Resume()
	e.tl.mark("SIGCONT runner-a")
	renewed, _ := renewals(base)
	testwait.For(t, 10*time.Second, "heartbeats renewed after the resume", func() (bool, string) {
		v, err := renewals(base)
		return v >= renewed+3, fmt.Sprint(v, err)
	})
	e.tl.mark("renewed again")
	t.Logf("timeline:\n%s", e.tl)
	if l, err := leaseOf(admin); err != nil || l.GetRunnerId() != "runner-a" || l.GetEpoch() != epoch {
		t.Fatalf("lease after a %v pause: %v %v, want runner-a at epoch %d", pause, l, err, epoch)
	}
	if code, served, _, err := mailboxStats(e.runner); code != 200 || served != epoch {
		t.Fatalf("runner-a after the resume: %d epoch %d err %v, want serving epoch %d", code, served, err, epoch)
	}
	if v, _ := web.Metric(base, "prism_sidecar_lease_losses_total"); v != 0 {
		t.Fatalf("%v losses after a pause shorter than the bound", v)
	}
	if e.sidecar.LogHas("runner unreachable past the bound") || e.sidecar.LogHas("lease released") {
		t.Fatalf("a runner paused for less than the bound lost its lease:\n%s", e.sidecar.Tail(20))
	}
}
