package xds

import (
	"context"
	"maps"

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

// routesIndexer is an optional cheap read of the routes index: with it,
// Follow copies the routes only when they changed, not on every heartbeat
// checkpoint the FSM applies.
type routesIndexer interface {
	RoutesIndex() uint64
}

// Follow keeps the control plane on src's routing state until ctx ends. After
// every FSM change it re-reads the routes and which proxies are stale, and
// hands over a new state when either moved. The version is always the routes
// index, the same on every replica; a stale-proxy change, which has no index
// of its own, is served under a suffixed label of it (see cache.Cache.Set).
// gateway and notFound (this cluster's admin gRPC addresses) complete the IR.
func (cp *ControlPlane) Follow(ctx context.Context, src Source, gateway ir.Gateway, notFound []string) error {
	var (
		lastRoutes uint64
		lastStale  map[string]bool
		started    bool
	)
	for {
		_, changed := src.Changed()
		proxies, _ := src.Proxies()
		stale := map[string]bool{}
		for _, p := range proxies {
			if p.GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_STALE {
				stale[p.GetProxy().GetRegistration().GetProxyId()] = true
			}
		}
		staleMoved := started && !maps.Equal(stale, lastStale)
		routesMoved := true
		if ri, ok := src.(routesIndexer); ok && started {
			routesMoved = ri.RoutesIndex() != lastRoutes
		}
		var (
			routes      []*adminv1.Route
			aliases     []*adminv1.NamespaceRoute
			routesIndex = lastRoutes
		)
		if routesMoved || staleMoved {
			routes, aliases, routesIndex = src.Routes()
		}
		if !started || routesIndex != lastRoutes || staleMoved {
			cp.Update(ir.FromAdmin(ir.AdminState{
				// 1: an FSM that never had a route still serves listeners.
				Routes: routes, NamespaceRoutes: aliases, RoutesIndex: max(routesIndex, 1),
				StaleProxies: stale, Gateway: gateway, NotFound: notFound,
			}))
			lastRoutes, lastStale, started = routesIndex, stale, true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
