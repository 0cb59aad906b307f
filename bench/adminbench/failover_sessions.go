package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Failover with leases held in sessions: S sessions of 1,000
// leases each (bulk grants), every one keeping alive every 5 s through
// whichever node answers, as a sidecar with all the admin endpoints does.
// Each round kills the leader -9, times the first acknowledged write
// through a survivor (a per-mailbox AcquireLease of a mailbox no one holds,
// as the failover part does), restarts the old leader, then waits past
// kill + ttl + grace + the election timeout, by when a lease the new leader
// failed to keep would have expired, and counts the leases still held.

const failoverSessionLeases = 1000

func failoverSessions(ctx context.Context, o options, dir string, certs *certs) error {
	nSessions := max(1, o.failoverLeases/failoverSessionLeases)
	if nSessions > maxOwningProxies {
		return fmt.Errorf("failover-sessions: %d sessions need more than %d proxies", nSessions, maxOwningProxies)
	}
	total := nSessions * failoverSessionLeases
	size := sizeName(total)
	limit := total + 3*o.failoverKills + 1000
	args := []string{"--max-namespaces", strconv.Itoa(limit), "--max-leases", strconv.Itoa(limit),
		"--max-leases-per-proxy", strconv.Itoa(failoverSessionLeases + o.failoverKills)}
	if o.failoverTrace {
		args = append(args, "--log-level", "info")
	}
	c, err := startPrism(o.prism, dir, 3, false, certs, append(args, o.sessionAdminArgs...)...)
	if err != nil {
		return err
	}
	defer c.stop()
	setup, cancel := context.WithTimeout(ctx, o.sessionSetup)
	defer cancel()
	lead, err := c.leader(setup, -1)
	if err != nil {
		return err
	}
	proxies := owningProxies("fos-p", max(nSessions, 3))
	runnerOf := make(map[string]string, len(proxies))
	want := make(map[string]int, len(proxies))
	for i, p := range proxies {
		runnerOf[p] = fmt.Sprintf("fos-r%d", i)
		if i < nSessions {
			want[p] = failoverSessionLeases
		}
		if i < 3 {
			// The first three are also the writers, one mailbox a kill.
			want[p] += o.failoverKills
		}
	}
	if err := registerProxies(setup, c, lead, runnerOf); err != nil {
		return err
	}
	t0 := time.Now()
	ps, err := place(setup, c, lead, namesWanted(proxies[1:], proxies[0], want), runnerOf)
	if err != nil {
		return fmt.Errorf("failover-sessions: %w", err)
	}
	fmt.Fprintf(os.Stderr, "# failover-sessions: %d namespaces created and placed in %.1fs\n", len(ps), time.Since(t0).Seconds())
	placedOn := byProxy(ps)
	for p, n := range want {
		if len(placedOn[p]) != n {
			return fmt.Errorf("failover-sessions: %d namespaces placed on proxy %s, want %d", len(placedOn[p]), p, n)
		}
	}
	for i := range c.nodes {
		if err := warm(setup, c, i, proxies); err != nil {
			return err
		}
	}
	ss := make([]*failoverSession, nSessions)
	for i := range ss {
		p := proxies[i]
		s := &failoverSession{session: session{proxy: p, runner: runnerOf[p], cl: adminv1.NewSessionsClient(c.conns.proxy(lead, p))}, pref: lead}
		for _, m := range placedOn[p][:failoverSessionLeases] {
			s.mailboxes = append(s.mailboxes, m.mailbox)
		}
		for n := range c.nodes {
			s.clients = append(s.clients, adminv1.NewSessionsClient(c.conns.proxy(n, p)))
		}
		ss[i] = s
	}
	runCtx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopAll(); wg.Wait() }()
	var refused atomic.Int64
	grantStart := time.Now()
	for _, s := range ss {
		if err := s.open(setup, o.sessionTTL); err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.keepAliveAny(runCtx, o.sessionKeepAlive, &refused) }()
		if err := s.acquire(setup); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "# failover-sessions: %d sessions x %d leases granted in %.1fs\n", nSessions, failoverSessionLeases, time.Since(grantStart).Seconds())
	held, grace, err := sessionLeasesHeld(setup, c, ss)
	if err != nil {
		return err
	}
	if held != total {
		return fmt.Errorf("failover-sessions: %d leases held before any kill, want %d", held, total)
	}
	// Past this after a kill, a lease the new leader did not keep has
	// expired: the successor gives every session ttl plus the election
	// timeout (at most 1 s with --raft-timing fast), then grace.
	settle := o.sessionTTL + grace + 2*time.Second

	var times []time.Duration
	lost := 0
	for k := 0; k < o.failoverKills; k++ {
		lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		lead, err := c.leader(lctx, -1)
		cancel()
		if err != nil {
			return fmt.Errorf("kill %d: %w", k, err)
		}
		killed := time.Now()
		took, err := killAndWrite(ctx, c, lead, func(i int) (adminv1.ControlPlaneClient, placed, bool) {
			return adminv1.NewControlPlaneClient(c.conns.proxy(i, proxies[i])), placedOn[proxies[i]][want[proxies[i]]-o.failoverKills+k], true
		})
		if err != nil {
			return fmt.Errorf("kill %d: %w", k, err)
		}
		times = append(times, took)
		if err := c.nodes[lead].start(); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = waitCaughtUp(rctx, c, lead)
		if err == nil {
			err = warm(rctx, c, lead, proxies)
		}
		cancel()
		if err != nil {
			return fmt.Errorf("kill %d: restart: %w", k, err)
		}
		time.Sleep(time.Until(killed.Add(settle)))
		now, _, err := sessionLeasesHeld(ctx, c, ss)
		if err != nil {
			return fmt.Errorf("kill %d: %w", k, err)
		}
		fmt.Fprintf(os.Stderr, "# failover-sessions: kill %d of node %d: first write %.1f ms, %d leases held %.1fs after the kill\n",
			k, lead, ms(took), now, time.Since(killed).Seconds())
		if o.failoverTrace {
			var logs []string
			for i, n := range c.nodes {
				if i != lead {
					logs = append(logs, n.log)
				}
			}
			t, err := traceFailover(logs, killed)
			if err != nil {
				return fmt.Errorf("kill %d: trace: %w", k, err)
			}
			fmt.Fprintf(os.Stderr, "# failover-sessions: kill %d: %s, first write %.1f ms\n", k, t, ms(took))
		}
		lost += held - now
		held = now
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	p := func(q float64) time.Duration { return times[int(q*float64(len(times)-1))] }
	bench("admin.failover_p50_ms_"+size, ms(p(0.5)), "ms")
	bench("admin.failover_p99_ms_"+size, ms(p(0.99)), "ms")
	bench("admin.failover_max_ms_"+size, ms(times[len(times)-1]), "ms")
	bench("admin.failover_kills_"+size, float64(len(times)), "kills")
	bench("admin.failover_leases_lost_"+size, float64(lost), "leases")
	if f := refused.Load(); f > 0 {
		fmt.Fprintf(os.Stderr, "# failover-sessions: %d keepalives refused (expired or unknown session)\n", f)
	}
	return nil
}

// failoverSession is a session that keeps alive through any node.
type failoverSession struct {
	session
	clients []adminv1.SessionsClient
	// pref is the node that answered last.
	pref int
}

// keepAliveAny renews every interval from a random phase until ctx ends,
// trying the nodes in turn from the one that answered last until one
// renews or the next keepalive is due. Refusals (the session expired or
// unknown) are counted: a session that lost its leases.
func (s *failoverSession) keepAliveAny(ctx context.Context, every time.Duration, refused *atomic.Int64) {
	due := time.Now().Add(time.Duration(rand.Int64N(int64(every))))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(due)):
		}
		due = due.Add(every)
		for try := 0; time.Now().Before(due) && ctx.Err() == nil; try++ {
			n := (s.pref + try) % len(s.clients)
			kctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			resp, err := s.clients[n].KeepAliveSession(kctx, &adminv1.KeepAliveSessionRequest{ProxyId: s.proxy, SessionId: s.id})
			cancel()
			if err != nil {
				continue
			}
			if !resp.GetRenewed() {
				refused.Add(1)
				return
			}
			s.pref = n
			break
		}
	}
}

// sessionLeasesHeld counts the leases the admin holds for ss, read through
// the leader (linearizable), and the sessions' grace.
func sessionLeasesHeld(ctx context.Context, c *prismCluster, ss []*failoverSession) (int, time.Duration, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lead, err := c.leader(lctx, -1)
	if err != nil {
		return 0, 0, err
	}
	ours := make(map[uint64]bool, len(ss))
	for _, s := range ss {
		ours[s.id] = true
	}
	held, grace := 0, time.Duration(0)
	if err := mesh.AllPages(func(token string) (*adminv1.ListSessionsResponse, error) {
		return adminv1.NewAdminClient(c.conns.operator(lead)).ListSessions(lctx, &adminv1.ListSessionsRequest{
			Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE, PageSize: listPageSize, PageToken: token,
		})
	}, func(r *adminv1.ListSessionsResponse) {
		for _, sess := range r.GetSessions() {
			if ours[sess.GetId()] {
				held += int(sess.GetLeaseCount())
				grace = max(grace, sess.GetGrace().AsDuration())
			}
		}
	}); err != nil {
		return 0, 0, fmt.Errorf("list sessions: %w", err)
	}
	return held, grace, nil
}
