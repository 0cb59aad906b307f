package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// prismLatency runs the acquire, heartbeat and release phases on size
// nodes, over mutual TLS with identities from certs or in plaintext (nil),
// and returns the acquire p99 through the leader. Every client calls on a
// connection it made before the clock started (in either mode), so the
// figures hold no handshakes.
func prismLatency(ctx context.Context, o options, dir string, size int, certs *certs) (time.Duration, error) {
	// Lease operations alone, as the baselines do them: no xDS translation
	// competing for the same two cores.
	c, err := startPrism(o.prism, dir, size, false, certs)
	if err != nil {
		return 0, err
	}
	defer c.stop()
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lead, err := c.leader(lctx, -1)
	if err != nil {
		return 0, err
	}
	// One proxy per client worker, its runner named for the worker, as one
	// sidecar per runner would be.
	proxies := owningProxies("lat-p", o.concurrency)
	runnerOf := make(map[string]string, len(proxies))
	for w, p := range proxies {
		runnerOf[p] = fmt.Sprintf("w%d", w)
	}
	if err := registerProxies(lctx, c, lead, runnerOf); err != nil {
		return 0, err
	}
	suffix := fmt.Sprintf("_%dn", size)
	type target struct {
		suffix string
		node   int
	}
	targets := []target{{suffix, lead}}
	if size > 1 {
		targets = append(targets, target{suffix + "_via_follower", (lead + 1) % size})
	}
	var acquireP99 time.Duration
	for round, t := range targets {
		// Fresh namespaces for every round, so each acquires mailboxes no
		// one holds, created before the clock starts.
		ps, err := place(ctx, c, lead, namesPerProxy(proxies, fmt.Sprintf("r%d-", round), o.acquirePool), runnerOf)
		if err != nil {
			return 0, fmt.Errorf("latency%s: %w", t.suffix, err)
		}
		placedOn := byProxy(ps)
		pool := make([][]placed, o.concurrency)
		cps := make([]adminv1.ControlPlaneClient, o.concurrency)
		for w, p := range proxies {
			if pool[w] = placedOn[p]; len(pool[w]) == 0 {
				return 0, fmt.Errorf("latency%s: no namespace was placed on proxy %s", t.suffix, p)
			}
			cps[w] = adminv1.NewControlPlaneClient(c.conns.proxy(t.node, p))
		}
		if err := warm(ctx, c, t.node, proxies); err != nil {
			return 0, fmt.Errorf("latency%s: %w", t.suffix, err)
		}
		mb := func(w, i int) placed { return pool[w][i%len(pool[w])] }
		t.suffix += tlsSuffix(certs != nil)
		acquired := make([]int, o.concurrency)
		var regrants atomic.Int64
		commitURL := "http://" + c.http[lead] + "/metrics"
		commitBefore, commitErr := scrapeHistogram(commitURL, "prism_admin_raft_commit_seconds")
		r, rate := phase(o, func(w, i int) (bool, bool) {
			m := mb(w, i)
			if i >= len(pool[w]) {
				regrants.Add(1)
			}
			resp, err := cps[w].AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: m.mailbox, RunnerId: m.runner,
				RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(time.Hour)})
			ok := err == nil && resp.GetGranted()
			if ok {
				acquired[w] = min(i+1, len(pool[w]))
			}
			return ok, true
		})
		report("admin", "acquire", t.suffix, r, rate)
		if round == 0 {
			acquireP99 = r.pct(0.99)
		}
		if n := regrants.Load(); n > 0 {
			// A worker past its pool acquires its own mailboxes again: a
			// reconnect, granted with a new epoch through the same Raft write.
			fmt.Fprintf(os.Stderr, "# admin.acquire%s: %d acquires re-granted a mailbox the worker held (raise -acquire-pool)\n", t.suffix, n)
		}
		if round == 0 && commitErr == nil {
			// Where acquire time goes on the leader: raft commit (append,
			// fsync on leader and a follower, apply) against end to end,
			// over the acquire phase only (not the setup's creates).
			if after, err := scrapeHistogram(commitURL, "prism_admin_raft_commit_seconds"); err == nil {
				if d, err := since(commitBefore, after); err == nil {
					bench("admin.raft_commit_p99_ms"+suffix+tlsSuffix(certs != nil), quantile(d, 0.99)*1000, "ms")
				}
			}
		}
		r, rate = phase(o, func(w, i int) (bool, bool) {
			if acquired[w] == 0 {
				return false, false
			}
			m := mb(w, i%acquired[w])
			resp, err := cps[w].MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: m.mailbox, RunnerId: m.runner})
			return err == nil && resp.GetRenewed(), true
		})
		report("admin", "heartbeat", t.suffix, r, rate)
		r, rate = phase(o, func(w, i int) (bool, bool) {
			if i >= acquired[w] {
				return false, false
			}
			m := mb(w, i)
			resp, err := cps[w].ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: m.mailbox, RunnerId: m.runner})
			return err == nil && resp.GetReleased(), i+1 < acquired[w]
		})
		report("admin", "release", t.suffix, r, rate)
	}
	return acquireP99, nil
}

// warm makes node's connections of proxies (TCP, and the TLS handshake over
// mTLS), or waits for them to reconnect, before a timed phase, with one
// cheap call each.
func warm(ctx context.Context, c *prismCluster, node int, proxies []string) error {
	for _, p := range proxies {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := healthpb.NewHealthClient(c.conns.proxy(node, p)).Check(wctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			return fmt.Errorf("warm the connection of %s to node %d: %w", p, node, err)
		}
	}
	return nil
}

// failover kills the leader -9 repeatedly and measures the time from the
// kill to the first acknowledged write through a surviving node. The writers
// call on connections they had before the kill; the redial to a restarted
// node happens between kills, off the clock.
func failover(ctx context.Context, o options, dir string, certs *certs) error {
	c, err := startPrism(o.prism, dir, 3, true, certs)
	if err != nil {
		return err
	}
	defer c.stop()
	// One proxy per node, written to through that node, and one fresh
	// namespace per kill on each: the first write after a kill is a grant of
	// a mailbox no one holds. A writer's retries of that same mailbox are
	// reconnects of its own runner, granted too.
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	lead, err := c.leader(sctx, -1)
	if err != nil {
		return err
	}
	proxies := owningProxies("fo-p", len(c.nodes))
	runnerOf := make(map[string]string, len(proxies))
	for i, p := range proxies {
		runnerOf[p] = fmt.Sprintf("fo%d", i)
	}
	if err := registerProxies(sctx, c, lead, runnerOf); err != nil {
		return err
	}
	ps, err := place(sctx, c, lead, namesPerProxy(proxies, "fo-", o.kills), runnerOf)
	if err != nil {
		return err
	}
	placedOn := byProxy(ps)
	for _, p := range proxies {
		if len(placedOn[p]) < o.kills {
			return fmt.Errorf("failover: %d namespaces placed on proxy %s, want %d", len(placedOn[p]), p, o.kills)
		}
	}
	for i := range c.nodes {
		if err := warm(sctx, c, i, proxies[i:i+1]); err != nil {
			return err
		}
	}
	var times []time.Duration
	for k := 0; k < o.kills; k++ {
		lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		lead, err := c.leader(lctx, -1)
		cancel()
		if err != nil {
			return fmt.Errorf("kill %d: %w", k, err)
		}
		took, err := killAndWrite(ctx, c, lead, func(i int) (adminv1.ControlPlaneClient, placed, bool) {
			return adminv1.NewControlPlaneClient(c.conns.proxy(i, proxies[i])), placedOn[proxies[i]][k], true
		})
		if err != nil {
			return fmt.Errorf("kill %d: %w", k, err)
		}
		times = append(times, took)
		if err := c.nodes[lead].start(); err != nil {
			return err
		}
		// Let the restarted node rejoin before the next kill so every kill
		// leaves a quorum.
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err = waitCaughtUp(rctx, c, lead)
		if err == nil {
			err = warm(rctx, c, lead, proxies[lead:lead+1])
		}
		cancel()
		if err != nil {
			return fmt.Errorf("kill %d: restart: %w", k, err)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	p := func(q float64) time.Duration { return times[int(q*float64(len(times)-1))] }
	sfx := tlsSuffix(certs != nil)
	bench("admin.failover_p50_ms"+sfx, ms(p(0.5)), "ms")
	bench("admin.failover_p99_ms"+sfx, ms(p(0.99)), "ms")
	bench("admin.failover_max_ms"+sfx, ms(times[len(times)-1]), "ms")
	bench("admin.failover_kills"+sfx, float64(len(times)), "kills")
	return nil
}

// killAndWrite kills node lead -9 and returns the time from the kill to
// the first granted AcquireLease through a survivor: writer(i) names node
// i's client and the mailbox (no one holds it) its writer acquires, or
// false for no writer there. Writers call on connections they had before
// the kill, as clients of a real cluster would.
func killAndWrite(ctx context.Context, c *prismCluster, lead int, writer func(i int) (adminv1.ControlPlaneClient, placed, bool)) (time.Duration, error) {
	t0 := time.Now()
	c.nodes[lead].kill()
	var done atomic.Bool
	var once sync.Once
	var took time.Duration
	var wg sync.WaitGroup
	for i := range c.nodes {
		if i == lead {
			continue
		}
		cp, m, ok := writer(i)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() && time.Since(t0) < 30*time.Second {
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				resp, err := cp.AcquireLease(actx, &adminv1.AcquireLeaseRequest{MailboxId: m.mailbox,
					RunnerId: m.runner, RunnerAddress: "127.0.0.1:9000"})
				cancel()
				if err == nil && resp.GetGranted() {
					once.Do(func() { took = time.Since(t0); done.Store(true) })
				}
			}
		}()
	}
	wg.Wait()
	if !done.Load() {
		return 0, errors.New("no write succeeded within 30s")
	}
	return took, nil
}

func waitCaughtUp(ctx context.Context, c *prismCluster, i int) error {
	adm := adminv1.NewAdminClient(c.conns.operator(i))
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		st, err := adm.GetClusterStatus(sctx, &adminv1.GetClusterStatusRequest{})
		cancel()
		if err == nil && st.GetLeaderId() != "" && st.GetAppliedIndex() > 0 && st.GetAppliedIndex()+5 >= st.GetCommitIndex() {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ctx.Err()
}

// scaleProxies is how many proxies the scale run's leases are placed on.
const scaleProxies = 100

// scale holds many leases on 3 nodes, each heartbeated every second, and
// reports heartbeat latency and the admin processes' CPU, and returns the
// heartbeat p99. Each proxy's leases go over that proxy's own connection
// (made during the ramp, before the heartbeats are timed).
func scale(ctx context.Context, o options, dir string, certs *certs) (time.Duration, error) {
	if o.scaleOneConn && certs != nil {
		// Over mTLS a proxy may renew only its own mailboxes, so one
		// connection cannot speak for them all.
		return 0, errors.New("scale: -scale-one-conn needs -security plaintext")
	}
	c, err := startPrism(o.prism, dir, 3, o.scaleXDS, certs)
	if err != nil {
		return 0, err
	}
	defer c.stop()
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	lead, err := c.leader(lctx, -1)
	cancel()
	if err != nil {
		return 0, err
	}
	term0 := maxTerm(c)
	cps := make(map[string]adminv1.ControlPlaneClient, scaleProxies)
	// The leases spread over scaleProxies proxies, each with its runner; the
	// namespaces are created and their placement read back before the ramp,
	// so its rate is the acquires' alone. Each proxy has its connection, as
	// each sidecar does, unless -scale-one-conn puts them all on one: that
	// costs the leader fewer writes (many answers share one flush) and
	// changes the heartbeat p99 (BENCHMARKS.md), so figures compare only
	// within one layout.
	runnerOf := make(map[string]string, scaleProxies)
	for p := range scaleProxies {
		id := fmt.Sprintf("scale-p%d", p)
		runnerOf[id] = fmt.Sprintf("scale-r%d", p)
		connID := id
		if o.scaleOneConn {
			connID = "scale-shared"
		}
		cps[id] = adminv1.NewControlPlaneClient(c.conns.proxy(lead, connID))
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := registerProxies(sctx, c, lead, runnerOf); err != nil {
		return 0, err
	}
	names := make([]string, o.scaleLeases)
	for i := range names {
		names[i] = fmt.Sprintf("scale-%d", i)
	}
	leases, err := place(sctx, c, lead, names, runnerOf)
	if err != nil {
		return 0, fmt.Errorf("scale: %w", err)
	}
	const workers = 64
	rampStart := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= o.scaleLeases {
					return
				}
				var (
					resp *adminv1.AcquireLeaseResponse
					err  error
				)
				// A sidecar retries an acquire that failed with Unavailable
				// (a leader change during the ramp); so does the ramp.
				for try := 0; try < 5; try++ {
					resp, err = cps[leases[i].proxy].AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: leases[i].mailbox,
						RunnerId: leases[i].runner, RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(5 * time.Second)})
					if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil || !resp.GetGranted() {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%v %v", err, resp.GetRefusal()))
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("scale: %d of %d acquires failed, first: %v", f, o.scaleLeases, firstErr.Load())
	}
	sfx := tlsSuffix(certs != nil)
	bench("admin.scale_acquire_ops_per_s_10k"+sfx, float64(o.scaleLeases)/time.Since(rampStart).Seconds(), "ops/s")
	r := &recorder{}
	var refused atomic.Int64
	cpu0 := make([]int64, len(c.nodes))
	for i, n := range c.nodes {
		cpu0[i] = n.cpuTicks()
	}
	start := time.Now()
	end := start.Add(o.scaleFor)
	var late atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread each worker's leases over the second, like independent
			// sidecars would be.
			offset := time.Duration(rand.Int64N(int64(time.Second)))
			for round := 0; ; round++ {
				due := start.Add(time.Duration(round)*time.Second + offset/time.Duration(workers)*time.Duration(w%workers))
				if due.After(end) {
					return
				}
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				for i := w; i < o.scaleLeases; i += workers {
					t0 := time.Now()
					resp, err := cps[leases[i].proxy].MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: leases[i].mailbox, RunnerId: leases[i].runner})
					if err != nil || !resp.GetRenewed() {
						refused.Add(1)
						continue
					}
					r.add(time.Since(t0))
				}
				if time.Since(due) > time.Second {
					late.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	var total float64
	for i, n := range c.nodes {
		pct := float64(n.cpuTicks()-cpu0[i]) / elapsed
		total += pct
		if i == lead {
			bench("admin.heartbeat_leader_cpu_pct_10k"+sfx, pct, "%")
		}
	}
	bench("admin.heartbeat_cluster_cpu_pct_10k"+sfx, total, "%")
	bench("admin.heartbeat_p50_ms_10k"+sfx, ms(r.pct(0.5)), "ms")
	bench("admin.heartbeat_p99_ms_10k"+sfx, ms(r.pct(0.99)), "ms")
	bench("admin.heartbeat_rate_10k"+sfx, float64(r.n())/elapsed, "heartbeats/s")
	if f := refused.Load(); f > 0 || late.Load() > 0 {
		fmt.Fprintf(os.Stderr, "# scale%s: %d heartbeats failed or refused, %d rounds overran their second\n", sfx, f, late.Load())
	}
	raftStability(c, "scale_10k"+sfx, term0)
	return r.pct(0.99), nil
}
