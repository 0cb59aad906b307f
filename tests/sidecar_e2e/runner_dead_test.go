package sidecare2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// The sidecar's default runner-dead bound with the suites' lease timing:
// three heartbeat intervals, at most half the ttl.
var runnerDeadAfter = min(3*interval, ttl/2)

// kill -9 of the runner while its sidecar lives: the sidecar stops renewing
// and releases the lease itself (cause runner_gone) at its first probe
// after the kill, since the dead runner's control port refuses connections,
// so it serves nothing (TestRunnerExitReleasesLeaseAtOnce has the details),
// long before the admin would expire an unrenewed lease (ttl + grace). A
// standby runner of the same proxy then takes the mailbox. (The namespace does not move to another proxy: the proxy's
// readiness is its registered runner's, and runner-b, which sidecar-b
// registered last, answers; TestRunnerKill9MovesNamespace is the proxy
// whose one runner dies.)
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
	if !e.sidecar.LogHas("runner gone", mailboxID) || !e.sidecar.LogHas("lease released", `"cause":"runner_gone"`, fmt.Sprintf(`"epoch":%d`, epochA)) {
		t.Fatalf("sidecar-a did not give the lease back itself:\n%s", e.sidecar.Tail(30))
	}
	// The next probe is at most one interval (jittered) after the kill,
	// and the release one admin call after it. The second is for polling
	// and scheduling on a loaded machine.
	bound := interval + time.Second
	if d := released.Sub(killed); d > bound {
		t.Errorf("lease released %v after the runner died, want within %v", d, bound)
	}
	if v, err := web.Metric(e.sidecar.HTTPURL(), "prism_sidecar_lease_losses_total", `reason="runner_gone"`); err != nil || v != 1 {
		t.Errorf("runner_gone losses %v %v", v, err)
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

// kill -9 of the only runner of a proxy whose sidecar lives: the sidecar
// reports the runner not ready once it has failed the probe for the bound,
// the admin leaves the proxy out of placement like a stale one, and the
// namespace is served by another proxy's runner. Before that, a SIGSTOP of
// the runner for half the bound moves nothing: same proxy, same lease.
func TestRunnerKill9MovesNamespace(t *testing.T) {
	e := setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epochA := e.heldBy(t, admin, "runner-a", e.runner, 0)
	e.tl.mark("runner-a serving on %s, epoch %d", proxyID, epochA)

	// A second proxy that placement does not prefer for the namespace
	// while proxy-1 is in it, so the namespace moves only when proxy-1
	// leaves.
	other := proxyBeside(namespace, proxyID)
	moved := mesh.MailboxID{Namespace: namespace, Proxy: other}.String()
	runnerC := e2e.StartRunner(t, e2e.RunnerOptions{Name: "runner-c", ProxyID: other, Brokers: e.kafka.Brokers, Args: []string{"--batch-wait", "20ms", "--log-format", "json"}})
	sidecarC := e2e.StartSidecar(t, e2e.SidecarOptions{Name: "sidecar-c", ProxyID: other, RunnerID: "runner-c", Runner: runnerC, Admins: []string{admin.GRPCAddr}, Lease: lease})
	testwait.For(t, 30*time.Second, other+" registered", func() (bool, string) {
		return sidecarC.LogHas("proxy registered"), sidecarC.Tail(3)
	})
	e.tl.mark("%s registered beside %s", other, proxyID)

	pause := runnerDeadAfter / 2
	e.tl.mark("SIGSTOP runner-a for %v (bound %v)", pause, runnerDeadAfter)
	e.runner.Pause()
	time.Sleep(pause)
	e.runner.Resume()
	e.tl.mark("SIGCONT runner-a")
	// Two proxy heartbeats after the resume, each carrying a fresh verdict.
	renewed, _ := renewals(e.sidecar.HTTPURL())
	testwait.For(t, 10*time.Second, "renewed after the resume", func() (bool, string) {
		v, err := renewals(e.sidecar.HTTPURL())
		return v >= renewed+3, fmt.Sprint(v, err)
	})
	if assigned, notReady, err := placedOn(admin); err != nil || assigned != proxyID || notReady {
		t.Fatalf("after a %v pause: namespace on %q, %s runner not ready %v, err %v; want on %s, ready", pause, assigned, proxyID, notReady, err, proxyID)
	}
	if l, err := leaseOf(admin); err != nil || l.GetRunnerId() != "runner-a" || l.GetEpoch() != epochA {
		t.Fatalf("lease after a %v pause: %v %v, want runner-a at epoch %d", pause, l, err, epochA)
	}
	if e.sidecar.LogHas("reporting it not ready") {
		t.Fatalf("a runner paused for less than the bound was reported not ready:\n%s", e.sidecar.Tail(20))
	}
	if code, _, _, _ := mailboxStatsOf(runnerC, moved); code == 200 {
		t.Fatalf("%s serves %s after a pause shorter than the bound", other, moved)
	}

	killed := e.tl.mark("kill -9 runner-a")
	e.runner.Kill()
	var reported, served time.Time
	var epochC uint64
	testwait.For(t, 30*time.Second, "namespace served by runner-c on "+other, func() (bool, string) {
		assigned, notReady, err := placedOn(admin)
		if notReady && reported.IsZero() {
			reported = e.tl.mark("%s reported its runner not ready; namespace on %q", proxyID, assigned)
		}
		l, lerr := leaseOfMailbox(admin, moved)
		if err != nil || lerr != nil || assigned != other || l.GetRunnerId() != "runner-c" {
			return false, fmt.Sprintf("namespace on %q (%s not ready %v, err %v), lease of %s %v (err %v)", assigned, proxyID, notReady, err, moved, l, lerr)
		}
		code, epoch, _, err := mailboxStatsOf(runnerC, moved)
		if code != 200 || epoch != l.GetEpoch() {
			return false, fmt.Sprintf("runner-c stats of %s: %d epoch %d err %v (lease epoch %d)", moved, code, epoch, err, l.GetEpoch())
		}
		epochC, served = epoch, e.tl.mark("runner-c serving %s, epoch %d", moved, epoch)
		return true, ""
	})
	testwait.For(t, ttl+grace+10*time.Second, "runner-a's lease gone", func() (bool, string) {
		l, err := leaseOf(admin)
		return err == nil && l == nil, fmt.Sprintf("lease %v err %v", l, err)
	})
	e.tl.mark("runner-a's lease of %s gone", mailboxID)
	t.Logf("timeline:\n%s", e.tl)

	if !e.sidecar.Alive() {
		t.Fatal("sidecar-a exited; the test is about a sidecar that lives on")
	}
	if reported.IsZero() || !e.sidecar.LogHas("reporting it not ready", fmt.Sprintf(`"runner_dead_after":%d`, runnerDeadAfter.Nanoseconds())) {
		t.Fatalf("sidecar-a did not report its runner not ready past the bound:\n%s", e.sidecar.Tail(30))
	}
	if epochC <= epochA {
		t.Errorf("runner-c serves at epoch %d, not above runner-a's %d", epochC, epochA)
	}
	// The runner answered its last proxy probe at most one interval before
	// the kill; it is reported not ready on the first proxy heartbeat past
	// the bound (one interval apart, after a probe of at most one interval),
	// and the move is one Raft entry, an assignment pushed to sidecar-c, an
	// open and an acquire. The two seconds are for those and for polling on
	// a loaded machine.
	bound := runnerDeadAfter + 3*interval + 2*time.Second
	if d := served.Sub(killed); d > bound {
		t.Errorf("namespace served on %s %v after the runner died, want within %v", other, d, bound)
	}
	if v, err := web.Metric(e.sidecar.HTTPURL(), "prism_sidecar_runner_ready"); err != nil || v != 0 {
		t.Errorf("sidecar-a prism_sidecar_runner_ready %v %v, want 0", v, err)
	}
	fmt.Printf("BENCH sidecar.runner_dead_move_ms %.1f ms\n", float64(served.Sub(killed).Microseconds())/1000)
}

// proxyBeside is a proxy id that placement, over it and owner, does not
// prefer for namespace.
func proxyBeside(namespace, owner string) string {
	for i := 2; ; i++ {
		id := fmt.Sprintf("proxy-%d", i)
		if tab := placement.Compute([]string{owner, id}); tab.Owner(placement.Partition(namespace)) == owner {
			return id
		}
	}
}

// placedOn is the proxy the namespace is assigned to, and whether proxy-1's
// runner is reported not ready, as n sees them (linearizable).
func placedOn(n *e2e.AdminNode) (assigned string, notReady bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lin := adminv1.Consistency_CONSISTENCY_LINEARIZABLE
	ns, err := n.Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: namespace, Consistency: lin})
	if err != nil {
		return "", false, err
	}
	p, err := n.Admin().GetProxy(ctx, &adminv1.GetProxyRequest{ProxyId: proxyID, Consistency: lin})
	if err != nil {
		return "", false, err
	}
	return ns.GetNamespace().GetAssignedProxyId(), p.GetProxy().GetProxy().GetRunnerNotReady(), nil
}
