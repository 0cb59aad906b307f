package sidecare2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// sessionLeases are the leases of proxyID as n lists them (linearizable).
func sessionLeases(n *e2e.AdminNode) ([]*adminv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.Admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		return nil, err
	}
	var out []*adminv1.Lease
	for _, l := range resp.GetLeases() {
		if l.GetProxyId() == proxyID {
			out = append(out, l)
		}
	}
	return out, nil
}

// proxyRoutes counts the routes to proxyID's mailboxes as n lists them.
func proxyRoutes(n *e2e.AdminNode) (int, uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.Admin().ListRoutes(ctx, &adminv1.ListRoutesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		return 0, 0, err
	}
	count := 0
	for _, r := range resp.GetRoutes() {
		if r.GetProxyId() == proxyID {
			count++
		}
	}
	return count, resp.GetIndex(), nil
}

// proxySession is proxyID's one open session as n lists it (linearizable).
func proxySession(n *e2e.AdminNode) (*adminv1.Session, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.Admin().ListSessions(ctx, &adminv1.ListSessionsRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE, ProxyId: proxyID})
	if err != nil {
		return nil, err
	}
	if len(resp.GetSessions()) != 1 {
		return nil, fmt.Errorf("%d sessions of %s: %v", len(resp.GetSessions()), proxyID, resp.GetSessions())
	}
	return resp.GetSessions()[0], nil
}

// leasesValid checks on n that every mailbox in epochs is leased in session
// under its epoch, and that the session holds them all and, on the leader
// (whose lessor has the live expiry), is renewed: it expires ahead of now.
func leasesValid(n *e2e.AdminNode, session uint64, epochs map[string]uint64) error {
	ls, err := sessionLeases(n)
	if err != nil || len(ls) != len(epochs) {
		return fmt.Errorf("%d leases (err %v), want %d", len(ls), err, len(epochs))
	}
	for _, l := range ls {
		if l.GetSessionId() != session || l.GetEpoch() != epochs[l.GetMailboxId()] {
			return fmt.Errorf("lease %v, want session %d epoch %d", l, session, epochs[l.GetMailboxId()])
		}
	}
	st, err := proxySession(n)
	if err != nil {
		return err
	}
	if st.GetId() != session || int(st.GetLeaseCount()) != len(epochs) || !st.GetExpiresAt().AsTime().After(time.Now()) {
		return fmt.Errorf("session %v, want %d holding %d leases and expiring ahead of now", st, session, len(epochs))
	}
	return nil
}

// runnerServes checks that r serves every mailbox in epochs actively under
// its epoch, asking its control API for the stats of all, as the sidecar's
// probe does.
func runnerServes(t *testing.T, r *e2e.Runner, epochs map[string]uint64) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc := e2e.Dial(t, r.PKI, r.ControlAddr, identity.Proxy, r.ProxyID)
	resp, err := runnerv1.NewRunnerControlClient(cc).GetStats(ctx, &runnerv1.GetStatsRequest{})
	if err != nil {
		return fmt.Errorf("runner stats: %w", err)
	}
	active := 0
	for _, m := range resp.GetMailboxes() {
		want, ok := epochs[m.GetMailboxId()]
		if !ok {
			continue
		}
		if m.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || m.GetEpoch() != want {
			return fmt.Errorf("runner has %s %v under epoch %d, want active under %d", m.GetMailboxId(), m.GetState(), m.GetEpoch(), want)
		}
		active++
	}
	if active != len(epochs) {
		return fmt.Errorf("runner serves %d of the %d mailboxes", active, len(epochs))
	}
	return nil
}

// adminCalls is how many calls of method the admin node served, any code.
func adminCalls(n *e2e.AdminNode, method string) float64 {
	v, _ := web.Metric("http://"+n.HTTPAddr, "prism_admin_grpc_requests_total", method+`"`)
	return v
}

// One sidecar with 200 mailboxes holds them in one session: all leased in
// one AcquireLeases call within seconds, renewed by one keepalive per
// interval on the wire (the admin's own call counts), kept across a
// SIGSTOP shorter than ttl, and after kill -9 all ended by the session's
// expiry, which takes their routes away together (never seen in part).
func TestSidecarSession200Mailboxes(t *testing.T) { sessionMailboxes(t, 200) }

// The same with 1,000 mailboxes, a proxy's whole share: still
// one keepalive per interval on the wire, every lease valid throughout,
// all kept across a SIGSTOP of the sidecar shorter than ttl with the
// runner serving each under its epoch, and after kill -9 all 1,000 ended
// in the one Raft entry of the session's expiry, within ttl + grace, with
// no xDS update for them at all (routes are per proxy: docs/architecture.md#routing).
func TestSidecarSession1000Mailboxes(t *testing.T) { sessionMailboxes(t, 1000) }

// createNamespaces creates ns-000 … ns-(n-1) on admin, 16 at a time (one at
// a time, a thousand take 20 s of fsyncs on a loaded machine).
func createNamespaces(t *testing.T, admin *e2e.AdminNode, n int) {
	t.Helper()
	cfg := &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()}
	ctx, cancel := context.WithTimeout(context.Background(), max(60*time.Second, time.Duration(n)*120*time.Millisecond))
	defer cancel()
	names := make(chan string, n)
	for i := range n {
		names <- fmt.Sprintf("ns-%03d", i)
	}
	close(names)
	errs := make(chan error, 16)
	for range 16 {
		go func() {
			var err error
			for ns := range names {
				for {
					cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
					_, err = admin.Control().CreateNamespace(cctx, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: cfg})
					ccancel()
					if status.Code(err) == codes.AlreadyExists {
						err = nil // a retry of one that went through
					}
					if err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil {
					err = fmt.Errorf("create %s: %w", ns, err)
					break
				}
			}
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func sessionMailboxes(t *testing.T, n int) {
	tl := newTimeline()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("timeline:\n%s", tl)
		}
	})
	kafka := kafkatest.Start(t, kafkatest.Topics(1, topic))
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1})
	admin := cluster.Nodes[0]
	createNamespaces(t, admin, n)
	tl.mark("%d namespaces created", n)
	// A memory budget, as a container's limit would set: without one each
	// store takes Badger's default memtables and caches, and a thousand
	// took the runner to 20 GB resident, all of this machine. It must hold
	// the stores' heap, ~6 MiB each at the smallest memtable (4 MiB, not
	// resident until written): under it, GOMEMLIMIT (the budget) has the
	// GC run without end, and the runner missed its probes.
	runner := e2e.StartRunner(t, e2e.RunnerOptions{Name: "runner-a", Brokers: kafka.Brokers,
		Args: []string{"--batch-wait", "20ms", "--log-format", "json", "--memory-budget", fmt.Sprintf("%dMiB", max(1024, 8*n))}})
	started := tl.mark("sidecar started")
	sidecar := startSidecar(t, "sidecar-a", "runner-a", runner, admin.GRPCAddr)

	var session uint64
	epochs := map[string]uint64{}
	testwait.For(t, 60*time.Second, fmt.Sprintf("%d leases held in one session", n), func() (bool, string) {
		ls, err := sessionLeases(admin)
		if err != nil || len(ls) != n {
			return false, fmt.Sprintf("%d leases, err %v", len(ls), err)
		}
		session = ls[0].GetSessionId()
		for _, l := range ls {
			if l.GetSessionId() != session || session == 0 || l.GetRunnerId() != "runner-a" {
				return false, fmt.Sprintf("lease %v not in session %d", l, session)
			}
			epochs[l.GetMailboxId()] = l.GetEpoch()
		}
		return true, ""
	})
	leased := tl.mark("%d leases held in session %d", n, session)
	testwait.For(t, 60*time.Second, "sidecar ready (every mailbox served)", sidecar.Ready)
	ready := tl.mark("sidecar ready")
	// Each store opens before its lease is asked for: at least 25 opens
	// a second, half the rate of a loaded run, and 15 s for a few hundred.
	if d, bound := leased.Sub(started), max(15*time.Second, time.Duration(n)*40*time.Millisecond); d > bound {
		t.Errorf("all %d leases held %v after the sidecar started, want within %v", n, d, bound)
	}
	t.Logf("%d mailboxes: leases held %v and all served %v after the sidecar started", n, leased.Sub(started), ready.Sub(started))
	if v, err := web.Metric(sidecar.HTTPURL(), "prism_sidecar_acquire_batches_total"); err != nil || v != 1 {
		t.Errorf("AcquireLeases batches %v %v, want 1; the sidecar's batches, losses and retries:\n%s", v, err, logLines(sidecar.LogPath, "proxy registered", "batch", "lease lost", "runner unreachable", "session lost", "retrying"))
	}
	if acq, one := adminCalls(admin, "AcquireLeases"), adminCalls(admin, "AcquireLease"); acq != 1 || one != 0 {
		t.Errorf("the admin served %v AcquireLeases and %v AcquireLease, want 1 and 0", acq, one)
	}
	if len(epochs) != n {
		t.Errorf("%d distinct mailboxes leased", len(epochs))
	}
	// The gateway's view: a delta-ADS stream, read from here on.
	xw := watchXDS(t, admin)
	testwait.For(t, 10*time.Second, "the xDS stream's first responses", func() (bool, string) {
		c, err := xw.count()
		return c > 0, fmt.Sprintf("%d responses, stream err %v", c, err)
	})

	// One keepalive per interval (jittered down by up to 20%) on the wire,
	// and no per-mailbox heartbeat.
	window := 10 * interval
	ka0, hb0 := adminCalls(admin, "KeepAliveSession"), adminCalls(admin, "MailboxHeartbeat")
	time.Sleep(window)
	ka, hb := adminCalls(admin, "KeepAliveSession")-ka0, adminCalls(admin, "MailboxHeartbeat")-hb0
	tl.mark("%v keepalives and %v mailbox heartbeats in %v", ka, hb, window)
	if lo, hi := float64(window/interval)-2, float64(window)/float64(interval*8/10)+2; ka < lo || ka > hi || hb != 0 {
		t.Errorf("%v keepalives and %v heartbeats in %v for %d mailboxes, want %v..%v and 0", ka, hb, window, n, lo, hi)
	}
	if err := leasesValid(admin, session, epochs); err != nil {
		t.Errorf("after %v of keepalives: %v", window, err)
	}

	// A pause of the sidecar shorter than ttl: every lease kept, same epochs.
	pause := ttl / 2
	tl.mark("SIGSTOP sidecar for %v", pause)
	sidecar.Pause()
	time.Sleep(pause)
	sidecar.Resume()
	tl.mark("SIGCONT")
	kaResumed := adminCalls(admin, "KeepAliveSession")
	testwait.For(t, 10*time.Second, "keepalives after the resume", func() (bool, string) {
		v := adminCalls(admin, "KeepAliveSession")
		return v >= kaResumed+2, fmt.Sprint(v)
	})
	ls, err := sessionLeases(admin)
	if err != nil || len(ls) != n {
		t.Fatalf("%d leases after a %v pause (err %v), want %d", len(ls), pause, err, n)
	}
	sessionGrace := ls[0].GetGrace().AsDuration()
	for _, l := range ls {
		if l.GetSessionId() != session || l.GetEpoch() != epochs[l.GetMailboxId()] {
			t.Fatalf("lease %v after a %v pause, want session %d epoch %d", l, pause, session, epochs[l.GetMailboxId()])
		}
	}
	if v, _ := web.Metric(sidecar.HTTPURL(), "prism_sidecar_lease_losses_total"); v != 0 {
		t.Fatalf("%v losses after a pause shorter than ttl", v)
	}
	if err := leasesValid(admin, session, epochs); err != nil {
		t.Fatalf("after a %v pause: %v", pause, err)
	}
	if rel, closed, opened := adminCalls(admin, "ReleaseLeases"), adminCalls(admin, "CloseSession"), adminCalls(admin, "OpenSession"); rel != 0 || closed != 0 || opened != 1 {
		t.Errorf("after a %v pause the admin served %v ReleaseLeases, %v CloseSession and %v OpenSession, want 0, 0 and 1", pause, rel, closed, opened)
	}
	if err := runnerServes(t, runner, epochs); err != nil {
		t.Fatalf("after a %v pause of the sidecar: %v", pause, err)
	}
	tl.mark("all %d leases kept and served under their epochs", n)

	// kill -9: nothing renews the session; it expires ttl + grace after the
	// last keepalive, with all its leases in one entry, so the routes are
	// never seen in part.
	killed := tl.mark("kill -9 sidecar")
	sidecar.Kill()
	var gone time.Time
	var partial []string
	testwait.For(t, ttl+grace+10*time.Second, "every route gone", func() (bool, string) {
		count, index, err := proxyRoutes(admin)
		if err != nil {
			return false, err.Error()
		}
		if count != 0 && count != n {
			partial = append(partial, fmt.Sprintf("%d routes at index %d", count, index))
		}
		if count == 0 {
			gone = tl.mark("every route gone at index %d", index)
			return true, ""
		}
		return false, fmt.Sprintf("%d routes", count)
	})
	// Anything the session's expiry sent the gateway would have come by
	// now: xDS is built at once from a changed state.
	time.Sleep(time.Second)
	ups, xerr := xw.since(killed)
	tl.mark("%d xDS responses since the kill (stream err %v)", len(ups), xerr)
	t.Logf("timeline:\n%s", tl)
	if xerr != nil {
		t.Errorf("xDS stream broke: %v", xerr)
	}
	if len(ups) > 0 {
		t.Errorf("the session's expiry sent the gateway %d xDS responses, want none (routes are per proxy):\n%v", len(ups), ups)
	}
	// One expiry, one entry: the admin ended one session with all n
	// leases in the command it committed.
	if v, err := web.Metric("http://"+admin.HTTPAddr, "prism_admin_sessions_ended_total", `reason="expired"`); err != nil || v != 1 {
		t.Errorf("sessions expired %v (err %v), want 1", v, err)
	}
	if v, err := web.Metric("http://"+admin.HTTPAddr, "prism_admin_session_leases_ended_total", `reason="expired"`); err != nil || v != float64(n) {
		t.Errorf("leases ended with the expired session %v (err %v), want %d", v, err, n)
	}
	if len(partial) > 0 {
		t.Errorf("routes seen in part while the session expired: %s", strings.Join(partial, "; "))
	}
	// The last keepalive was sent at most one interval before the kill;
	// a session's grace is the admin's default, not the namespace's.
	if d := gone.Sub(killed); d < ttl+sessionGrace-interval || d > ttl+sessionGrace+2*time.Second {
		t.Errorf("routes gone %v after kill -9, want ttl + grace (%v) after the last keepalive", d, ttl+sessionGrace)
	}
	if ls, err := sessionLeases(admin); err != nil || len(ls) != 0 {
		t.Errorf("%d leases left after the session expired (err %v)", len(ls), err)
	}
	if !admin.LogHas("session expired") {
		t.Error("the admin did not log the session's expiry")
	}
	fmt.Printf("BENCH sidecar.session_acquire_%d_ms %.1f ms\n", n, float64(leased.Sub(started).Microseconds())/1000)
	fmt.Printf("BENCH sidecar.session_ready_%d_ms %.1f ms\n", n, float64(ready.Sub(started).Microseconds())/1000)
	fmt.Printf("BENCH sidecar.session_expiry_routes_%d_ms %.1f ms\n", n, float64(gone.Sub(killed).Microseconds())/1000)
}

// logLines are the lines of the log at path holding any of parts, at most
// 40.
func logLines(path string, parts ...string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, p := range parts {
			if strings.Contains(l, p) && len(out) < 40 {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
