package cache

import (
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// patch returns the resources of next built from those of last, when next
// differs from last only in some proxies' runner (address, health, runner
// id): a runner moving, restarting or going stale. Those reach nothing but
// the proxy's ClusterLoadAssignment, so only the changed proxies are
// translated and every other resource keeps its object from last. Set then
// compares the unchanged resources by pointer, and the shared marshaled
// bytes stay valid, instead of translating and walking all of them: at
// 1,000 proxies that was most of a runner move's admin CPU.
//
// ok is false whenever that does not hold or cannot be checked cheaply (the
// proxies, admins, lookup or gateway differ, a changed proxy fails to
// translate, its cluster would change), and the caller translates next
// whole. last must have translated without error: Translate leaves invalid
// objects out, which a patch would not reproduce. The translator stays the
// only author of every resource; TestPatchIsTranslate holds the two paths
// to the same output.
func patch(last *ir.IR, lastRes *translator.Resources, next *ir.IR) (res *translator.Resources, ok bool) {
	if last == nil || lastRes == nil {
		return nil, false
	}
	a, b := last.Sorted(), next.Sorted()
	if a.Gateway != b.Gateway || !slices.Equal(a.Admins, b.Admins) || a.Lookup != b.Lookup || len(a.Proxies) != len(b.Proxies) {
		return nil, false
	}
	var changed []ir.Proxy
	for i, p := range b.Proxies {
		if a.Proxies[i].ID != p.ID {
			return nil, false
		}
		if a.Proxies[i] != p {
			changed = append(changed, p)
		}
	}
	if len(changed) == 0 {
		return nil, false
	}
	sub, err := translator.Translate(&ir.IR{Version: next.Version, Gateway: next.Gateway, Admins: next.Admins, Lookup: next.Lookup, Proxies: changed})
	if err != nil {
		return nil, false
	}
	endpoints := make(map[string]*endpointv3.ClusterLoadAssignment, len(changed))
	for _, p := range changed {
		name := translator.ClusterName(p.ID)
		la := find(sub.Endpoints, name, (*endpointv3.ClusterLoadAssignment).GetClusterName)
		if la == nil ||
			!sameCluster(lastRes.Clusters, sub.Clusters, name) ||
			!sameCluster(lastRes.EnvoyClusters, sub.EnvoyClusters, name) {
			return nil, false
		}
		endpoints[name] = la
	}
	out := *lastRes
	out.Endpoints = slices.Clone(lastRes.Endpoints)
	replaced := 0
	for i, la := range out.Endpoints {
		if n, ok := endpoints[la.GetClusterName()]; ok {
			out.Endpoints[i] = n
			replaced++
		}
	}
	if replaced != len(endpoints) {
		return nil, false
	}
	return &out, true
}

// sameCluster reports whether the cluster name is the same in both lists,
// by content: a change that reached it needs the whole translation.
func sameCluster(last, sub []*clusterv3.Cluster, name string) bool {
	a := find(last, name, (*clusterv3.Cluster).GetName)
	b := find(sub, name, (*clusterv3.Cluster).GetName)
	if a == nil || b == nil {
		return a == b
	}
	return equal(a.ProtoReflect(), b.ProtoReflect())
}

// find returns the element of list named name, or the zero T.
func find[T any](list []T, name string, nameOf func(T) string) T {
	if i := slices.IndexFunc(list, func(e T) bool { return nameOf(e) == name }); i >= 0 {
		return list[i]
	}
	var zero T
	return zero
}
