package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Sessions (docs/architecture.md#sessions): a sidecar holds all its mailboxes' leases in one
// session and renews them with one keepalive. The part measures a bulk grant,
// keepalive latency and the leader's CPU and heap with many sessions each
// holding many leases, and how long a silent session's leases outlive it.

// sessionsPerProxyMax is the admin's default quota of open sessions per
// proxy. Only placement.Partitions (256) proxies can own a namespace, so more
// sessions than that share proxies, up to this many each.
const sessionsPerProxyMax = 4

// maxOwningProxies keeps owningProxies inside the 256 partitions, where it
// still finds ids that each own one quickly; 250 proxies with 4 sessions
// each hold 1,000 sessions.
const maxOwningProxies = 250

// sizeName names a count in a figure: 1000 -> 1k, 1000000 -> 1m.
func sizeName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dm", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// session is one bench session: a proxy's, holding mailboxes.
type session struct {
	proxy, runner string
	id            uint64
	cl            adminv1.SessionsClient
	mailboxes     []string
	// lastSent is when the last renewed keepalive was sent (unix nanos):
	// the sidecar counts the ttl from there.
	lastSent atomic.Int64
}

// sessionsBench runs the bulk grant, the keepalive scale run and the expiry
// of one silent session on 3 nodes, then etcd's one lease with many keys.
func sessionsBench(ctx context.Context, o options, dir string, certs *certs) error {
	perProxy := (o.sessions + maxOwningProxies - 1) / maxOwningProxies
	if perProxy > sessionsPerProxyMax {
		return fmt.Errorf("sessions: %d sessions need %d per proxy, over the quota %d", o.sessions, perProxy, sessionsPerProxyMax)
	}
	nProxies := (o.sessions + perProxy - 1) / perProxy
	total := o.sessions * o.sessionLeases
	size := sizeName(total)
	// The bulk proxy's mailboxes on top of the scale run's, and room for
	// the quotas to refuse nothing the bench asks for.
	limit := total + o.bulk + 1000
	args := append([]string{"--max-namespaces", strconv.Itoa(limit), "--max-leases", strconv.Itoa(limit),
		"--max-leases-per-proxy", strconv.Itoa(max(perProxy*o.sessionLeases, o.bulk))}, o.sessionAdminArgs...)
	if o.sessionProfile != "" {
		args = append(args, "--enable-pprof")
	}
	c, err := startPrism(o.prism, dir, 3, o.sessionXDS, certs, args...)
	if err != nil {
		return err
	}
	defer c.stop()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	lead, err := c.leader(sctx, -1)
	cancel()
	if err != nil {
		return err
	}
	term0 := maxTerm(c)
	proxies := owningProxies("ses-p", nProxies+1)
	bulkProxy, proxies := proxies[0], proxies[1:]
	runnerOf := make(map[string]string, len(proxies)+1)
	want := make(map[string]int, len(proxies)+1)
	for i, p := range append([]string{bulkProxy}, proxies...) {
		runnerOf[p] = fmt.Sprintf("ses-r%d", i)
		want[p] = perProxy * o.sessionLeases
	}
	want[bulkProxy] = o.bulk
	setup, cancel := context.WithTimeout(ctx, o.sessionSetup)
	defer cancel()
	if err := registerProxies(setup, c, lead, runnerOf); err != nil {
		return err
	}
	t0 := time.Now()
	cfg := benchNamespaceConfig
	if o.sessionGrace > 0 {
		cfg = &adminv1.NamespaceConfig{Topics: cfg.GetTopics(), Lease: &adminv1.LeaseConfig{Grace: durationpb.New(o.sessionGrace)}}
	}
	ps, err := placeWith(setup, c, lead, namesWanted(proxies, bulkProxy, want), runnerOf, cfg)
	if err != nil {
		return fmt.Errorf("sessions: %w", err)
	}
	fmt.Fprintf(os.Stderr, "# sessions: %d namespaces created and placed in %.1fs\n", len(ps), time.Since(t0).Seconds())
	placedOn := byProxy(ps)
	for p, n := range want {
		if len(placedOn[p]) != n {
			return fmt.Errorf("sessions: %d namespaces placed on proxy %s, want %d", len(placedOn[p]), p, n)
		}
	}
	if err := warm(setup, c, lead, append([]string{bulkProxy}, proxies...)); err != nil {
		return err
	}
	if err := bulkGrant(setup, o, c, lead, bulkProxy, runnerOf[bulkProxy], placedOn[bulkProxy]); err != nil {
		return err
	}

	// The scale run's sessions: perProxy on each proxy, each with its own
	// sessionLeases of that proxy's mailboxes.
	var ss []*session
	for _, p := range proxies {
		for k := 0; k < perProxy && len(ss) < o.sessions; k++ {
			var mbs []string
			for _, pl := range placedOn[p][k*o.sessionLeases : (k+1)*o.sessionLeases] {
				mbs = append(mbs, pl.mailbox)
			}
			ss = append(ss, &session{proxy: p, runner: runnerOf[p], cl: adminv1.NewSessionsClient(c.conns.proxy(lead, p)), mailboxes: mbs})
		}
	}
	// Each session keeps alive from its opening, as a sidecar does, so none
	// expires while the others are granted; only keepalives sent inside the
	// window are timed.
	var window struct {
		sync.Mutex
		from, to time.Time
	}
	inWindow := func(t time.Time) bool {
		window.Lock()
		defer window.Unlock()
		return !window.from.IsZero() && !t.Before(window.from) && t.Before(window.to)
	}
	r := &recorder{}
	var refused atomic.Int64
	runCtx, stopAll := context.WithCancel(ctx)
	stops := make([]context.CancelFunc, len(ss))
	var wg sync.WaitGroup
	defer func() { stopAll(); wg.Wait() }()
	grantStart := time.Now()
	var next atomic.Int64
	var grantErr atomic.Value
	var gwg sync.WaitGroup
	for range 16 {
		gwg.Add(1)
		go func() {
			defer gwg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ss) || grantErr.Load() != nil {
					return
				}
				s := ss[i]
				if err := s.open(setup, o.sessionTTL); err != nil {
					grantErr.CompareAndSwap(nil, err)
					return
				}
				kctx, stop := context.WithCancel(runCtx)
				stops[i] = stop
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.keepAlive(kctx, o.sessionKeepAlive, inWindow, r, &refused)
				}()
				if err := s.acquire(setup); err != nil {
					grantErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	gwg.Wait()
	if err, _ := grantErr.Load().(error); err != nil {
		return fmt.Errorf("sessions %s: %w", size, err)
	}
	bench("admin.session_grant_s_"+size, time.Since(grantStart).Seconds(), "s")

	// One full keepalive round after the grants before the clock starts,
	// so every session is in its steady rhythm.
	time.Sleep(o.sessionKeepAlive)
	leader := c.nodes[lead]
	cpu0, start := leader.cpuTicks(), time.Now()
	window.Lock()
	window.from, window.to = start, start.Add(o.sessionFor)
	window.Unlock()
	profiled := make(chan error, 1)
	if o.sessionProfile != "" {
		go func() { profiled <- cpuProfile(c.http[lead], o.sessionFor, o.sessionProfile) }()
	} else {
		profiled <- nil
	}
	time.Sleep(o.sessionFor)
	if err := <-profiled; err != nil {
		fmt.Fprintf(os.Stderr, "# sessions: leader CPU profile: %v\n", err)
	}
	elapsed := time.Since(start).Seconds()
	bench("admin.session_leader_cpu_pct_"+size, float64(leader.cpuTicks()-cpu0)/elapsed, "%")
	bench("admin.session_renew_p50_ms_"+size, ms(r.pct(0.5)), "ms")
	bench("admin.session_renew_p99_ms_"+size, ms(r.pct(0.99)), "ms")
	bench("admin.session_renew_rate_"+size, float64(r.n())/elapsed, "keepalives/s")
	if heap, err := scrapeGauge("http://"+c.http[lead]+"/metrics", "go_memstats_heap_inuse_bytes"); err == nil {
		bench("admin.heap_mb_"+size, heap/(1<<20), "MB")
	} else {
		fmt.Fprintf(os.Stderr, "# sessions: leader heap: %v\n", err)
	}
	if rss := leader.rssBytes(); rss > 0 {
		bench("admin.rss_mb_"+size, float64(rss)/(1<<20), "MB")
	}
	if f := refused.Load(); f > 0 {
		fmt.Fprintf(os.Stderr, "# sessions %s: %d keepalives failed or were refused\n", size, f)
	}

	// Expiry: the first session goes silent, as a sidecar killed -9 would;
	// its leases are gone when the leader's table has none of them.
	stops[0]()
	if err := expiry(ctx, c, lead, ss[0]); err != nil {
		return err
	}
	stopAll()
	wg.Wait()
	raftStability(c, "sessions_"+size, term0)
	c.stop()
	return etcdKeepAlive(ctx, o, dir+"-etcd")
}

// namesWanted picks namespace names placement puts on each proxy, want[p]
// of them for proxy p, bulk's first.
func namesWanted(proxies []string, bulk string, want map[string]int) []string {
	all := append([]string{bulk}, proxies...)
	left := make(map[string]int, len(want))
	total := 0
	for p, n := range want {
		left[p] = n
		total += n
	}
	tab := placement.Compute(all)
	var names []string
	for n := 0; len(names) < total; n++ {
		name := fmt.Sprintf("ses-%d", n)
		if owner := tab.Owner(placement.Partition(name)); left[owner] > 0 {
			left[owner]--
			names = append(names, name)
		}
	}
	return names
}

// bulkGrant times AcquireLeases of the bulk proxy's mailboxes in one call,
// each repetition on mailboxes no one holds (released, off the clock, in
// between).
func bulkGrant(ctx context.Context, o options, c *prismCluster, lead int, proxy, runner string, mbs []placed) error {
	s := &session{proxy: proxy, runner: runner, cl: adminv1.NewSessionsClient(c.conns.proxy(lead, proxy))}
	for _, m := range mbs {
		s.mailboxes = append(s.mailboxes, m.mailbox)
	}
	// Long enough that no keepalive is needed while it runs.
	if err := s.open(ctx, 10*time.Minute); err != nil {
		return err
	}
	var took []time.Duration
	for range o.bulkReps {
		t0 := time.Now()
		if err := s.acquire(ctx); err != nil {
			return err
		}
		took = append(took, time.Since(t0))
		resp, err := s.cl.ReleaseLeases(ctx, &adminv1.ReleaseLeasesRequest{ProxyId: s.proxy, SessionId: s.id, MailboxIds: s.mailboxes})
		if err != nil || resp.GetRefusal() != nil {
			return fmt.Errorf("bulk release: %v %v", err, resp.GetRefusal())
		}
	}
	if _, err := s.cl.CloseSession(ctx, &adminv1.CloseSessionRequest{ProxyId: s.proxy, SessionId: s.id}); err != nil {
		return fmt.Errorf("close bulk session: %w", err)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	p := func(q float64) time.Duration { return took[int(q*float64(len(took)-1))] }
	n := sizeName(len(mbs))
	bench("admin.bulk_grant_ms_"+n, ms(p(0.5)), "ms")
	bench("admin.bulk_grant_p99_ms_"+n, ms(p(0.99)), "ms")
	return nil
}

func (s *session) open(ctx context.Context, ttl time.Duration) error {
	var resp *adminv1.OpenSessionResponse
	err := retryUnavailable(ctx, func() error {
		var err error
		resp, err = s.cl.OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: s.proxy, RunnerId: s.runner,
			RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(ttl)})
		return err
	})
	if err != nil || resp.GetSession() == nil {
		return fmt.Errorf("open session of %s: %v %v", s.proxy, err, resp.GetRefusal())
	}
	s.id = resp.GetSession().GetId()
	s.lastSent.Store(time.Now().UnixNano())
	return nil
}

// acquire grants all the session's mailboxes in one AcquireLeases.
func (s *session) acquire(ctx context.Context) error {
	var resp *adminv1.AcquireLeasesResponse
	err := retryUnavailable(ctx, func() error {
		var err error
		resp, err = s.cl.AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: s.proxy, SessionId: s.id, MailboxIds: s.mailboxes})
		return err
	})
	if err != nil || resp.GetRefusal() != nil {
		return fmt.Errorf("acquire %d leases in session %d of %s: %v %v", len(s.mailboxes), s.id, s.proxy, err, resp.GetRefusal())
	}
	for _, res := range resp.GetResults() {
		if !res.GetOk() {
			return fmt.Errorf("acquire %s in session %d: %v", res.GetMailboxId(), s.id, res.GetRefusal())
		}
	}
	return nil
}

// keepAlive renews the session every interval from a random phase (the
// sessions spread over the interval like independent sidecars) until ctx
// ends, timing the keepalives sent inside the window.
func (s *session) keepAlive(ctx context.Context, every time.Duration, inWindow func(time.Time) bool, r *recorder, refused *atomic.Int64) {
	due := time.Now().Add(time.Duration(rand.Int64N(int64(every))))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(due)):
		}
		t0 := time.Now()
		kctx, cancel := context.WithTimeout(ctx, every)
		resp, err := s.cl.KeepAliveSession(kctx, &adminv1.KeepAliveSessionRequest{ProxyId: s.proxy, SessionId: s.id})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil || !resp.GetRenewed():
			refused.Add(1)
		default:
			s.lastSent.Store(t0.UnixNano())
			if inWindow(t0) {
				r.add(time.Since(t0))
			}
		}
		due = due.Add(every)
	}
}

// expiry waits for the silent session's leases to leave the leader's table
// and reports the time from its last renewed keepalive, with ttl + grace.
func expiry(ctx context.Context, c *prismCluster, lead int, s *session) error {
	adm := adminv1.NewAdminClient(c.conns.operator(lead))
	var floor time.Duration
	n := sizeName(len(s.mailboxes))
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := adm.GetSession(ctx, &adminv1.GetSessionRequest{SessionId: s.id})
		switch {
		case status.Code(err) == codes.NotFound || (err == nil && len(resp.GetLeases()) == 0):
			gone := time.Since(time.Unix(0, s.lastSent.Load()))
			bench("admin.session_expiry_routes_ms_"+n, ms(gone), "ms")
			if floor > 0 {
				bench("admin.session_expiry_floor_ms_"+n, ms(floor), "ms")
				bench("admin.session_expiry_lag_ms_"+n, ms(gone-floor), "ms")
			}
			return nil
		case err != nil:
			return fmt.Errorf("expiry: get session %d: %w", s.id, err)
		}
		// The session expires after the largest grace of its leases (their
		// namespaces'), its own while it holds none.
		grace := resp.GetSession().GetGrace().AsDuration()
		if ls := resp.GetLeases(); len(ls) > 0 {
			grace = 0
			for _, l := range ls {
				grace = max(grace, l.GetGrace().AsDuration())
			}
		}
		floor = resp.GetSession().GetTtl().AsDuration() + grace
	}
	return fmt.Errorf("expiry: session %d of %s still holds leases 2m after its last keepalive", s.id, s.proxy)
}

// rssBytes is the process's resident set size.
func (p *proc) rssBytes() int64 {
	if p.cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cpuProfile writes a CPU profile of the node serving HTTP on addr (with
// --enable-pprof) over the next d to file.
func cpuProfile(addr string, d time.Duration, file string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}
