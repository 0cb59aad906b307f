package xds

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds/ir"
)

// Source is what the control plane reads from an admin node's FSM;
// *admin/fsm.FSM implements it.
type Source interface {
	// Changed returns the applied index and a channel closed by the next
	// state change.
	Changed() (uint64, <-chan struct{})
	// Routes returns the live leases' routes, the namespace alias routes and
	// the index of their last change.
	Routes() ([]*adminv1.Route, []*adminv1.NamespaceRoute, uint64)
	// Proxies returns the registered proxies.
	Proxies() ([]*adminv1.ProxyInfo, uint64)
}

// routesIndexer is an optional cheap read of the routes index
// (*admin/fsm.FSM has it): with it, Follow copies the routes only when they
// changed, not on every heartbeat checkpoint the FSM applies.
type routesIndexer interface {
	RoutesIndex() uint64
}

// FollowConfig completes the IR Follow builds from a Source.
type FollowConfig struct {
	// Gateway is the mailbox gateway the IR routes to. An admin node running
	// with TLS sets Gateway.UpstreamTLS to its trust domain, so the gateways
	// reach runners and not-found endpoints over mutual TLS; a node given a
	// JWKS sets Gateway.QueryAuth, so Envoy checks query tokens.
	Gateway ir.Gateway
	// NotFound lists the admin nodes' gRPC addresses. Envoy needs IPs, so
	// host names (a StatefulSet's peer DNS names) are resolved every round
	// (see notFoundIPs).
	NotFound []string
	// Resolve looks a host name up; nil is net.DefaultResolver.LookupHost.
	Resolve func(ctx context.Context, host string) ([]string, error)
}

// Follow keeps the control plane on src's routing state until ctx ends.
// Every node, leader or follower, serves xDS from its own FSM. After every
// FSM change it looks at which proxies are stale, resolves the not-found
// targets and, only when the routes index moved, re-reads the routes; it
// hands over a new state when any of them moved. The version is always the
// routes index, the same on every replica for the same routes; a
// stale-proxy or not-found change, which has no index of its own, is served
// under a suffixed label of it (see cache.Cache.Set).
func (cp *ControlPlane) Follow(ctx context.Context, src Source, cfg FollowConfig) error {
	resolve := cfg.Resolve
	if resolve == nil {
		resolve = net.DefaultResolver.LookupHost
	}
	ri, indexed := src.(routesIndexer)
	var (
		lastIndex uint64
		lastStale map[string]bool
		lastNF    []string
		routes    []*adminv1.Route
		aliases   []*adminv1.NamespaceRoute
		sent      bool
	)
	for {
		_, changed := src.Changed()
		start := time.Now()
		// Proxy heartbeats and lease checkpoints change the FSM often and
		// routing rarely. Copying the routes costs a sort of every lease
		// under the FSM's read lock (about 12 ms at 10,000), so it happens
		// only when the routes index moved (every round for a Source
		// without RoutesIndex).
		idx := lastIndex
		if !sent || !indexed || ri.RoutesIndex() != lastIndex {
			routes, aliases, idx = src.Routes()
		}
		stale := staleProxies(src)
		nf := notFoundIPs(ctx, cfg.NotFound, resolve)
		if !sent || idx != lastIndex || !maps.Equal(stale, lastStale) || !slices.Equal(nf, lastNF) {
			gen := cp.Update(ir.FromAdmin(ir.AdminState{
				// 1: an FSM that never had a route still serves listeners and
				// the not-found routes (index 1 is Raft's bootstrap entry, never
				// a routes change).
				Routes: routes, NamespaceRoutes: aliases, RoutesIndex: max(idx, 1), StaleProxies: stale,
				Gateway: cfg.Gateway, NotFound: nf,
			}))
			lastIndex, lastStale, lastNF, sent = idx, stale, nf, true
			// Bounded in case the control plane is not running.
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = cp.Processed(wctx, gen)
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
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rest):
		}
	}
}

func staleProxies(src Source) map[string]bool {
	infos, _ := src.Proxies()
	stale := map[string]bool{}
	for _, p := range infos {
		if p.GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_STALE {
			stale[p.GetProxy().GetRegistration().GetProxyId()] = true
		}
	}
	return stale
}

// notFoundIPs turns the admin gRPC addresses into IP:port: IPs stay, host
// names resolve (first address), unspecified or unresolvable ones are left
// out. Sorted, so nodes resolving the same names build the same IR.
func notFoundIPs(ctx context.Context, addrs []string, resolve func(ctx context.Context, host string) ([]string, error)) []string {
	var out []string
	for _, a := range addrs {
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
		ips, err := resolve(rctx, host)
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
