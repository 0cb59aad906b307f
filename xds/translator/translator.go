// Package translator turns the routing IR into Envoy v3 resources. Translate
// is a pure function: the same IR always gives byte-identical resources.
//
// Routes are per proxy, not per mailbox. Every mailbox id names its proxy
// ("{namespace}@{proxy}", one "@", none in the proxy id), and the admin
// grants "ns@P" only to the runner registered as proxy P, which serves a
// mailbox only while it holds its lease and answers NotFound naming the
// mailbox otherwise. So a route that is a pure function of the id cannot
// reach a wrong holder, the tables are O(proxies), and acquiring, renewing,
// releasing or re-granting a lease puts nothing on the wire; a runner that
// restarts on a new address changes one EDS resource.
//
// Resources:
//   - per proxy P the EDS cluster "proxy/P" and its ClusterLoadAssignment:
//     one endpoint, the runner's address, UNHEALTHY while P is stale;
//   - "prism/admin", EDS over the admin nodes: xds/notfound's MailboxQuery,
//     the namespace lookup (grpc-go's RLS) and Envoy's ext_authz;
//   - "prism/jwks" under query auth with a JWKS URL (Envoy's alone);
//   - grpc-go's alone, when the IR names a Lookup target: per proxy the
//     aggregate cluster "lookup/proxy/P" over proxy/P, and
//     "lookup/prism/admin" over prism/admin, the clusters RLS answers name
//     (ir.LookupCluster says why no route's cluster can be an RLS target);
//   - grpc-go's table "mailbox-routes", named by the API listener
//     "mailbox-query" (target xds:///mailbox-query);
//   - Envoy's table "gateway-routes", named by the socket listener
//     "gateway", with ext_authz and, under query auth, jwt_authn before it.
//
// Each data plane is served its own listener and the table it names
// (Resources.ForEnvoy, ForGRPC): Envoy the socket listener "gateway",
// grpc-go the API listener "mailbox-query". Both are served the same
// endpoints. Clusters differ, hence Resources.EnvoyClusters: grpc-go's carry
// only what grpc-go reads (see grpcCluster) and the lookup aggregates,
// Envoy's its connection settings, health checks and prism/jwks, and under
// ir.UpstreamTLS each its own form of TLS (see CertProviderInstance).
//
// grpc-go's table, first match wins:
//  1. per proxy P, header x-mailbox-id with suffix "@P" → proxy/P;
//  2. header x-prism-namespace present → grpc-go's RLS cluster specifier
//     plugin (only when the IR names a Lookup target): the admin nodes
//     answer with the cluster lookup/proxy/Q of the namespace's current
//     mailbox ns@Q, or lookup/prism/admin when none; grpc-go caches the
//     answer (see rls.go). Every grpc-go program reading this table must import
//     google.golang.org/grpc/balancer/rls: the plugin itself is always
//     registered by grpc-go's xDS package, and without the RLS policy it
//     refuses (NACKs) the whole table;
//  3. any other MailboxQuery call → prism/admin, answering NotFound naming
//     the mailbox or namespace. A direct response cannot serve gRPC: grpc-go
//     fails RPCs matching a non-forwarding route with UNAVAILABLE.
//
// Envoy's table, first match wins:
//  1. per proxy P, header x-mailbox-id with suffix "@P" → proxy/P;
//  2. per proxy P, path /v1/mailboxes/{ns}@P/... with "@" raw or %40 →
//     proxy/P (one RE2 regex per proxy; "$" in the namespace needs no care,
//     the regex does not look at it);
//  3. /v1/namespaces/... → a direct JSON 404 (namespace not routed);
//  4. any other MailboxQuery call → prism/admin;
//  5. anything else → a direct JSON 404 (NotFoundBody).
//
// Namespaces (/v1/namespaces/{ns}/..., header x-prism-namespace) change
// owner on every move and number in the millions, so they are not routes:
// Envoy's ext_authz asks the admin nodes on routes 3 and 4, and when the
// namespace is routed they set x-mailbox-id: ns@Q and Envoy re-matches
// (clear_route_cache), landing on route 1 for Q, whose runner serves
// /v1/namespaces/{ns}/... itself. ext_authz rather than an internal
// redirect: Envoy has no RLS plugin, a redirect needs a 3xx from some
// upstream that knows the owner plus a second pass through the filter
// chain, and ext_authz keeps the lookup and, under query auth, the token's
// namespace check in one Go service (gateway/auth's rules) instead of
// per-route RBAC that would have to name every namespace. Under query auth
// ext_authz runs on routes 1 to 4, after jwt_authn has verified the token
// (see queryauth.go).
package translator

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/xds/ir"
)

// Names shared with clients and the admin.
const (
	// RouteConfigName is grpc-go's route table.
	RouteConfigName = "mailbox-routes"
	// GatewayRouteConfigName is the Envoy gateway's route table.
	GatewayRouteConfigName = "gateway-routes"
	// GatewayListenerName is the Envoy gateway's socket listener.
	GatewayListenerName = "gateway"
	// AdminCluster is served by the admin nodes: xds/notfound's
	// MailboxQuery, the RLS lookup and ext_authz.
	AdminCluster = ir.AdminCluster
	// MailboxQueryPrefix is the gRPC path prefix of prism.mailbox.v1.MailboxQuery.
	MailboxQueryPrefix = "/prism.mailbox.v1.MailboxQuery/"
	// NamespacesPrefix is the HTTP API's namespace paths.
	NamespacesPrefix = "/v1/namespaces/"
	// NotFoundBody is the gateway's answer for a request no route knows, in
	// the runners' error shape ({"error": message}).
	NotFoundBody = `{"error":"NOT_FOUND: no mailbox or namespace is routed at this path"}`
	// NamespaceNotFoundBody is the gateway's answer for a namespace path
	// the lookup did not route.
	NamespaceNotFoundBody = `{"error":"NOT_FOUND: namespace is not routed: no live lease serves it"}`
)

// ClusterName is the cluster of the proxy with the given id.
func ClusterName(proxyID string) string { return ir.ProxyCluster(proxyID) }

// Resources is the translator's output, each list sorted by name.
// Listeners and Routes hold both data planes' (ForEnvoy and ForGRPC part
// them by listener kind).
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	// EnvoyClusters are what Envoy is served instead of Clusters (see
	// envoyCluster): Translate always sets them. Nil, as in a Resources
	// built by hand, means Envoy takes Clusters.
	EnvoyClusters []*clusterv3.Cluster
}

// ForGRPC is what grpc-go clients are served, keyed by xDS type URL as
// snapshots want them: the API listeners, the route tables they name, and
// Clusters. A socket listener is of no use to a client (grpc-go binds none:
// its xDS servers ask for listeners by a name template Prism never serves).
func (r *Resources) ForGRPC() map[resource.Type][]types.Resource {
	return r.byType(isAPIListener, r.Clusters)
}

// ForEnvoy is what Envoy is served: the socket listeners, the route tables
// they name, and EnvoyClusters (Clusters when nil). Envoy binds only
// listeners with an address and skips an api_listener from LDS with a
// warning, so it is not sent one.
func (r *Resources) ForEnvoy() map[resource.Type][]types.Resource {
	clusters := r.Clusters
	if r.EnvoyClusters != nil {
		clusters = r.EnvoyClusters
	}
	return r.byType(func(l *listenerv3.Listener) bool { return !isAPIListener(l) }, clusters)
}

func isAPIListener(l *listenerv3.Listener) bool { return l.GetApiListener() != nil }

// byType keeps the listeners mine says are the client's and leaves out the
// route tables only the other listeners name; a table no listener names
// (built by hand, as in tests) goes to both.
func (r *Resources) byType(mine func(*listenerv3.Listener) bool, clusters []*clusterv3.Cluster) map[resource.Type][]types.Resource {
	out := map[resource.Type][]types.Resource{}
	named, others := map[string]bool{}, map[string]bool{}
	for _, l := range r.Listeners {
		if mine(l) {
			out[resource.ListenerType] = append(out[resource.ListenerType], l)
			addTables(named, l)
		} else {
			addTables(others, l)
		}
	}
	for _, rc := range r.Routes {
		if named[rc.GetName()] || !others[rc.GetName()] {
			out[resource.RouteType] = append(out[resource.RouteType], rc)
		}
	}
	for _, c := range clusters {
		out[resource.ClusterType] = append(out[resource.ClusterType], c)
	}
	for _, e := range r.Endpoints {
		out[resource.EndpointType] = append(out[resource.EndpointType], e)
	}
	return out
}

// addTables adds the route tables l's connection managers name over RDS.
// A configuration that does not unmarshal names none, so its table goes to
// both variants rather than to neither.
func addTables(into map[string]bool, l *listenerv3.Listener) {
	configs := []*anypb.Any{l.GetApiListener().GetApiListener()}
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			configs = append(configs, f.GetTypedConfig())
		}
	}
	for _, a := range configs {
		hcm := &hcmv3.HttpConnectionManager{}
		if !a.MessageIs(hcm) || a.UnmarshalTo(hcm) != nil {
			continue
		}
		if name := hcm.GetRds().GetRouteConfigName(); name != "" {
			into[name] = true
		}
	}
}

type validator interface {
	proto.Message
	ValidateAll() error
}

// Translate converts x into Envoy resources. It keeps going past a bad object:
// the object is left out, its error joined into the returned error, and the
// resources for everything else are returned. The error is nil only when the
// whole IR translated.
func Translate(x *ir.IR) (*Resources, error) {
	if x == nil {
		return nil, errors.New("translate: nil IR")
	}
	v, irErr := x.Valid()
	var errs []error
	if irErr != nil {
		errs = append(errs, irErr)
	}
	out := &Resources{}
	add := func(what string, m validator, keep func()) bool {
		if err := m.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return false
		}
		keep()
		return true
	}

	upTLS := v.Gateway.UpstreamTLS
	out.EnvoyClusters = []*clusterv3.Cluster{}
	// addCluster adds the EDS cluster name in both variants, each with its
	// form of TLS accepting a peer whose URI SAN matches san.
	addCluster := func(what, name string, san *matcherv3.StringMatcher) bool {
		g, e := grpcCluster(name), envoyCluster(name)
		if upTLS.Enabled() {
			if err := withTLS(g, e, san); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
				return false
			}
		}
		if err := e.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return false
		}
		return add(what, g, func() {
			out.Clusters = append(out.Clusters, g)
			out.EnvoyClusters = append(out.EnvoyClusters, e)
		})
	}
	// addLookup adds grpc-go's aggregate over cluster, which RLS answers
	// name; only the RLS route needs them.
	addLookup := func(cluster string) {
		if v.Lookup == "" {
			return
		}
		c, err := lookupCluster(cluster)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", ir.LookupCluster(cluster), err))
			return
		}
		add("cluster "+c.GetName(), c, func() { out.Clusters = append(out.Clusters, c) })
	}

	qa := v.Gateway.QueryAuth
	// An invalid setting has been reported by Valid; the gateway listener
	// is then left out below, so Envoy refuses every query.
	authOK := !qa.Enabled() || qa.Validate() == nil

	admLA := adminEndpoints(v.Admins)
	if addCluster("cluster "+AdminCluster, AdminCluster, sanPrefix(upTLS, identity.Admin)) {
		add("endpoints "+AdminCluster, admLA, func() { out.Endpoints = append(out.Endpoints, admLA) })
		addLookup(AdminCluster)
	}
	var proxies []ir.Proxy
	for _, p := range v.Proxies {
		la := proxyEndpoints(p)
		if err := la.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("proxy %q endpoints: %w", p.ID, err))
			continue
		}
		if addCluster("proxy "+strconv.Quote(p.ID)+" cluster", ClusterName(p.ID), proxySAN(upTLS, p.ID)) {
			out.Endpoints = append(out.Endpoints, la)
			addLookup(ClusterName(p.ID))
			proxies = append(proxies, p)
		}
	}
	if qa.Enabled() && authOK && qa.JWKSURL != "" {
		c, err := jwksCluster(qa)
		if err == nil {
			err = c.ValidateAll()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", JWKSCluster, err))
		} else {
			// Envoy's alone: grpc-go never fetches keys.
			out.EnvoyClusters = append(out.EnvoyClusters, c)
		}
	}
	// Clusters sort by name: "lookup/..." < "prism/admin" < "prism/jwks" <
	// "proxy/...".
	byName := func(a, b *clusterv3.Cluster) int { return cmp.Compare(a.GetName(), b.GetName()) }
	slices.SortFunc(out.Clusters, byName)
	slices.SortFunc(out.EnvoyClusters, byName)

	if authOK {
		gw, err := gatewayListener(v.Gateway.Address, qa)
		if err != nil {
			errs = append(errs, err)
		} else if add("listener "+GatewayListenerName, gw, func() { out.Listeners = append(out.Listeners, gw) }) {
			table, err := gatewayRoutes(proxies, qa.Enabled())
			if err != nil {
				errs = append(errs, err)
				// A listener naming a table that is not served would hold
				// Envoy's listener warming forever; serve neither.
				out.Listeners = out.Listeners[:0]
			} else {
				out.Routes = append(out.Routes, table)
			}
		}
	}
	api, err := apiListener()
	if err != nil {
		errs = append(errs, err)
	} else if add("listener "+mesh.QueryListenerName, api, func() { out.Listeners = append(out.Listeners, api) }) {
		table, err := grpcRoutes(proxies, v.Lookup)
		if err != nil {
			errs = append(errs, err)
			out.Listeners = out.Listeners[:len(out.Listeners)-1]
		} else {
			out.Routes = append(out.Routes, table)
		}
	}
	// Listeners sort by name ("gateway" < "mailbox-query"), and so do their
	// tables ("gateway-routes" < "mailbox-routes").
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("translate version %d: %w", x.Version, err)
	}
	return out, nil
}

func splitAddress(addr string) (string, uint32, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", port, err)
	}
	return host, uint32(p), nil
}

// connectTimeout bounds a connection attempt to a runner: runners are on the
// same network, so a slow connect means a dead one.
const connectTimeout = 2 * time.Second
