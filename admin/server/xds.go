package server

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/ir"
)

// xdsFeed turns this node's FSM into the xDS control plane's input. Every
// node, leader or follower, serves xDS from its own FSM; the IR version is
// the routes index, identical on every replica for the same routes.
type xdsFeed struct {
	src     routeSource
	cp      *xds.ControlPlane
	gateway string
	// notFound lists the admin nodes' gRPC addresses; Envoy needs IPs, so
	// host names (a StatefulSet's peer DNS names) are resolved when the IR
	// is built.
	notFound []string
	resolve  func(ctx context.Context, host string) ([]string, error)
}

// routeSource is what the feed reads of the FSM (*fsm.FSM).
type routeSource interface {
	Changed() (uint64, <-chan struct{})
	RoutesIndex() uint64
	Routes() ([]*adminv1.Route, []*adminv1.NamespaceRoute, uint64)
	Proxies() ([]*adminv1.ProxyInfo, uint64)
}

func (f *xdsFeed) run(ctx context.Context) {
	var (
		lastIndex uint64
		lastStale map[string]bool
		lastNF    []string
		routes    []*adminv1.Route
		aliases   []*adminv1.NamespaceRoute
		sent      bool
	)
	for {
		_, changed := f.src.Changed()
		start := time.Now()
		// Proxy heartbeats and lease checkpoints change the FSM often and
		// routing rarely. Copying the routes costs a sort of every lease
		// under the FSM's read lock (about 12 ms at 10,000), so it happens
		// only when the routes index moved.
		idx := lastIndex
		if !sent || f.src.RoutesIndex() != lastIndex {
			routes, aliases, idx = f.src.Routes()
		}
		stale := f.staleProxies()
		nf := f.notFoundIPs(ctx)
		if !sent || idx != lastIndex || !maps.Equal(stale, lastStale) || !slices.Equal(nf, lastNF) {
			gen := f.cp.Update(ir.FromAdmin(ir.AdminState{
				// 1: an FSM that never had a route still serves listeners and
				// the not-found routes (index 1 is Raft's bootstrap entry, never
				// a routes change).
				Routes: routes, NamespaceRoutes: aliases, RoutesIndex: max(idx, 1), StaleProxies: stale,
				Gateway: ir.Gateway{Address: f.gateway}, NotFound: nf,
			}))
			lastIndex, lastStale, lastNF, sent = idx, stale, nf, true
			// Bounded in case the control plane is not running.
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = f.cp.Processed(wctx, gen)
			cancel()
		}
		// Back-pressure: reading the routes (under the FSM's read lock) and
		// translating them cost time proportional to the table, about
		// 0.1-0.25 s at 10,000 mailboxes. Resting as long as the last round
		// took keeps xDS under about half a core during a burst of lease
		// changes, so Raft on the same machine is not starved, while a
		// single change still goes out within one round.
		rest := min(time.Since(start), time.Second)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(rest):
		}
	}
}

func (f *xdsFeed) staleProxies() map[string]bool {
	infos, _ := f.src.Proxies()
	stale := map[string]bool{}
	for _, p := range infos {
		if p.GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_STALE {
			stale[p.GetProxy().GetRegistration().GetProxyId()] = true
		}
	}
	return stale
}

// notFoundAddrs lists every admin node's gRPC address, sorted, so all nodes
// build the same IR.
func notFoundAddrs(addrs map[string]string) []string {
	out := slices.Collect(maps.Values(addrs))
	slices.Sort(out)
	return slices.Compact(out)
}

// notFoundIPs turns the admin gRPC addresses into IP:port: IPs stay, host
// names resolve (first address), unspecified or unresolvable ones are left
// out. Sorted, so nodes resolving the same names build the same IR.
func (f *xdsFeed) notFoundIPs(ctx context.Context) []string {
	var out []string
	for _, a := range f.notFound {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			if !ip.IsUnspecified() {
				out = append(out, a)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		ips, err := f.resolve(rctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			continue
		}
		slices.Sort(ips)
		out = append(out, net.JoinHostPort(ips[0], port))
	}
	slices.Sort(out)
	return slices.Compact(out)
}
