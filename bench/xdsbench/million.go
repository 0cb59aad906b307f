package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	lookupv1 "github.com/prism-mesh/prism/proto/prism/lookup/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/lookup"
	"github.com/prism-mesh/prism/xds/translator"
)

// millionConfig sizes the 1M-mailbox run.
type millionConfig struct {
	mailboxes, proxies int
	// leaseOps are the acquire/renew/release/re-grant operations whose
	// xDS bytes are counted.
	leaseOps int
	// samples are the leases timed from grant to served.
	samples int
	// aliasNamespaces are the namespaces moved per round (two rounds).
	aliasNamespaces int
	// routeCalls are the calls per proxy timed for route selection.
	routeCalls int
}

// million measures an admin FSM holding cfg.mailboxes
// leases on cfg.proxies proxies. The state is built by applying commands
// straight to an fsm.FSM, as Raft would after commit: through a Raft
// cluster, two million entries would take minutes. Everything else is what
// an admin node runs: xds.ControlPlane.Follow on that FSM, the ADS server,
// the not-found service and the namespace lookup (RLS) on one gRPC server.
// The clients are grpc-go's real xDS client (with RLS) and a raw delta ADS
// client as Envoy would be; every proxy's runner is an xdstest runner that
// answers only the mailboxes it holds.
func million(log *slog.Logger, cfg millionConfig) error {
	m := &meshM{cfg: cfg, t0: time.Now().UTC().Truncate(time.Second), byProxy: map[string]*xdstest.Runner{}}
	defer m.close()
	for i := range cfg.proxies {
		r, err := xdstest.StartRunner(fmt.Sprintf("runner-%04d", i))
		if err != nil {
			return err
		}
		m.runners = append(m.runners, r)
		m.proxyIDs = append(m.proxyIDs, fmt.Sprintf("proxy-%04d", i))
		m.byProxy[m.proxyIDs[i]] = r
	}
	if m.cfg.routeCalls > 0 {
		if err := m.routeSelect(log); err != nil {
			return err
		}
	}
	m.f = fsm.New(fsm.WithLogger(log), fsm.WithLeaseObserver(&m.obs))
	m.obs.byProxy = m.byProxy

	start := time.Now()
	if err := m.build(); err != nil {
		return err
	}
	c := m.f.Counts()
	note("1M state: %d proxies, %d namespaces, %d leases applied to an fsm.FSM in %.1f s",
		len(m.proxyIDs), c.Namespaces, c.Leases, time.Since(start).Seconds())
	runtime.GC()
	note("heap with the FSM alone (and %d idle test runners): %.1f MB", len(m.runners), liveHeapMB())

	if err := m.serve(log); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	delta, err := xdstest.DialDelta(ctx, m.addr, "bench-1m-delta")
	if err != nil {
		return err
	}
	defer delta.Close()
	version := fmt.Sprint(m.f.ProxyRoutesIndex())
	if err := awaitVersion(endpointVersions(delta), version); err != nil {
		return fmt.Errorf("delta client at 1M: %w", err)
	}
	runtime.GC()
	// The bench process stands in for the admin process: it also holds the
	// test runners and the raw delta client's connection (a few MB).
	bench("xds.admin_heap_mb_1m", liveHeapMB(), "MB")

	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(m.addr, "bench-1m-grpc"))
	if err != nil {
		return err
	}
	defer conn.Close()
	// Every route, cluster and runner of a proxy with mailboxes in use, as
	// on a busy gateway: one mailbox of each is held and answered through
	// grpc-go.
	for _, p := range m.owning {
		m.byProxy[p].Hold(m.mailboxes[p][0])
	}
	start = time.Now()
	for _, p := range m.owning {
		if _, err := await(conn, m.mailboxes[p][0], m.byProxy[p].ID, 60*time.Second); err != nil {
			return fmt.Errorf("grpc-go at 1M: %w", err)
		}
	}
	note("grpc-go's client reached the runners of all %d proxies with mailboxes (of %d) through its routes in %.1f s", len(m.owning), len(m.proxyIDs), time.Since(start).Seconds())
	max, typ := m.ads.largest()
	bench("xds.max_response_bytes_1m", float64(max), "bytes")
	note("largest xDS response at 1M mailboxes: %s, %d bytes (grpc-go's SotW client and a delta client, plaintext)", typ, max)

	if err := m.leaseBytes(); err != nil {
		return err
	}
	if err := m.leaseConvergence(conn); err != nil {
		return err
	}
	return m.aliasConvergence(conn)
}

// meshM is the 1M run's state.
type meshM struct {
	cfg      millionConfig
	t0       time.Time
	f        *fsm.FSM
	index    uint64
	obs      holder
	runners  []*xdstest.Runner
	proxyIDs []string
	byProxy  map[string]*xdstest.Runner
	// owning are the proxies placement gave namespaces, in route order:
	// at most placement.Partitions (256) of them.
	owning []string
	// mailboxes are the first few leased mailboxes of each proxy, the ones
	// the measurements use (a million strings would weigh on the heap
	// figure).
	mailboxes map[string][]string
	addr      string
	registry  *prometheus.Registry
	ads       *adsStats
	stop      func()
}

// perProxy is how many of each proxy's mailboxes meshM keeps by name.
const perProxy = 64

func (m *meshM) close() {
	if m.stop != nil {
		m.stop()
	}
	for _, r := range m.runners {
		r.Close()
	}
}

// holder is the sidecar's part: once active, a grant makes the proxy's
// runner serve the mailbox as the FSM applies it (a sidecar activates the
// mailbox on its grant; here without the hop from sidecar to runner).
type holder struct {
	active  atomic.Bool
	byProxy map[string]*xdstest.Runner
}

func (h *holder) LeaseGranted(l *adminv1.Lease) {
	if h.active.Load() {
		h.byProxy[l.GetProxyId()].Hold(l.GetMailboxId())
	}
}
func (h *holder) LeaseRemoved(string, uint64)     {}
func (h *holder) LeasesRestored([]*adminv1.Lease) {}

// apply applies cmds as the next log entries, one batch, and returns their
// results; an error result fails.
func (m *meshM) apply(cmds ...*adminv1.Command) ([]any, error) {
	logs := make([]*raft.Log, len(cmds))
	for i, cmd := range cmds {
		data, err := fsm.Encode(cmd)
		if err != nil {
			return nil, err
		}
		m.index++
		logs[i] = &raft.Log{Index: m.index, Term: 1, Type: raft.LogCommand, Data: data}
	}
	out := m.f.ApplyBatch(logs)
	for i, r := range out {
		if err, ok := r.(error); ok {
			return nil, fmt.Errorf("%s: %w", fsm.CommandType(cmds[i]), err)
		}
	}
	return out, nil
}

func (m *meshM) cmd(body any) *adminv1.Command {
	c := &adminv1.Command{Now: timestamppb.New(m.t0)}
	switch b := body.(type) {
	case *adminv1.RegisterProxyRequest:
		c.Body = &adminv1.Command_RegisterProxy{RegisterProxy: b}
	case *adminv1.CreateNamespaceRequest:
		c.Body = &adminv1.Command_CreateNamespace{CreateNamespace: b}
	case *adminv1.AcquireLeaseRequest:
		c.Body = &adminv1.Command_AcquireLease{AcquireLease: b}
	case *adminv1.ReleaseLeaseRequest:
		c.Body = &adminv1.Command_ReleaseLease{ReleaseLease: b}
	case *adminv1.CheckpointLeasesCommand:
		c.Body = &adminv1.Command_CheckpointLeases{CheckpointLeases: b}
	case *adminv1.MarkProxiesStaleCommand:
		c.Body = &adminv1.Command_MarkProxiesStale{MarkProxiesStale: b}
	default:
		panic(fmt.Sprintf("no command body for %T", body))
	}
	return c
}

// build registers the proxies (each with its runner's address), then
// creates the namespaces where placement puts them and grants each its
// mailbox's lease to the proxy's runner, in batches as Raft applies them.
func (m *meshM) build() error {
	var regs []*adminv1.Command
	for i, p := range m.proxyIDs {
		regs = append(regs, m.cmd(&adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
			ProxyId: p, Address: m.runners[i].Addr, RunnerId: m.runners[i].ID, Version: "bench",
		}}))
	}
	if _, err := m.apply(regs...); err != nil {
		return err
	}
	m.mailboxes = map[string][]string{}
	const batch = 2048
	for lo := 0; lo < m.cfg.mailboxes; lo += batch {
		hi := min(lo+batch, m.cfg.mailboxes)
		creates := make([]*adminv1.Command, 0, hi-lo)
		for i := lo; i < hi; i++ {
			creates = append(creates, m.cmd(&adminv1.CreateNamespaceRequest{
				Namespace: fmt.Sprintf("ns-%07d", i), Config: &adminv1.NamespaceConfig{Topics: []string{"events"}},
			}))
		}
		res, err := m.apply(creates...)
		if err != nil {
			return err
		}
		acquires := make([]*adminv1.Command, 0, len(res))
		for _, r := range res {
			n := r.(*adminv1.CreateNamespaceResponse).GetNamespace()
			p := n.GetAssignedProxyId()
			id := n.GetName() + "@" + p
			if len(m.mailboxes[p]) < perProxy {
				m.mailboxes[p] = append(m.mailboxes[p], id)
			}
			acquires = append(acquires, m.cmd(&adminv1.AcquireLeaseRequest{MailboxId: id, RunnerId: m.byProxy[p].ID, RunnerAddress: m.byProxy[p].Addr}))
		}
		res, err = m.apply(acquires...)
		if err != nil {
			return err
		}
		for i, r := range res {
			if !r.(*adminv1.AcquireLeaseResponse).GetGranted() {
				return fmt.Errorf("acquire %s refused: %s", acquires[i].GetAcquireLease().GetMailboxId(), r.(*adminv1.AcquireLeaseResponse).GetRefusal().GetMessage())
			}
		}
	}
	for _, p := range m.proxyIDs {
		switch n := len(m.mailboxes[p]); {
		case n >= perProxy:
			m.owning = append(m.owning, p)
		case n > 0:
			return fmt.Errorf("proxy %s got %d mailboxes: too few namespaces for %d proxies", p, n, len(m.proxyIDs))
		}
	}
	if len(m.owning) < 3 {
		return fmt.Errorf("%d proxies hold mailboxes, want 3", len(m.owning))
	}
	m.obs.active.Store(true)
	return nil
}

// serve starts the admin node's xDS side over the FSM.
func (m *meshM) serve(log *slog.Logger) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("control plane listen: %w", err)
	}
	m.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	m.registry = prometheus.NewRegistry()
	m.ads = &adsStats{}
	cp := xds.New(ctx, xds.Config{Registerer: m.registry, Log: log})
	g := grpc.NewServer(grpc.StatsHandler(m.ads))
	cp.Register(g)
	lookup.New(lookup.Config{Routes: m.f, Logger: log}).Register(g)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	go func() { defer wg.Done(); _ = cp.Run(ctx) }()
	go func() {
		defer wg.Done()
		_ = cp.Follow(ctx, m.f, xds.FollowConfig{
			Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, NotFound: []string{m.addr}, Lookup: "dns:///" + m.addr,
		})
	}()
	m.stop = func() { cancel(); g.Stop(); wg.Wait() }
	return nil
}

// leaseBytes applies cfg.leaseOps lease operations, a quarter each of
// renewals (the leader's checkpoint), releases (the runner stopped serving
// first, as the sidecar orders it), grants and re-grants (the same runner
// again, a new epoch), and counts every ADS byte sent meanwhile.
func (m *meshM) leaseBytes() error {
	versionBefore := m.f.ProxyRoutesIndex()
	sentBefore, nBefore := m.ads.total()
	metricBefore := bytesSent(m.registry, "sotw") + bytesSent(m.registry, "delta")
	epochs := map[string]uint64{}
	ops := 0
	for i := 0; ops < m.cfg.leaseOps; i++ {
		p := m.owning[i%len(m.owning)]
		id := m.mailboxes[p][1+(i/len(m.owning))%(perProxy-2)]
		r := m.byProxy[p]
		if epochs[id] == 0 {
			l, _ := m.f.Lease(id)
			epochs[id] = l.GetEpoch()
		}
		renew := m.cmd(&adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{{
			MailboxId: id, Epoch: epochs[id], ExpiresAt: timestamppb.New(m.t0.Add(time.Minute)), LastHeartbeatAt: timestamppb.New(m.t0),
		}}})
		if _, err := m.apply(renew); err != nil {
			return err
		}
		r.Release(id)
		res, err := m.apply(m.cmd(&adminv1.ReleaseLeaseRequest{MailboxId: id, RunnerId: r.ID, Epoch: epochs[id]}))
		if err != nil {
			return err
		}
		if !res[0].(*adminv1.ReleaseLeaseResponse).GetReleased() {
			return fmt.Errorf("release %s: not released", id)
		}
		for range 2 { // the grant, then the re-grant
			res, err := m.apply(m.cmd(&adminv1.AcquireLeaseRequest{MailboxId: id, RunnerId: r.ID, RunnerAddress: r.Addr}))
			if err != nil {
				return err
			}
			got := res[0].(*adminv1.AcquireLeaseResponse)
			if !got.GetGranted() {
				return fmt.Errorf("acquire %s: %s", id, got.GetRefusal().GetMessage())
			}
			epochs[id] = got.GetLease().GetEpoch()
		}
		ops += 4
	}
	// Follow wakes on every applied entry; anything it published would be
	// on the wire within the updater's debounce and max delay (10/100 ms).
	time.Sleep(time.Second)
	if v := m.f.ProxyRoutesIndex(); v != versionBefore {
		return fmt.Errorf("lease operations moved the proxy routes index %d -> %d", versionBefore, v)
	}
	sent, n := m.ads.total()
	metric := bytesSent(m.registry, "sotw") + bytesSent(m.registry, "delta")
	bench("xds.route_bytes_per_lease_change_1m", float64(sent-sentBefore)/float64(ops), "bytes")
	note("%d lease operations at 1M (renew, release, grant, re-grant): %d ADS responses, %d bytes on the wire (stats handler), %.0f bytes (prism_xds_push_bytes_total), all types, to grpc-go's client and a delta client",
		ops, n-nBefore, sent-sentBefore, metric-metricBefore)
	return nil
}

// leaseConvergence times cfg.samples grants from the FSM's apply to the
// first grpc-go call through xds:///mailbox-query that the holder answers.
// Before each, the runner stops serving the mailbox and the lease is
// released; the grant makes the runner hold it as it applies (holder). So
// the figure is the apply, the holder's activation and grpc-go's calls
// (route selection over 1,000 proxies' routes, the runner's answer): no
// xDS, since the routes did not change.
func (m *meshM) leaseConvergence(conn *grpc.ClientConn) error {
	var served []float64
	for i := range m.cfg.samples {
		p := m.owning[(i*7919)%len(m.owning)]
		id := m.mailboxes[p][perProxy-1]
		r := m.byProxy[p]
		r.Release(id)
		if _, err := m.apply(m.cmd(&adminv1.ReleaseLeaseRequest{MailboxId: id, RunnerId: r.ID})); err != nil {
			return err
		}
		start := time.Now()
		if _, err := m.apply(m.cmd(&adminv1.AcquireLeaseRequest{MailboxId: id, RunnerId: r.ID, RunnerAddress: r.Addr})); err != nil {
			return err
		}
		if _, err := await(conn, id, r.ID, 10*time.Second); err != nil {
			return fmt.Errorf("lease %d: %w", i, err)
		}
		served = append(served, ms(time.Since(start)))
	}
	slices.Sort(served)
	bench("xds.convergence_p50_ms_1m", percentile(served, 0.50), "ms")
	bench("xds.convergence_p99_ms_1m", percentile(served, 0.99), "ms")
	note("lease convergence at 1M: %d grants, min %.3f ms, max %.3f ms", len(served), served[0], served[len(served)-1])
	return nil
}

// aliasConvergence moves namespaces between proxies, as when a proxy dies:
// its runner stops answering, the leader marks the proxy stale (placement
// moves its namespaces), and the new proxies' runners acquire the new
// mailboxes. Each namespace is timed from its grant to the first grpc-go
// call with x-prism-namespace that the new holder answers. grpc-go's RLS
// had looked every one up just before, so the figure is bounded by the
// lookup's cache ages, not by xDS.
func (m *meshM) aliasConvergence(conn *grpc.ClientConn) error {
	maxAge, staleAge, err := rlsAges(m.addr)
	if err != nil {
		return err
	}
	var served []float64
	for round, p := range []string{m.owning[len(m.owning)/2], m.owning[len(m.owning)/3]} {
		r := m.byProxy[p]
		ids := m.mailboxes[p][1 : 1+m.cfg.aliasNamespaces]
		r.Hold(ids...)
		for _, id := range ids {
			if err := awaitNamespace(conn, namespaceOf(id), id, r.ID, 60*time.Second); err != nil {
				return fmt.Errorf("alias round %d before the move: %w", round, err)
			}
		}
		r.Release(ids...)
		info, _ := m.f.Proxy(p)
		res, err := m.apply(m.cmd(&adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: p, LastSeen: info.GetProxy().GetLastSeen()}}}))
		if err != nil {
			return err
		}
		if len(res[0].(*fsm.MarkStaleResult).Marked) != 1 {
			return fmt.Errorf("proxy %s not marked stale", p)
		}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for _, old := range ids {
			ns := namespaceOf(old)
			n, _, _ := m.f.Namespace(ns)
			q := n.GetAssignedProxyId()
			if q == p || q == "" {
				return fmt.Errorf("namespace %s did not move off %s", ns, p)
			}
			id, to := ns+"@"+q, m.byProxy[q]
			start := time.Now()
			if _, err := m.apply(m.cmd(&adminv1.AcquireLeaseRequest{MailboxId: id, RunnerId: to.ID, RunnerAddress: to.Addr})); err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := awaitNamespace(conn, ns, id, to.ID, maxAge+10*time.Second)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				served = append(served, ms(time.Since(start)))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("alias round %d: %w", round, err)
		}
	}
	slices.Sort(served)
	bench("xds.alias_convergence_p50_ms_1m", percentile(served, 0.50), "ms")
	bench("xds.alias_convergence_p99_ms_1m", percentile(served, 0.99), "ms")
	bench("xds.rls_max_age_ms", ms(maxAge), "ms")
	bench("xds.rls_stale_age_ms", ms(staleAge), "ms")
	note("alias convergence at 1M: %d namespaces moved off 2 stale proxies, min %.0f ms, max %.0f ms; grpc-go's RLS cache: max_age %v, stale_age %v (polled every %v)",
		len(served), served[0], served[len(served)-1], maxAge, staleAge, aliasPoll)
	return nil
}

// aliasPoll is how often each moved namespace is asked for.
const aliasPoll = 10 * time.Millisecond

func namespaceOf(id string) string { ns, _, _ := strings.Cut(id, "@"); return ns }

// awaitNamespace calls with x-prism-namespace ns until runner answers for
// mailbox id.
func awaitNamespace(conn *grpc.ClientConn, ns, id, runner string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		got, served, err := whoAnswersNamespace(conn, ns)
		if err == nil && got == runner && served == id {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: %s by %q (%v) after %v, want %s by %s", ns, served, got, err, limit, id, runner)
		}
		time.Sleep(aliasPoll)
	}
}

func whoAnswersNamespace(conn *grpc.ClientConn, ns string) (runner, mailbox string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderNamespace, ns)
	var hdr metadata.MD
	resp, err := mailboxv1.NewMailboxQueryClient(conn).GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
	if err != nil {
		return "", "", err
	}
	if v := hdr.Get(xdstest.RunnerHeader); len(v) > 0 {
		runner = v[0]
	}
	return runner, resp.GetStats().GetMailboxId(), nil
}

// rlsAges reads grpc-go's RLS cache ages from the route table the
// translator builds for this control plane.
func rlsAges(admin string) (maxAge, staleAge time.Duration, err error) {
	x := xdstest.Mesh(1, 1, admin)
	res, err := translator.Translate(x)
	if err != nil {
		return 0, 0, err
	}
	for _, rc := range res.Routes {
		if plugins := rc.GetClusterSpecifierPlugins(); len(plugins) > 0 {
			// Our wire-compatible message under grpc-go's type URL, so not
			// UnmarshalTo, which checks the name.
			spec := &lookupv1.RouteLookupClusterSpecifier{}
			if err := proto.Unmarshal(plugins[0].GetExtension().GetTypedConfig().GetValue(), spec); err != nil {
				return 0, 0, fmt.Errorf("RLS plugin: %w", err)
			}
			c := spec.GetRouteLookupConfig()
			return c.GetMaxAge().AsDuration(), c.GetStaleAge().AsDuration(), nil
		}
	}
	return 0, 0, fmt.Errorf("no RLS plugin in %d route tables", len(res.Routes))
}

// routeSelect times calls for a mailbox of the first proxy in grpc-go's
// route table (matched by the first route) and of the last (matched after
// all the per-proxy routes were tried), alternating, with the same kind of
// runner behind each. The difference is what selecting among 1,000
// proxies' routes costs a call. It runs as a gateway would, without the
// admin's FSM in the process (a 1.4 GB heap's collections would be most of
// the p99): its own control plane serves the same proxies, and each of the
// two runners holds its mailbox without a lease.
func (m *meshM) routeSelect(log *slog.Logger) error {
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return err
	}
	defer cp.Close()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{cp.Addr}, Lookup: "dns:///" + cp.Addr}
	for i, p := range m.proxyIDs {
		x.Proxies = append(x.Proxies, ir.Proxy{ID: p, RunnerID: m.runners[i].ID, Address: m.runners[i].Addr, Healthy: true})
	}
	cp.Update(x)
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(cp.Addr, "bench-route-select"))
	if err != nil {
		return err
	}
	defer conn.Close()
	first, last := m.proxyIDs[0], m.proxyIDs[len(m.proxyIDs)-1]
	ids := map[string]string{first: "route-select@" + first, last: "route-select@" + last}
	for _, p := range []string{first, last} {
		m.byProxy[p].Hold(ids[p])
		defer m.byProxy[p].Release(ids[p])
		if _, err := await(conn, ids[p], m.byProxy[p].ID, 60*time.Second); err != nil {
			return fmt.Errorf("route select: %w", err)
		}
	}
	settle()
	lat := map[string][]float64{}
	for i := range 2 * m.cfg.routeCalls {
		p := first
		if i%2 == 1 {
			p = last
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		got, err := xdstest.WhoAnswers(ctx, conn, ids[p])
		d := time.Since(start)
		cancel()
		if err != nil || got != m.byProxy[p].ID {
			return fmt.Errorf("route select: %s answered by %q: %v", ids[p], got, err)
		}
		lat[p] = append(lat[p], float64(d.Nanoseconds())/1000)
	}
	slices.Sort(lat[first])
	slices.Sort(lat[last])
	bench("gateway.call_p50_us_first_route_1k_proxies", percentile(lat[first], 0.50), "us")
	bench("gateway.call_p99_us_first_route_1k_proxies", percentile(lat[first], 0.99), "us")
	bench("gateway.call_p50_us_last_route_1k_proxies", percentile(lat[last], 0.50), "us")
	bench("gateway.call_p99_us_last_route_1k_proxies", percentile(lat[last], 0.99), "us")
	bench("gateway.route_select_p50_us_1k_proxies", percentile(lat[last], 0.50)-percentile(lat[first], 0.50), "us")
	bench("gateway.route_select_p99_us_1k_proxies", percentile(lat[last], 0.99)-percentile(lat[first], 0.99), "us")
	note("route selection: %s is route 1 of grpc-go's table, %s route %d (%d calls each, alternating)",
		first, last, len(m.proxyIDs), m.cfg.routeCalls)
	return nil
}

// settle waits, up to 60 s, until the process uses under a fifth of a core
// over half a second: grpc-go's client goes on connecting and rebuilding
// pickers for its 1,000 clusters well after its first calls are answered.
func settle() {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		before := cpuTime()
		time.Sleep(500 * time.Millisecond)
		if cpuTime()-before < 100*time.Millisecond {
			return
		}
	}
}

func liveHeapMB() float64 {
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	return float64(mem.HeapAlloc) / (1 << 20)
}

// adsStats counts the ADS server's responses as they go on the wire.
type adsStats struct {
	mu      sync.Mutex
	bytes   int64
	n       int64
	max     int
	maxType string
}

type adsKey struct{}

const adsPrefix = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"

func (s *adsStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if strings.HasPrefix(info.FullMethodName, adsPrefix) {
		return context.WithValue(ctx, adsKey{}, strings.TrimPrefix(info.FullMethodName, adsPrefix))
	}
	return ctx
}

func (s *adsStats) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	out, ok := rs.(*stats.OutPayload)
	if !ok || ctx.Value(adsKey{}) == nil {
		return
	}
	typ := "?"
	if r, ok := out.Payload.(interface{ GetTypeUrl() string }); ok {
		typ = r.GetTypeUrl()[strings.LastIndex(r.GetTypeUrl(), ".")+1:]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bytes += int64(out.WireLength)
	s.n++
	if out.Length > s.max {
		s.max, s.maxType = out.Length, fmt.Sprintf("%s (%s)", typ, ctx.Value(adsKey{}))
	}
}

func (s *adsStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (s *adsStats) HandleConn(context.Context, stats.ConnStats)                       {}

func (s *adsStats) total() (bytes, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes, s.n
}

func (s *adsStats) largest() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.maxType
}
