package translator

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/rls" // registers grpc.lookup.v1's messages and the RLS policy
	_ "google.golang.org/grpc/xds"          // registers cds_experimental, RLS's child policy under xDS
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// request is what a route matcher looks at.
type request struct {
	path    string
	headers map[string]string
}

// match returns the first route r matches, as both data planes match: path
// prefix or RE2 safe_regex on the path without its query (Envoy's full
// match), and every header matcher (exact, suffix, present).
func match(routes []*routev3.Route, r request) *routev3.Route {
	path, _, _ := strings.Cut(r.path, "?")
next:
	for _, rt := range routes {
		m := rt.GetMatch()
		if re := m.GetSafeRegex(); re != nil {
			if !regexp.MustCompile("^(?:" + re.GetRegex() + ")$").MatchString(path) {
				continue
			}
		} else if !strings.HasPrefix(path, m.GetPrefix()) {
			continue
		}
		for _, h := range m.GetHeaders() {
			v, ok := r.headers[h.GetName()]
			switch {
			case h.GetPresentMatch():
				if !ok {
					continue next
				}
			case h.GetStringMatch().GetSuffix() != "":
				if !ok || !strings.HasSuffix(v, h.GetStringMatch().GetSuffix()) {
					continue next
				}
			case !ok || v != h.GetStringMatch().GetExact():
				continue next
			}
		}
		return rt
	}
	return nil
}

// target is where a matched route sends a request: a cluster, "rls", or
// the direct response's status.
func target(r *routev3.Route) string {
	switch {
	case r == nil:
		return "no route"
	case r.GetRoute().GetClusterSpecifierPlugin() != "":
		return "rls"
	case r.GetDirectResponse() != nil:
		return "404"
	}
	return r.GetRoute().GetCluster()
}

// proxies are ids chosen to be confused: prefixes, suffixes and a regex
// wildcard of one another.
var proxies = []string{"P", "aP", "P.x", "PXx", "p", "P-1", "x~P"}

func tables(t *testing.T, auth bool) (grpcGo, envoy []*routev3.Route) {
	t.Helper()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{"127.0.0.1:9"}, Lookup: "dns:///127.0.0.1:9"}
	if auth {
		x.Gateway.QueryAuth = ir.QueryAuth{Issuer: "i", Audience: "a", JWKSFile: "/jwks.json"}
	}
	for i, p := range proxies {
		x.Proxies = append(x.Proxies, ir.Proxy{ID: p, Address: "127.0.0.1:" + string(rune('1'+i)), Healthy: true})
	}
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range res.Routes {
		switch rc.GetName() {
		case RouteConfigName:
			grpcGo = rc.GetVirtualHosts()[0].GetRoutes()
		case GatewayRouteConfigName:
			envoy = rc.GetVirtualHosts()[0].GetRoutes()
		}
	}
	return grpcGo, envoy
}

// TestProxyRoutesPickExactlyTheProxy: a mailbox id's header picks its
// proxy in both tables, and its path, raw or percent-encoded, in Envoy's;
// ids of proxies named alike never cross.
func TestProxyRoutesPickExactlyTheProxy(t *testing.T) {
	t.Parallel()
	grpcGo, envoy := tables(t, false)
	for _, p := range proxies {
		for _, ns := range []string{"a", "$admin", "a.b~c"} {
			id := ns + "@" + p
			enc := strings.NewReplacer("$", "%24", "@", "%40").Replace(id)
			want := ClusterName(p)
			for _, tt := range []struct {
				name   string
				routes []*routev3.Route
				req    request
			}{
				{"grpc-go header", grpcGo, request{MailboxQueryPrefix + "GetStats", map[string]string{mesh.HeaderMailboxID: id}}},
				{"envoy header", envoy, request{MailboxQueryPrefix + "Search", map[string]string{mesh.HeaderMailboxID: id}}},
				{"envoy raw path", envoy, request{path: "/v1/mailboxes/" + id + "/events"}},
				{"envoy encoded path", envoy, request{path: "/v1/mailboxes/" + enc + "/events/m-1"}},
				{"envoy path with query", envoy, request{path: "/v1/mailboxes/" + id + "?limit=1"}},
				{"envoy bare path", envoy, request{path: "/v1/mailboxes/" + enc}},
			} {
				if got := target(match(tt.routes, tt.req)); got != want {
					t.Errorf("%s %q: routed to %s, want %s", tt.name, id, got, want)
				}
			}
		}
	}
	// Nothing routes an id of an unknown proxy, or a path that only starts
	// or ends like one, to a proxy.
	for _, tt := range []struct {
		name   string
		routes []*routev3.Route
		req    request
		want   string
	}{
		{"grpc-go unknown proxy", grpcGo, request{MailboxQueryPrefix + "GetStats", map[string]string{mesh.HeaderMailboxID: "a@Q"}}, AdminCluster},
		{"grpc-go id without proxy", grpcGo, request{MailboxQueryPrefix + "GetStats", map[string]string{mesh.HeaderMailboxID: "aP"}}, AdminCluster},
		{"envoy unknown proxy", envoy, request{path: "/v1/mailboxes/a@Q/events"}, "404"},
		{"envoy longer proxy", envoy, request{path: "/v1/mailboxes/a@P.xy/events"}, "404"},
		{"envoy proxy in the namespace", envoy, request{path: "/v1/mailboxes/P/events"}, "404"},
		{"envoy proxy after a slash", envoy, request{path: "/v1/mailboxes/a/@P/events"}, "404"},
		{"envoy other prefix", envoy, request{path: "/v2/mailboxes/a@P/events"}, "404"},
	} {
		if got := target(match(tt.routes, tt.req)); got != tt.want {
			t.Errorf("%s: routed to %s, want %s", tt.name, got, tt.want)
		}
	}
}

// TestNamespaceRoutes: a gRPC call naming only a namespace goes to RLS in
// grpc-go's table (a mailbox header wins over it), and Envoy's namespace
// paths end in the 404 unless ext_authz sets x-mailbox-id, after which the
// re-match picks the proxy.
func TestNamespaceRoutes(t *testing.T) {
	t.Parallel()
	grpcGo, envoy := tables(t, false)
	for _, tt := range []struct {
		name   string
		routes []*routev3.Route
		req    request
		want   string
	}{
		{"grpc-go namespace", grpcGo, request{MailboxQueryPrefix + "GetStats", map[string]string{mesh.HeaderNamespace: "audit"}}, "rls"},
		{"grpc-go mailbox and namespace", grpcGo, request{MailboxQueryPrefix + "GetStats", map[string]string{mesh.HeaderNamespace: "audit", mesh.HeaderMailboxID: "b@P"}}, ClusterName("P")},
		{"grpc-go neither", grpcGo, request{MailboxQueryPrefix + "GetStats", nil}, AdminCluster},
		{"envoy namespace path", envoy, request{path: "/v1/namespaces/audit/events"}, "404"},
		{"envoy namespace path after ext_authz", envoy, request{"/v1/namespaces/audit/events", map[string]string{mesh.HeaderMailboxID: "audit@P-1"}}, ClusterName("P-1")},
		{"envoy namespace gRPC", envoy, request{MailboxQueryPrefix + "GetStats", map[string]string{mesh.HeaderNamespace: "audit"}}, AdminCluster},
	} {
		if got := target(match(tt.routes, tt.req)); got != tt.want {
			t.Errorf("%s: routed to %s, want %s", tt.name, got, tt.want)
		}
	}
	if r := match(envoy, request{path: "/v1/namespaces/audit/events"}); r.GetDirectResponse().GetBody().GetInlineString() != NamespaceNotFoundBody {
		t.Errorf("namespace 404 body = %s", r.GetDirectResponse().GetBody().GetInlineString())
	}
}

// TestExtAuthzPerRoute pins where Envoy asks the admin nodes: the
// namespace routes always, the proxy routes under query auth, the
// catch-all 404 never.
func TestExtAuthzPerRoute(t *testing.T) {
	t.Parallel()
	for _, auth := range []bool{false, true} {
		x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Proxies: []ir.Proxy{{ID: "P", Address: "127.0.0.1:1", Healthy: true}}}
		if auth {
			x.Gateway.QueryAuth = ir.QueryAuth{Issuer: "i", Audience: "a", JWKSFile: "/jwks.json"}
		}
		res, err := Translate(x)
		if err != nil {
			t.Fatal(err)
		}
		vh := res.Routes[0].GetVirtualHosts()[0]
		if res.Routes[0].GetName() != GatewayRouteConfigName {
			t.Fatalf("first table %s", res.Routes[0].GetName())
		}
		disabled := func(cfgs map[string]*anypb.Any) (set, off bool) {
			a, ok := cfgs[extAuthzFilter]
			if !ok {
				return false, false
			}
			pr := &extauthzv3.ExtAuthzPerRoute{}
			if err := a.UnmarshalTo(pr); err != nil {
				t.Fatal(err)
			}
			return true, pr.GetDisabled()
		}
		_, vhOff := disabled(vh.GetTypedPerFilterConfig())
		got := ""
		for _, r := range vh.GetRoutes() {
			set, off := disabled(r.GetTypedPerFilterConfig())
			if !set {
				off = vhOff
			}
			got += map[bool]string{true: "-", false: "A"}[off]
		}
		// header P, path P, namespaces, MailboxQuery, catch-all.
		want := map[bool]string{false: "--AA-", true: "AAAA-"}[auth]
		if got != want {
			t.Errorf("query auth %v: ext_authz per route %q, want %q", auth, got, want)
		}
	}
}

// TestGRPCGoAcceptsRouteLookup: the RLS plugin's config is what grpc-go
// parses it into (its rls cluster specifier: the config as JSON, cds as the
// child policy), and the RLS policy accepts it.
func TestGRPCGoAcceptsRouteLookup(t *testing.T) {
	t.Parallel()
	a, err := routeLookupSpecifier("dns:///admin.prism.svc:9000")
	if err != nil {
		t.Fatal(err)
	}
	// Decoded as upstream's grpc.lookup.v1 message, registered by grpc-go.
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatalf("grpc-go's registry cannot read %s: %v", a.GetTypeUrl(), err)
	}
	rlc := m.ProtoReflect().Get(m.ProtoReflect().Descriptor().Fields().ByName("route_lookup_config")).Message().Interface()
	cfgJSON, err := protojson.Marshal(rlc)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := json.Marshal(map[string]any{
		"routeLookupConfig":                json.RawMessage(cfgJSON),
		"childPolicy":                      []map[string]any{{"cds_experimental": map[string]any{"isDynamic": true}}},
		"childPolicyConfigTargetFieldName": "cluster",
	})
	if err != nil {
		t.Fatal(err)
	}
	bb := balancer.Get("rls_experimental")
	if bb == nil {
		t.Fatal("RLS policy not registered")
	}
	if _, err := bb.(balancer.ConfigParser).ParseConfig(lb); err != nil {
		t.Fatalf("grpc-go's RLS policy refuses %s: %v", cfgJSON, err)
	}
	var got map[string]any
	if err := json.Unmarshal(cfgJSON, &got); err != nil {
		t.Fatal(err)
	}
	if got["defaultTarget"] != ir.AdminLookupCluster || got["lookupService"] != "dns:///admin.prism.svc:9000" {
		t.Errorf("config %s", cfgJSON)
	}
}

// TestLookupClustersAreRLSTargetsAlone: grpc-go's RLS answers name the
// lookup aggregates, so no route may name one (ir.LookupCluster says why),
// each is an aggregate over exactly the cluster it is named for, served to
// grpc-go with that cluster, there is one per proxy and one for the admin
// nodes, and Envoy, which has no RLS, is served none.
func TestLookupClustersAreRLSTargetsAlone(t *testing.T) {
	t.Parallel()
	x := readIR(t, "testdata/tls.in.yaml")
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]*clusterv3.Cluster{}
	for _, c := range res.Clusters {
		served[c.GetName()] = c
	}
	want := []string{ir.AdminCluster}
	for _, p := range x.Proxies {
		want = append(want, ClusterName(p.ID))
	}
	for _, leaf := range want {
		c := served[ir.LookupCluster(leaf)]
		if c == nil {
			t.Errorf("no %s", ir.LookupCluster(leaf))
			continue
		}
		cfg := &aggregatev3.ClusterConfig{}
		if c.GetClusterType().GetName() != aggregateClusterType || c.GetClusterType().GetTypedConfig().UnmarshalTo(cfg) != nil {
			t.Errorf("%s is not an aggregate cluster: %v", c.GetName(), c)
			continue
		}
		if !slices.Equal(cfg.GetClusters(), []string{leaf}) || served[leaf].GetType() != clusterv3.Cluster_EDS {
			t.Errorf("%s aggregates %v, want the served EDS cluster %s", c.GetName(), cfg.GetClusters(), leaf)
		}
		if c.GetTransportSocket() != nil || c.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN {
			t.Errorf("%s carries TLS or an lb_policy grpc-go refuses: %v", c.GetName(), c)
		}
	}
	if len(res.Clusters) != 2*len(want) {
		t.Errorf("grpc-go is served %d clusters, want %d", len(res.Clusters), 2*len(want))
	}
	for _, rc := range res.Routes {
		for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
			if name := r.GetRoute().GetCluster(); strings.HasPrefix(name, ir.LookupCluster("")) {
				t.Errorf("table %s routes to %s", rc.GetName(), name)
			}
		}
	}
	for _, c := range res.EnvoyClusters {
		if c.GetClusterType() != nil {
			t.Errorf("Envoy is served %s", c.GetName())
		}
	}

	x.Lookup = ""
	without, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	if len(without.Clusters) != len(want) {
		t.Errorf("without a lookup target grpc-go is served %d clusters, want %d (no aggregates)", len(without.Clusters), len(want))
	}
}
