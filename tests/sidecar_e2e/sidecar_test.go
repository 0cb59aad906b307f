package sidecare2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/faultproxy"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// env is one admin cluster, one broker and one runner with its sidecar.
type env struct {
	admins  []*e2e.AdminNode
	kafka   *kafkatest.Cluster
	runner  *e2e.Runner
	sidecar *e2e.Sidecar
	tl      *timeline
	started time.Time
}

// setup starts the env, its sidecar with sidecarArgs added to its flags.
func setup(t *testing.T, admins int, endpoints func([]*e2e.AdminNode) []string, sidecarArgs ...string) *env {
	t.Helper()
	e := &env{kafka: kafkatest.Start(t, kafkatest.Topics(2, topic)), tl: newTimeline()}
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: admins})
	e.admins = cluster.Nodes
	cluster.CreateNamespace(30*time.Second, namespace, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
	e.runner = startRunner(t, "runner-a", e.kafka.Brokers)
	eps := endpoints(e.admins)
	e.started = e.tl.mark("sidecar started")
	e.sidecar = e2e.StartSidecar(t, e2e.SidecarOptions{Name: "sidecar-a", ProxyID: proxyID, RunnerID: "runner-a", Runner: e.runner, Admins: eps, Lease: lease, Args: sidecarArgs})
	return e
}

func grpcAddrs(ns []*e2e.AdminNode) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.GRPCAddr)
	}
	return out
}

// heldBy waits until the admin shows the lease held by runnerID and the
// runner serving under its epoch; it returns the epoch.
func (e *env) heldBy(t *testing.T, n *e2e.AdminNode, runnerID string, r *e2e.Runner, after uint64) uint64 {
	t.Helper()
	var epoch uint64
	testwait.For(t, 30*time.Second, "lease held by "+runnerID+" and served", func() (bool, string) {
		l, err := leaseOf(n)
		if err != nil || l == nil || l.GetRunnerId() != runnerID || l.GetEpoch() <= after {
			return false, fmt.Sprintf("lease %v err %v", l, err)
		}
		code, served, _, err := mailboxStats(r)
		if code != 200 || served != l.GetEpoch() {
			return false, fmt.Sprintf("runner stats %d epoch %d (lease epoch %d) err %v", code, served, l.GetEpoch(), err)
		}
		epoch = l.GetEpoch()
		return true, ""
	})
	return epoch
}

// Start → lease held, route to the runner, events flow; SIGTERM → the
// runner drains and commits, then the lease and route are gone, in < 5 s.
func TestSidecarStartAndSIGTERM(t *testing.T) {
	for _, size := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d admin nodes", size), func(t *testing.T) { startAndSIGTERM(t, size) })
	}
}

func startAndSIGTERM(t *testing.T, size int) {
	e := setup(t, size, grpcAddrs)
	// Reads go to the leader so that linearizable reads see the release.
	admin := awaitLeader(t, e.admins...)
	epoch := e.heldBy(t, admin, "runner-a", e.runner, 0)
	held := e.tl.mark("lease held, epoch %d", epoch)
	rt, err := route(admin)
	if err != nil || rt == nil || rt.GetRunnerAddress() != e.runner.QueryAddr || rt.GetEpoch() != epoch {
		t.Fatalf("route %v (err %v), want %s at epoch %d", rt, err, e.runner.QueryAddr, epoch)
	}
	testwait.For(t, 10*time.Second, "sidecar ready", e.sidecar.Ready)

	const n = 200
	e.kafka.ProduceEnvelopes(t, topic, envelopes("ev", n)...)
	testwait.For(t, 30*time.Second, "events stored", func() (bool, string) {
		_, _, stored, err := mailboxStats(e.runner)
		return stored == n, fmt.Sprint(stored, err)
	})

	sent := e.tl.mark("SIGTERM to the sidecar")
	if err := e.sidecar.Term(5 * time.Second); err != nil {
		t.Fatalf("sidecar stop: %v", err)
	}
	exited := e.tl.mark("sidecar exited")
	var gone time.Time
	testwait.For(t, 5*time.Second, "lease and route gone", func() (bool, string) {
		l, err1 := leaseOf(admin)
		r, err2 := route(admin)
		if err1 != nil || err2 != nil || l != nil || r != nil {
			return false, fmt.Sprintf("lease %v route %v errs %v %v", l, r, err1, err2)
		}
		gone = e.tl.mark("lease and route gone")
		return true, ""
	})
	t.Logf("timeline:\n%s", e.tl)
	if d := gone.Sub(sent); d >= 5*time.Second {
		t.Fatalf("release took %v, want < 5s", d)
	}
	if d := exited.Sub(sent); d >= 5*time.Second {
		t.Fatalf("sidecar exit took %v", d)
	}
	if got := e.kafka.Committed(t, mailboxID, topic); got != n {
		t.Fatalf("committed offsets sum to %d, want %d: the drain must commit before the release", got, n)
	}
	testwait.For(t, 5*time.Second, "runner no longer serving the released mailbox", func() (bool, string) {
		code, _, _, err := mailboxStats(e.runner)
		return code == 404, fmt.Sprint(code, err)
	})
	// One lease: released on its own, or in session mode its session closed.
	released := e.sidecar.LogHas("lease released", mailboxID) || e.sidecar.LogHas("session closed", `"leases":1`)
	if !e.sidecar.LogHas("runner drained") || !released {
		t.Fatalf("sidecar log lacks the drain or the release:\n%s", e.sidecar.Tail(30))
	}
	// From the sidecar's first log line to the runner serving under the
	// lease, by the sidecar's own clock: register, watch, open, acquire,
	// activate.
	start, ok1 := e.sidecar.LogTime("sidecar starting")
	serving, ok2 := e.sidecar.LogTime("runner serving under the lease")
	if !ok1 || !ok2 {
		t.Fatal("sidecar log lacks its start or the activation")
	}
	for _, msg := range []string{"proxy registered", "mailbox assigned", "lease acquired", "runner serving under the lease"} {
		if at, ok := e.sidecar.LogTime(msg); ok {
			t.Logf("sidecar start + %6.1f ms: %s", float64(at.Sub(start).Microseconds())/1000, msg)
		}
	}
	if size != 1 {
		return
	}
	fmt.Printf("BENCH sidecar.acquire_ms %.1f ms\n", float64(serving.Sub(start).Microseconds())/1000)
	fmt.Printf("BENCH sidecar.acquire_from_exec_ms %.1f ms\n", float64(held.Sub(e.started).Microseconds())/1000)
	fmt.Printf("BENCH sidecar.release_ms %.1f ms\n", float64(gone.Sub(sent).Microseconds())/1000)
}

// kill -9 the sidecar: the runner stops serving on its own within ttl of the
// last acknowledged heartbeat, and another runner gets the lease only after
// ttl + grace, with a newer epoch. The holder always stops first.
func TestSidecarKill9FencesBeforeRegrant(t *testing.T) {
	e := setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epochA := e.heldBy(t, admin, "runner-a", e.runner, 0)
	e.tl.mark("runner-a serving, epoch %d", epochA)
	runnerB := startRunner(t, "runner-b", e.kafka.Brokers)

	killed := e.tl.mark("kill -9 sidecar-a")
	e.sidecar.Kill()
	sidecarB := startSidecar(t, "sidecar-b", "runner-b", runnerB, admin.GRPCAddr)

	var fenced, granted time.Time
	var epochB uint64
	testwait.For(t, ttl+grace+15*time.Second, "runner-a fenced and lease re-granted to runner-b", func() (bool, string) {
		if fenced.IsZero() {
			if code, _, _, _ := mailboxStats(e.runner); code == 404 {
				fenced = e.tl.mark("runner-a stopped serving")
			}
		}
		if granted.IsZero() {
			if l, err := leaseOf(admin); err == nil && l != nil && l.GetRunnerId() == "runner-b" {
				granted, epochB = e.tl.mark("lease granted to runner-b, epoch %d", l.GetEpoch()), l.GetEpoch()
			}
		}
		return !fenced.IsZero() && !granted.IsZero(), fmt.Sprintf("fenced %v granted %v", !fenced.IsZero(), !granted.IsZero())
	})
	e.heldBy(t, admin, "runner-b", runnerB, epochA)
	e.tl.mark("runner-b serving, epoch %d", epochB)
	t.Logf("timeline:\n%s", e.tl)

	// ttl after the last acknowledged send, which precedes the kill; the
	// slack is for polling and scheduling on a loaded machine.
	if d := fenced.Sub(killed); d > ttl+time.Second {
		t.Errorf("runner-a kept serving %v after its sidecar died, want within ttl %v", d, ttl)
	}
	if !fenced.Before(granted) {
		t.Errorf("runner-a fenced at %v, not before the re-grant at %v", fenced.Sub(killed), granted.Sub(killed))
	}
	// The last heartbeat was acknowledged at most one interval before the
	// kill, so the admin may not expire the lease before ttl + grace after it.
	if d, min := granted.Sub(killed), ttl+grace-interval-100*time.Millisecond; d < min {
		t.Errorf("lease re-granted %v after the kill, before ttl + grace (at least %v)", d, min)
	}
	if epochB <= epochA {
		t.Errorf("epoch %d after %d: must grow", epochB, epochA)
	}
	if v, err := web.Metric(e.runner.HTTPURL(), "prism_runner_fences_total", `reason="deadline_passed"`); err != nil || v != 1 {
		t.Errorf("runner-a fences by deadline: %v %v", v, err)
	}
	if !sidecarB.LogHas("lease refused", "HELD_BY_OTHER") {
		t.Errorf("sidecar-b never saw the lease held by runner-a:\n%s", sidecarB.Tail(20))
	}
	fmt.Printf("BENCH sidecar.fence_ms %.1f ms\n", float64(fenced.Sub(killed).Microseconds())/1000)
	fmt.Printf("BENCH sidecar.regrant_ms %.1f ms\n", float64(granted.Sub(killed).Microseconds())/1000)
}

// The admin unreachable (blackholed) for less than ttl interrupts nothing;
// for longer, the runner is fenced, and it serves again under a new epoch
// once the admin is back.
func TestSidecarAdminPartition(t *testing.T) {
	var fp *faultproxy.Proxy
	e := setup(t, 1, func(ns []*e2e.AdminNode) []string {
		p, err := faultproxy.New("127.0.0.1:0", ns[0].GRPCAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		fp = p
		return []string{p.Addr()}
	})
	admin := e.admins[0]
	epoch := e.heldBy(t, admin, "runner-a", e.runner, 0)
	base := e.sidecar.HTTPURL()

	short := ttl / 2
	e.tl.mark("blackhole for %v", short)
	fp.Blackhole()
	end := time.Now().Add(short)
	for time.Now().Before(end) {
		if code, served, _, err := mailboxStats(e.runner); code != 200 || served != epoch {
			t.Fatalf("runner interrupted during a %v partition: %d epoch %d err %v", short, code, served, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	fp.Restore()
	e.tl.mark("restored")
	// A few heartbeats after the restore, still the same lease, no loss.
	hbs, _ := renewals(base)
	testwait.For(t, 10*time.Second, "heartbeats renewed again", func() (bool, string) {
		v, err := renewals(base)
		return v >= hbs+3, fmt.Sprint(v, err)
	})
	if l, err := leaseOf(admin); err != nil || l.GetEpoch() != epoch {
		t.Fatalf("lease after a short partition: %v %v, want epoch %d", l, err, epoch)
	}
	if v, _ := web.Metric(base, "prism_sidecar_lease_losses_total"); v != 0 {
		t.Fatalf("%v losses after a partition shorter than ttl", v)
	}

	long := ttl + 2*time.Second
	cut := e.tl.mark("blackhole for %v", long)
	fp.Blackhole()
	var fenced time.Time
	testwait.For(t, long, "runner fenced", func() (bool, string) {
		code, _, _, err := mailboxStats(e.runner)
		if code == 404 {
			fenced = e.tl.mark("runner fenced")
		}
		return code == 404, fmt.Sprint(code, err)
	})
	// The runner's own deadline and the sidecar's timer both fire at ttl
	// after the last acknowledged send; either may come first.
	testwait.For(t, 5*time.Second, "sidecar not ready while fenced", func() (bool, string) {
		ok, got := e.sidecar.Ready()
		return !ok, got
	})
	if d := fenced.Sub(cut); d > ttl+time.Second {
		t.Fatalf("fenced %v after the cut, want within ttl", d)
	}
	time.Sleep(time.Until(cut.Add(long)))
	fp.Restore()
	e.tl.mark("restored")
	epoch2 := e.heldBy(t, admin, "runner-a", e.runner, epoch)
	e.tl.mark("serving again, epoch %d", epoch2)
	testwait.For(t, 10*time.Second, "sidecar ready again", e.sidecar.Ready)
	t.Logf("timeline:\n%s", e.tl)
	if v, err := web.Metric(base, "prism_sidecar_lease_losses_total", `reason="ttl_elapsed"`); err != nil || v < 1 {
		t.Fatalf("ttl_elapsed losses %v %v", v, err)
	}
	if !e.sidecar.LogHas("lease lost; fencing the runner", "ttl_elapsed", mailboxID) {
		t.Fatal("the loss is not logged with its reason")
	}
}

// Three admin nodes; the leader is killed: heartbeats go on through the
// others and the runner is never interrupted.
func TestSidecarAdminLeaderKilled(t *testing.T) {
	e := setup(t, 3, grpcAddrs)
	epoch := e.heldBy(t, awaitLeader(t, e.admins...), "runner-a", e.runner, 0)
	base := e.sidecar.HTTPURL()
	// Under load a fast-timing cluster's leadership may move while the
	// lease is taken: the one killed is whoever leads now.
	leader := awaitLeader(t, e.admins...)
	before, _ := renewals(base)
	killed := e.tl.mark("kill -9 leader %s", leader.ID)
	leader.Kill()
	var survivors []*e2e.AdminNode
	for _, n := range e.admins {
		if n != leader {
			survivors = append(survivors, n)
		}
	}
	watch := 2 * ttl
	var mid float64
	for time.Since(killed) < watch {
		if mid == 0 && time.Since(killed) >= ttl {
			mid, _ = renewals(base)
			e.tl.mark("renewed heartbeats at kill + ttl: %v", mid)
		}
		if code, served, _, err := mailboxStats(e.runner); code != 200 || served != epoch {
			t.Fatalf("runner interrupted %v after the leader died: %d epoch %d err %v\n%s", time.Since(killed), code, served, err, e.tl)
		}
		time.Sleep(25 * time.Millisecond)
	}
	after, _ := renewals(base)
	e.tl.mark("renewed heartbeats %v → %v", before, after)
	// On a loaded machine the survivors' leadership can flap for a moment
	// (fast raft timing); what matters is that one of them leads.
	var newLeader *e2e.AdminNode
	testwait.For(t, 15*time.Second, "a survivor leads", func() (bool, string) {
		newLeader = e2e.Leader(survivors...)
		return newLeader != nil, "no survivor reports Leader"
	})
	e.tl.mark("new leader %s", newLeader.ID)
	t.Logf("timeline:\n%s", e.tl)
	// Renewals in the second ttl after the kill come from the new leader:
	// the old one is dead, and every lease would have been fenced by then.
	if after < mid+float64(ttl/interval)/2 {
		t.Fatalf("renewed heartbeats %v at kill, %v at kill + ttl, %v at kill + 2 ttl: heartbeats did not continue", before, mid, after)
	}
	if v, _ := web.Metric(base, "prism_sidecar_lease_losses_total"); v != 0 {
		t.Fatalf("%v losses across a leader change", v)
	}
	l, err := leaseOf(newLeader)
	if err != nil || l.GetEpoch() != epoch || l.GetRunnerId() != "runner-a" {
		t.Fatalf("lease on the new leader %v %v, want epoch %d", l, err, epoch)
	}
	if !strings.Contains(e.tl.String(), "new leader") {
		t.Fatal("timeline incomplete")
	}
}

// Deleting the namespace unassigns the mailbox: the runner drains and
// commits, then the lease and route go, and the sidecar stays ready (it
// holds every lease it is assigned: none).
func TestSidecarUnassign(t *testing.T) {
	e := setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epoch := e.heldBy(t, admin, "runner-a", e.runner, 0)
	const n = 50
	e.kafka.ProduceEnvelopes(t, topic, envelopes("un", n)...)
	testwait.For(t, 30*time.Second, "events stored", func() (bool, string) {
		_, _, stored, err := mailboxStats(e.runner)
		return stored == n, fmt.Sprint(stored, err)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.Control().DeleteNamespace(ctx, &adminv1.DeleteNamespaceRequest{Namespace: namespace}); err != nil {
		t.Fatal(err)
	}
	e.tl.mark("namespace deleted")
	testwait.For(t, 10*time.Second, "lease, route and mailbox gone", func() (bool, string) {
		l, err1 := leaseOf(admin)
		r, err2 := route(admin)
		code, _, _, _ := mailboxStats(e.runner)
		return l == nil && r == nil && code == 404 && err1 == nil && err2 == nil, fmt.Sprintf("lease %v route %v runner %d", l, r, code)
	})
	e.tl.mark("lease, route and mailbox gone")
	t.Logf("timeline:\n%s", e.tl)
	if got := e.kafka.Committed(t, mailboxID, topic); got != n {
		t.Fatalf("committed %d, want %d", got, n)
	}
	if !e.sidecar.LogHas("lease released", `"cause":"unassigned"`, fmt.Sprintf(`"epoch":%d`, epoch)) {
		t.Fatalf("no release logged:\n%s", e.sidecar.Tail(20))
	}
	testwait.For(t, 5*time.Second, "sidecar ready with nothing assigned", e.sidecar.Ready)
}

// awaitLeader waits until one of nodes reports that it leads, and returns it.
func awaitLeader(t *testing.T, nodes ...*e2e.AdminNode) *e2e.AdminNode {
	t.Helper()
	var leader *e2e.AdminNode
	testwait.For(t, 30*time.Second, "an admin node leads", func() (bool, string) {
		leader = e2e.Leader(nodes...)
		return leader != nil, "no node reports Leader"
	})
	return leader
}
