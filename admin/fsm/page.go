package fsm

import (
	"cmp"
	"container/heap"
	"iter"
	"maps"
	"slices"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// The *Page accessors serve the admin API's paged List calls: up to limit
// items whose keys sort after the previous page's last key, in key order,
// whether more follow, and the index they were read at. The tables are maps,
// so a page reads every key once, but sorts and copies only its own items: a
// page of a million-lease table costs a pass over the keys, not a sort and a
// copy of the table as a whole listing does.

// firstAfter returns, sorted, the (at most limit) smallest keys above after
// that keep accepts (nil: all), and whether more such keys exist. It holds a
// max-heap of the limit smallest seen so far, so a key larger than all of
// them costs one comparison.
func firstAfter[K cmp.Ordered](keys iter.Seq[K], after K, limit int, keep func(K) bool) ([]K, bool) {
	h := &maxHeap[K]{}
	more := false
	for k := range keys {
		if k <= after || (keep != nil && !keep(k)) {
			continue
		}
		switch {
		case h.Len() < limit:
			heap.Push(h, k)
		case limit > 0 && k < (*h)[0]:
			(*h)[0] = k
			heap.Fix(h, 0)
			more = true
		default:
			more = true
		}
	}
	out := []K(*h)
	slices.Sort(out)
	return out, more
}

type maxHeap[K cmp.Ordered] []K

func (h maxHeap[K]) Len() int           { return len(h) }
func (h maxHeap[K]) Less(i, j int) bool { return h[i] > h[j] }
func (h maxHeap[K]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *maxHeap[K]) Push(x any)        { *h = append(*h, x.(K)) }
func (h *maxHeap[K]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NamespacesPage is a page of Namespaces, after the namespace named after.
func (f *FSM) NamespacesPage(after string, limit int) ([]*adminv1.Namespace, bool, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	names, more := firstAfter(maps.Keys(f.st.namespaces), after, limit, nil)
	out := make([]*adminv1.Namespace, 0, len(names))
	for _, n := range names {
		out = append(out, proto.CloneOf(f.st.namespaces[n]))
	}
	return out, more, f.applied
}

// ProxiesPage is a page of Proxies, after proxy id after.
func (f *FSM) ProxiesPage(after string, limit int) ([]*adminv1.ProxyInfo, bool, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ids, more := firstAfter(maps.Keys(f.st.proxies), after, limit, nil)
	out := make([]*adminv1.ProxyInfo, 0, len(ids))
	for _, id := range ids {
		out = append(out, f.st.proxyInfo(f.st.proxies[id], f.st.namespacesOf(id)))
	}
	return out, more, f.applied
}

// LeasesPage is a page of Leases, after mailbox id after, of namespace and
// of proxyID when they are set. A namespace's page reads its own mailboxes
// only.
func (f *FSM) LeasesPage(after string, limit int, namespace, proxyID string) ([]*adminv1.Lease, bool, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	keys := maps.Keys(f.st.leases)
	if namespace != "" {
		keys = maps.Keys(f.st.namespaceLeases[namespace])
	}
	var keep func(string) bool
	if proxyID != "" {
		keep = func(id string) bool { return f.st.leases[id].GetProxyId() == proxyID }
	}
	ids, more := firstAfter(keys, after, limit, keep)
	out := make([]*adminv1.Lease, 0, len(ids))
	for _, id := range ids {
		out = append(out, proto.CloneOf(f.st.leases[id]))
	}
	return out, more, f.applied
}

// SessionsPage is a page of Sessions, after session id after (0: from the
// first), of proxyID when it is set.
func (f *FSM) SessionsPage(after uint64, limit int, proxyID string) ([]*adminv1.Session, bool, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var keep func(uint64) bool
	if proxyID != "" {
		keep = func(id uint64) bool { return f.st.sessions[id].GetProxyId() == proxyID }
	}
	ids, more := firstAfter(maps.Keys(f.st.sessions), after, limit, keep)
	out := make([]*adminv1.Session, 0, len(ids))
	for _, id := range ids {
		out = append(out, f.st.sessionView(f.st.sessions[id]))
	}
	return out, more, f.applied
}

// RoutesCursor is where a page of Routes starts: after mailbox After among
// the routes, or, once InNamespaces, after namespace After among the
// namespace routes, which follow every route.
type RoutesCursor struct {
	InNamespaces bool
	After        string
}

// RoutesPage is a page of Routes' two lists taken as one, the routes first:
// up to limit of them together, from c on, whether more follow, and the
// routes index.
func (f *FSM) RoutesPage(c RoutesCursor, limit int) ([]*adminv1.Route, []*adminv1.NamespaceRoute, bool, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var routes []*adminv1.Route
	if !c.InNamespaces {
		ids, more := firstAfter(maps.Keys(f.st.leases), c.After, limit, nil)
		for _, id := range ids {
			routes = append(routes, routeOf(f.st.leases[id]))
		}
		if more {
			return routes, nil, true, f.st.routesIndex
		}
		limit -= len(routes)
		c.After = ""
	}
	// A namespace whose only leased mailbox is its move's destination has
	// no route: left out here, so every item of a page has a key to go on
	// from.
	names, more := firstAfter(maps.Keys(f.st.namespaceLeases), c.After, limit, func(n string) bool {
		_, ok := f.st.namespaceRoute(n)
		return ok
	})
	nrs := make([]*adminv1.NamespaceRoute, 0, len(names))
	for _, n := range names {
		r, _ := f.st.namespaceRoute(n)
		nrs = append(nrs, r)
	}
	return routes, nrs, more, f.st.routesIndex
}
