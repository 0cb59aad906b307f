package fsm

import (
	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// Every accessor reads under the lock and returns copies the caller owns,
// with the applied index they were read at; lists are sorted by key.

// Proxies returns every proxy with its computed partitions and namespaces.
func (f *FSM) Proxies() ([]*adminv1.ProxyInfo, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	// One pass over the namespaces for every proxy, not one per proxy.
	byProxy := f.st.namespacesByProxy()
	out := make([]*adminv1.ProxyInfo, 0, len(f.st.proxies))
	for _, p := range sortedValues(f.st.proxies) {
		out = append(out, f.st.proxyInfo(p, byProxy[p.GetRegistration().GetProxyId()]))
	}
	return out, f.applied
}

// HasProxy reports whether proxy id is registered.
func (f *FSM) HasProxy(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.st.proxies[id]
	return ok
}

// ProxyRecords returns every proxy's record alone (registration, last
// heartbeat, staleness), without its partitions and namespaces: what the
// leader's stale-proxy loop reads every tick, in O(proxies).
func (f *FSM) ProxyRecords() []*adminv1.Proxy {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]*adminv1.Proxy, 0, len(f.st.proxies))
	for _, p := range sortedValues(f.st.proxies) {
		out = append(out, proto.CloneOf(p))
	}
	return out
}

// Proxy returns one proxy, or nil.
func (f *FSM) Proxy(id string) (*adminv1.ProxyInfo, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.st.proxies[id]
	if !ok {
		return nil, f.applied
	}
	return f.st.proxyInfo(p, f.st.namespacesOf(id)), f.applied
}

// Namespaces returns every namespace.
func (f *FSM) Namespaces() ([]*adminv1.Namespace, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]*adminv1.Namespace, 0, len(f.st.namespaces))
	for _, n := range sortedValues(f.st.namespaces) {
		out = append(out, proto.CloneOf(n))
	}
	return out, f.applied
}

// Namespace returns one namespace and where its alias routes (nil when no
// mailbox of it holds a lease); the namespace is nil if it does not exist.
func (f *FSM) Namespace(name string) (*adminv1.Namespace, *adminv1.NamespaceRoute, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, ok := f.st.namespaces[name]
	if !ok {
		return nil, nil, f.applied
	}
	route, _ := f.st.namespaceRoute(name)
	return proto.CloneOf(n), route, f.applied
}

// NamespaceRoute is where namespace ns's alias routes: the mailbox on its
// assigned proxy when that holds a lease, else its newest grant; false when
// no mailbox of ns holds a lease. It reads ns's mailboxes only, so the
// lookup the admin nodes serve costs the same at a million leases.
func (f *FSM) NamespaceRoute(ns string) (*adminv1.NamespaceRoute, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.namespaceRoute(ns)
}

// Leases returns every lease as last written through Raft. On the leader,
// package lease has fresher expiry times for them.
func (f *FSM) Leases() ([]*adminv1.Lease, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]*adminv1.Lease, 0, len(f.st.leases))
	for _, l := range sortedValues(f.st.leases) {
		out = append(out, proto.CloneOf(l))
	}
	return out, f.applied
}

// Lease returns a mailbox's lease, or nil.
func (f *FSM) Lease(mailboxID string) (*adminv1.Lease, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l, ok := f.st.leases[mailboxID]
	if !ok {
		return nil, f.applied
	}
	return proto.CloneOf(l), f.applied
}

// Routes returns one route per lease and the namespace alias routes, with
// the index of the last change to either. That index is the same on every
// replica for the same routes, so it serves as the xDS snapshot version.
func (f *FSM) Routes() ([]*adminv1.Route, []*adminv1.NamespaceRoute, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	routes := make([]*adminv1.Route, 0, len(f.st.leases))
	for _, l := range sortedValues(f.st.leases) {
		routes = append(routes, routeOf(l))
	}
	return routes, sortedValues(f.st.namespaceRoutes()), f.st.routesIndex
}

// RoutesIndex is the index Routes would report, without copying anything:
// watchers call it after every change and copy the routes only when it moved,
// since most changes (lease checkpoints, proxy heartbeats) leave routes alone.
func (f *FSM) RoutesIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.routesIndex
}

// ProxyRoutesIndex is the index of the last change to anything routing takes
// from proxies: one registered, or registered again with another address or
// runner_id, or its stale status or its runner's readiness flipped. Leases,
// and heartbeats that change neither, leave it, so the per-proxy routes are
// rebuilt only when it moves. Every replica agrees.
func (f *FSM) ProxyRoutesIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.proxyRoutesIndex
}

// Route returns a mailbox's route, or nil.
func (f *FSM) Route(mailboxID string) (*adminv1.Route, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l, ok := f.st.leases[mailboxID]
	if !ok {
		return nil, f.applied
	}
	return routeOf(l), f.applied
}

// Assignments returns what WatchAssignments sends a proxy: its namespaces
// (sorted), partition ranges, and whether any proxy can take a namespace.
// An unknown or stale proxy has no namespaces.
func (f *FSM) Assignments(proxyID string) (*adminv1.WatchAssignmentsResponse, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &adminv1.WatchAssignmentsResponse{
		ProxyId:          proxyID,
		Index:            f.applied,
		Assignments:      f.st.assignments(proxyID),
		PartitionRanges:  f.st.table.Ranges(proxyID),
		NoPlaceableProxy: f.st.table == placement.Table{},
	}, f.applied
}

// Counts is the size of each table, for cluster status and metrics.
type Counts struct {
	Proxies, LiveProxies, Namespaces, Leases, Sessions int
}

// Counts returns the table sizes.
func (f *FSM) Counts() Counts {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return Counts{
		Proxies:     len(f.st.proxies),
		LiveProxies: f.st.liveProxyCount(),
		Namespaces:  len(f.st.namespaces),
		Leases:      len(f.st.leases),
		Sessions:    len(f.st.sessions),
	}
}

// liveProxyCount is len(liveProxyIDs()) without sorting: Counts runs on
// every write's admission.
func (s *state) liveProxyCount() int {
	n := 0
	for _, p := range s.proxies {
		if p.GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_LIVE {
			n++
		}
	}
	return n
}

// ProxyLeases is how many leases proxy holds, for its quota: read from the
// replicated table, so every node answers the same at the same index.
func (f *FSM) ProxyLeases(proxyID string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.proxyLeases[proxyID]
}
