// Package translator turns the routing IR into Envoy v3 resources. Translate
// is a pure function: the same IR always gives byte-identical resources.
//
// Resource layout (shared by the Envoy gateway and proxyless grpc-go):
//   - one EDS Cluster per runner ("runner/{id}") and its ClusterLoadAssignment;
//   - the "prism/notfound" EDS cluster: the admin nodes' xds/notfound service;
//   - one RouteConfiguration "mailbox-routes" with one virtual host;
//   - the socket Listener "gateway" (Envoy) and the API Listener
//     "mailbox-query" (grpc-go, target xds:///mailbox-query), both on RDS
//     "mailbox-routes" over ADS.
//
// Under ir.UpstreamTLS every cluster is mutual TLS and comes in two variants,
// grpc-go's and Envoy's (see CertProviderInstance). Under ir.QueryAuth Envoy
// gets its own gateway listener, checking tokens, and its own route table,
// "gateway-routes", scoping each route to its namespace (see queryauth.go);
// grpc-go's resources stay as they are. Everything else is shared.
//
// The route table is one resource sent whole on every change, and grpc-go's
// xDS client refuses messages over 4 MiB, so routes carry nothing optional:
// no names, no metadata, x-prism-* response headers only where the runner
// does not set them itself: about 255 bytes per mailbox with 17-character
// ids plus about 145 per namespace alias. Namespace header routes carry no
// x-prism-* response headers: grpc-go ignores them and the runner that
// serves a namespace names the real mailbox and epoch itself, and the 72
// bytes they cost per alias put 10,000 mailboxes with their aliases past
// grpc-go's 4 MiB limit (TestRouteTableFitsGRPCLimit guards it). Sharding
// the table (a header-only one for grpc-go) is the next step.
//
// Route order matters because the first match wins:
//  1. per mailbox, header x-mailbox-id exact → its runner, adding
//     x-prism-mailbox and x-prism-epoch. First, so a gRPC call (path
//     /prism.mailbox.v1.MailboxQuery/...) matches after one cheap compare
//     per mailbox;
//  2. per namespace alias, header x-prism-namespace exact → the current
//     mailbox's runner (the runner sets the response headers). grpc-go ignores path
//     rewrites and request-header additions, so a gRPC call for a namespace
//     can only be routed by a header it already carries, and the runner finds
//     the namespace's mailbox itself. After the mailbox header routes, so a
//     call naming both is routed by its mailbox, as the runner resolves it;
//  3. per mailbox, path prefix /v1/mailboxes/{id}/ with "$" and "@" raw or
//     percent-encoded, one prefix per form → its runner;
//  4. per namespace alias, /v1/namespaces/{ns}/... → the current mailbox's
//     runner, the path rewritten to /v1/mailboxes/{id}/... because runners only
//     serve that form (Envoy);
//  5. any other MailboxQuery call → "prism/notfound", whose server answers
//     NotFound. A direct response cannot serve gRPC: grpc-go fails RPCs that
//     match a non-forwarding route with UNAVAILABLE;
//  6. everything else → a direct 404 with a JSON body (the HTTP gateway).
package translator

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/xds/ir"
)

// Names shared with clients and the admin.
const (
	// RouteConfigName is the one RouteConfiguration both listeners use.
	RouteConfigName = "mailbox-routes"
	// GatewayListenerName is the Envoy gateway's socket listener.
	GatewayListenerName = "gateway"
	// NotFoundCluster is served by the admin nodes (xds/notfound).
	NotFoundCluster = "prism/notfound"
	// MailboxQueryPrefix is the gRPC path prefix of prism.mailbox.v1.MailboxQuery.
	MailboxQueryPrefix = "/prism.mailbox.v1.MailboxQuery/"
	// NotFoundBody is the gateway's answer for a request no route knows, in
	// the runners' error shape ({"error": message}).
	NotFoundBody = `{"error":"NOT_FOUND: no mailbox or namespace is routed at this path"}`
)

// ClusterName is the cluster of the runner with the given id.
func ClusterName(runnerID string) string { return "runner/" + runnerID }

// Resources is the translator's output, each list sorted by name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	// EnvoyClusters, when not nil, are what Envoy is served instead of
	// Clusters: the same clusters with Envoy's form of upstream TLS (see
	// CertProviderInstance). Nil in a plaintext mesh, where both data planes
	// take the same clusters.
	EnvoyClusters []*clusterv3.Cluster
	// EnvoyListeners and EnvoyRoutes, when not nil, are what Envoy is
	// served instead of Listeners and Routes: under ir.QueryAuth its
	// gateway listener checks tokens and routes by its own table,
	// GatewayRouteConfigName (see queryauth.go). Nil without query auth.
	EnvoyListeners []*listenerv3.Listener
	EnvoyRoutes    []*routev3.RouteConfiguration
}

// ByType returns the resources keyed by xDS type URL, as snapshots want
// them: grpc-go's variant.
func (r *Resources) ByType() map[resource.Type][]types.Resource {
	return r.byType(r.Listeners, r.Routes, r.Clusters)
}

// ForEnvoy is ByType with Envoy's variants where there are some.
func (r *Resources) ForEnvoy() map[resource.Type][]types.Resource {
	return r.byType(variant(r.EnvoyListeners, r.Listeners), variant(r.EnvoyRoutes, r.Routes), variant(r.EnvoyClusters, r.Clusters))
}

// variant is Envoy's list when it has its own (even an empty one).
func variant[T any](envoy, shared []T) []T {
	if envoy != nil {
		return envoy
	}
	return shared
}

func (r *Resources) byType(listeners []*listenerv3.Listener, routes []*routev3.RouteConfiguration, clusters []*clusterv3.Cluster) map[resource.Type][]types.Resource {
	out := map[resource.Type][]types.Resource{}
	for _, l := range listeners {
		out[resource.ListenerType] = append(out[resource.ListenerType], l)
	}
	for _, rc := range routes {
		out[resource.RouteType] = append(out[resource.RouteType], rc)
	}
	for _, c := range clusters {
		out[resource.ClusterType] = append(out[resource.ClusterType], c)
	}
	for _, e := range r.Endpoints {
		out[resource.EndpointType] = append(out[resource.EndpointType], e)
	}
	return out
}

type validator interface {
	proto.Message
	ValidateAll() error
}

// Translate converts x into Envoy resources. It keeps going past a bad object:
// the object is left out, its error joined into the returned error, and the
// resources for everything else are returned. The error is nil only when the
// whole IR translated.
func Translate(x *ir.IR) (*Resources, error) { return New().Translate(x) }

// Translator translates a sequence of IR states, reusing the built and
// validated routes of every mailbox and alias that did not change since the
// previous call: at 10,000 mailboxes a lease change then costs the table's
// assembly, not 20,000 route validations. Its output is exactly Translate's.
type Translator struct {
	mu        sync.Mutex
	mailboxes map[ir.Mailbox]idRoutesPair
	aliases   map[aliasKey]idRoutesPair
	// claim is the namespaces claim the remembered gateway routes check,
	// "" when they were built without query auth.
	claim string
}

// idRoutesPair is the header route and the path routes of one mailbox or
// namespace alias, and under query auth their twins in the Envoy gateway's
// table.
type idRoutesPair struct {
	header *routev3.Route
	path   []*routev3.Route
	gw     *idRoutesPair
}

func (p idRoutesPair) validate() error {
	return validateRoutes(append([]*routev3.Route{p.header}, p.path...))
}

type aliasKey struct {
	alias   ir.Alias
	mailbox ir.Mailbox
}

// New returns a Translator with nothing remembered.
func New() *Translator {
	return &Translator{mailboxes: map[ir.Mailbox]idRoutesPair{}, aliases: map[aliasKey]idRoutesPair{}}
}

// Translate is the package's Translate, remembering routes for the next call.
// The returned resources are shared with later results and must not be
// modified.
func (t *Translator) Translate(x *ir.IR) (*Resources, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if x == nil {
		return nil, errors.New("translate: nil IR")
	}
	v, irErr := x.Valid()
	errs := []error{}
	if irErr != nil {
		errs = append(errs, irErr)
	}
	out := &Resources{}
	runners := map[string]bool{}

	add := func(what string, m validator, keep func()) bool {
		if err := m.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return false
		}
		keep()
		return true
	}

	upTLS := v.Gateway.UpstreamTLS
	if upTLS.Enabled() {
		out.EnvoyClusters = []*clusterv3.Cluster{}
	}
	addCluster := func(what string, c *clusterv3.Cluster, san *matcherv3.StringMatcher) bool {
		if !upTLS.Enabled() {
			return add(what, c, func() { out.Clusters = append(out.Clusters, c) })
		}
		g, e, err := withTLS(c, san)
		if err == nil {
			err = e.ValidateAll()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return false
		}
		return add(what, g, func() {
			out.Clusters = append(out.Clusters, g)
			out.EnvoyClusters = append(out.EnvoyClusters, e)
		})
	}

	qa := v.Gateway.QueryAuth
	// An invalid setting has been reported by Valid; without it the
	// gateway listener is left out below, so Envoy refuses every query.
	auth := qa.Enabled() && qa.Validate() == nil

	nf, nfLA := notFoundCluster(v.NotFound)
	addCluster("cluster "+NotFoundCluster, nf, sanPrefix(upTLS, identity.Admin))
	add("endpoints "+NotFoundCluster, nfLA, func() { out.Endpoints = append(out.Endpoints, nfLA) })
	for _, r := range v.Runners {
		c, la := runnerCluster(r)
		if err := la.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("runner %q endpoints: %w", r.ID, err))
			continue
		}
		if addCluster("runner "+strconv.Quote(r.ID)+" cluster", c, runnerSAN(upTLS, r)) {
			out.Endpoints = append(out.Endpoints, la)
			runners[r.ID] = true
		}
	}
	if auth && qa.JWKSURL != "" {
		c, err := jwksCluster(qa)
		if err == nil {
			err = c.ValidateAll()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", JWKSCluster, err))
		} else {
			// Envoy's alone: grpc-go never fetches keys. "prism/jwks" sorts
			// first.
			if out.EnvoyClusters == nil {
				out.EnvoyClusters = slices.Clone(out.Clusters)
			}
			out.EnvoyClusters = append([]*clusterv3.Cluster{c}, out.EnvoyClusters...)
		}
	}
	// Clusters sort by name: "prism/..." sorts before "runner/...", and runners
	// are already sorted by id.

	claim := ""
	if auth {
		claim = qa.Claim()
	}
	rc, gwRC, rcErrs := t.routeConfig(v, runners, claim)
	errs = append(errs, rcErrs...)
	// Every route was validated on its own (so a bad one is skipped, not
	// the table); validating the table again would double the cost of the
	// largest resource, so only its shell is checked here.
	addTable := func(table *routev3.RouteConfiguration, to *[]*routev3.RouteConfiguration) {
		vh := table.GetVirtualHosts()[0]
		routes := vh.Routes
		vh.Routes = nil
		add("route configuration "+table.Name, table, func() { *to = append(*to, table) })
		vh.Routes = routes
	}
	addTable(rc, &out.Routes)

	// grpc-go's snapshot keeps the open gateway listener even under query
	// auth: grpc-go never asks for it, and it is what references
	// mailbox-routes there (a snapshot must reference every route table it
	// holds, and API listeners are not counted).
	gw, err := gatewayListener(v.Gateway.Address, ir.QueryAuth{})
	if err != nil {
		errs = append(errs, err)
	} else {
		add("listener "+GatewayListenerName, gw, func() { out.Listeners = append(out.Listeners, gw) })
	}
	api, err := apiListener()
	apiOK := err == nil
	if err != nil {
		errs = append(errs, err)
	} else {
		apiOK = add("listener "+mesh.QueryListenerName, api, func() { out.Listeners = append(out.Listeners, api) })
	}
	// Listeners sort by name: "gateway" < "mailbox-query".
	if qa.Enabled() {
		// Envoy's variant: its gateway listener checks tokens and routes by
		// the gateway table. Without a valid setting (Valid said why) or
		// that table, the listener is left out: Envoy serves no query
		// rather than serving them unchecked.
		out.EnvoyListeners, out.EnvoyRoutes = []*listenerv3.Listener{}, []*routev3.RouteConfiguration{}
		if gwRC != nil {
			addTable(gwRC, &out.EnvoyRoutes)
		}
		if len(out.EnvoyRoutes) > 0 {
			if egw, err := gatewayListener(v.Gateway.Address, qa); err != nil {
				errs = append(errs, err)
				out.EnvoyRoutes = out.EnvoyRoutes[:0]
			} else if !add("Envoy's listener "+GatewayListenerName, egw, func() { out.EnvoyListeners = append(out.EnvoyListeners, egw) }) {
				out.EnvoyRoutes = out.EnvoyRoutes[:0]
			}
		}
		if apiOK {
			out.EnvoyListeners = append(out.EnvoyListeners, api)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("translate version %d: %w", x.Version, err)
	}
	return out, nil
}

// routeConfig builds the route table both data planes share and, when
// claim is set (query auth), the Envoy gateway's own table, which checks it.
func (t *Translator) routeConfig(v *ir.IR, runners map[string]bool, claim string) (shared, gateway *routev3.RouteConfiguration, errs []error) {
	if claim != t.claim {
		// The remembered gateway routes check another claim, or none.
		t.mailboxes, t.aliases, t.claim = map[ir.Mailbox]idRoutesPair{}, map[aliasKey]idRoutesPair{}, claim
	}
	byID := map[string]ir.Mailbox{}
	var all, gw routeLists
	mailboxes := make(map[ir.Mailbox]idRoutesPair, len(v.Mailboxes))
	for _, m := range v.Mailboxes {
		if !runners[m.RunnerID] {
			errs = append(errs, fmt.Errorf("mailbox %q: runner %q has no cluster", m.ID, m.RunnerID))
			continue
		}
		mr, ok := t.mailboxes[m]
		if !ok {
			hr := headerRoute(mesh.HeaderMailboxID, m.ID, m)
			hr.ResponseHeadersToAdd = whoAnswered(m)
			mr = idRoutesPair{header: hr, path: mailboxPathRoutes(m)}
			err := mr.validate()
			if err == nil && claim != "" {
				var g idRoutesPair
				if g, err = authMailboxRoutes(claim, m); err == nil {
					err = g.validate()
				}
				mr.gw = &g
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("mailbox %q routes: %w", m.ID, err))
				continue
			}
		}
		mailboxes[m] = mr
		byID[m.ID] = m
		all.header = append(all.header, mr.header)
		all.path = append(all.path, mr.path...)
		if mr.gw != nil {
			gw.header = append(gw.header, mr.gw.header)
			gw.path = append(gw.path, mr.gw.path...)
		}
	}
	aliases := make(map[aliasKey]idRoutesPair, len(v.Aliases))
	for _, a := range v.Aliases {
		m, ok := byID[a.MailboxID]
		if !ok {
			errs = append(errs, fmt.Errorf("alias %q: mailbox %q has no route", a.Namespace, a.MailboxID))
			continue
		}
		key := aliasKey{alias: a, mailbox: m}
		r, ok := t.aliases[key]
		if !ok {
			r = idRoutesPair{header: headerRoute(mesh.HeaderNamespace, a.Namespace, m), path: namespaceAliasRoutes(a, m)}
			err := r.validate()
			if err == nil && claim != "" {
				var g idRoutesPair
				if g, err = authAliasRoutes(claim, a, m); err == nil {
					err = g.validate()
				}
				r.gw = &g
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("alias %q routes: %w", a.Namespace, err))
				continue
			}
		}
		aliases[key] = r
		all.aliasHeader = append(all.aliasHeader, r.header)
		all.alias = append(all.alias, r.path...)
		if r.gw != nil {
			gw.aliasHeader = append(gw.aliasHeader, r.gw.header)
			gw.alias = append(gw.alias, r.gw.path...)
		}
	}
	// Remember only what this state uses, so the memory follows the table.
	t.mailboxes, t.aliases = mailboxes, aliases
	shared = all.table(RouteConfigName)
	if claim != "" {
		gateway = gw.table(GatewayRouteConfigName)
	}
	return shared, gateway, errs
}

// routeLists are a table's routes by kind, in the order they are matched.
type routeLists struct {
	header, aliasHeader, path, alias []*routev3.Route
}

func (l routeLists) table(name string) *routev3.RouteConfiguration {
	routes := make([]*routev3.Route, 0, len(l.header)+len(l.aliasHeader)+len(l.path)+len(l.alias)+2)
	routes = append(routes, l.header...)
	routes = append(routes, l.aliasHeader...)
	routes = append(routes, l.path...)
	routes = append(routes, l.alias...)
	routes = append(routes, notFoundGRPCRoute(), notFoundHTTPRoute())
	return &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "mailboxes",
			Domains: []string{"*"},
			Routes:  routes,
		}},
	}
}

func validateRoutes(routes []*routev3.Route) error {
	var errs []error
	for _, r := range routes {
		errs = append(errs, r.ValidateAll())
	}
	return errors.Join(errs...)
}

// headerRoute sends requests whose header name is exactly value to m's
// runner.
func headerRoute(name, value string, m ir.Mailbox) *routev3.Route {
	return &routev3.Route{
		Match: &routev3.RouteMatch{
			PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
			Headers:       []*routev3.HeaderMatcher{exactHeader(name, value)},
		},
		Action: routeTo(m.RunnerID),
	}
}

// mailboxPathRoutes route /v1/mailboxes/{id}/... to the mailbox's runner.
// They carry no x-prism-* response headers: the runner's HTTP API sets them
// itself, and the table's size is what every change costs.
func mailboxPathRoutes(m ir.Mailbox) []*routev3.Route {
	return idRoutes("/v1/mailboxes/", m.ID, func(bool) *routev3.Route_Route { return routeTo(m.RunnerID) })
}

// namespaceAliasRoutes route /v1/namespaces/{ns}/... to the current
// mailbox's runner, rewriting the path to /v1/mailboxes/{id}/... because
// runners serve only that form.
func namespaceAliasRoutes(a ir.Alias, m ir.Mailbox) []*routev3.Route {
	target := "/v1/mailboxes/" + m.ID + "/"
	return idRoutes("/v1/namespaces/", a.Namespace, func(prefix bool) *routev3.Route_Route {
		action := routeTo(m.RunnerID)
		if prefix {
			action.Route.PrefixRewrite = target
		} else {
			action.Route.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{
				Pattern:      regex(`^/v1/namespaces/[^/]+/`),
				Substitution: escapeSubstitution(target),
			}
		}
		return action
	})
}

// idRoutes matches base + s + "/" with each "$" and "@" in s raw or
// percent-encoded (%24, %40), so curl's raw form, encodeURIComponent's and
// any mix route alike. With at most maxEncoded such characters every form
// is a prefix route: grpc-go parses the whole table on every change, and a
// prefix costs it nothing to compile where a regex costs ~30 µs. Rarer ids
// fall back to one regex route. action builds the route's action for a
// prefix (true) or regex (false) match.
func idRoutes(base, s string, action func(prefix bool) *routev3.Route_Route) []*routev3.Route {
	forms := pathForms(s)
	if forms == nil {
		return []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: regex(base + pathSegmentRegex(s) + "/.*")}},
			Action: action(false),
		}}
	}
	out := make([]*routev3.Route, 0, len(forms))
	for _, f := range forms {
		out = append(out, &routev3.Route{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: base + f + "/"}},
			Action: action(true),
		})
	}
	return out
}

// maxEncoded bounds the prefix routes of one id at 2^maxEncoded: a mailbox
// id has one "@", and "$admin@proxy" ids one "$" more.
const maxEncoded = 2

// pathForms returns every way s can appear in a URL path, each "$" and "@"
// raw or percent-encoded, or nil when s has more than maxEncoded of them.
// The other characters ir allows are unreserved and never encoded.
func pathForms(s string) []string {
	forms := []string{""}
	encoded := 0
	for _, r := range s {
		var enc string
		switch r {
		case '$':
			enc = "%24"
		case '@':
			enc = "%40"
		default:
			for i := range forms {
				forms[i] += string(r)
			}
			continue
		}
		if encoded++; encoded > maxEncoded {
			return nil
		}
		next := make([]string, 0, 2*len(forms))
		for _, f := range forms {
			next = append(next, f+string(r), f+enc)
		}
		forms = next
	}
	return forms
}

func notFoundGRPCRoute() *routev3.Route {
	return &routev3.Route{
		Name:   "mailbox-query-not-found",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: MailboxQueryPrefix}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: NotFoundCluster}}},
	}
}

func notFoundHTTPRoute() *routev3.Route {
	return &routev3.Route{
		Name:  "not-found",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
			Status: 404,
			Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: NotFoundBody}},
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "content-type", Value: "application/json"},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}
}

func routeTo(runnerID string) *routev3.Route_Route {
	return &routev3.Route_Route{Route: &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName(runnerID)},
	}}
}

// whoAnswered names the mailbox and epoch the route was built for, unless
// the runner already named itself: the runner knows the epoch it serves
// under, so its own word on who answered wins and the route's fills in.
func whoAnswered(m ir.Mailbox) []*corev3.HeaderValueOption {
	return []*corev3.HeaderValueOption{
		{Header: &corev3.HeaderValue{Key: mesh.HeaderMailbox, Value: m.ID}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
		{Header: &corev3.HeaderValue{Key: mesh.HeaderEpoch, Value: strconv.FormatUint(m.Epoch, 10)}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
	}
}

// pathSegmentRegex matches s in a URL path with each "$" and "@" either raw
// or percent-encoded (%24, %40), so curl's raw form and encodeURIComponent's
// both route. The other characters ir allows are unreserved and never encoded.
func pathSegmentRegex(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '$':
			b.WriteString(`(?:\$|%24)`)
		case '@':
			b.WriteString(`(?:@|%40)`)
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	return b.String()
}

// escapeSubstitution escapes backslashes, the only character RE2 treats
// specially in a substitution.
func escapeSubstitution(s string) string { return strings.ReplaceAll(s, `\`, `\\`) }

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
