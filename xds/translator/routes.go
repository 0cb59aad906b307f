package translator

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// rlsPluginName names the RLS cluster specifier plugin in grpc-go's table.
const rlsPluginName = "namespace-lookup"

// grpcRoutes is grpc-go's table (see the package doc). Routes carry no
// names and no x-prism-* response headers: the runner sets those, and the
// table is what a proxy joining costs every client.
func grpcRoutes(proxies []ir.Proxy, lookup string) (*routev3.RouteConfiguration, error) {
	routes := make([]*routev3.Route, 0, len(proxies)+2)
	for _, p := range proxies {
		routes = append(routes, headerRoute(p.ID))
	}
	rc := &routev3.RouteConfiguration{Name: RouteConfigName}
	if lookup != "" {
		spec, err := routeLookupSpecifier(lookup)
		if err != nil {
			return nil, fmt.Errorf("route configuration %s: %w", RouteConfigName, err)
		}
		rc.ClusterSpecifierPlugins = []*routev3.ClusterSpecifierPlugin{{
			Extension: &corev3.TypedExtensionConfig{Name: rlsPluginName, TypedConfig: spec},
		}}
		routes = append(routes, &routev3.Route{
			Match: &routev3.RouteMatch{
				PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: MailboxQueryPrefix},
				Headers: []*routev3.HeaderMatcher{{
					Name:                 mesh.HeaderNamespace,
					HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
				}},
			},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_ClusterSpecifierPlugin{ClusterSpecifierPlugin: rlsPluginName},
			}},
		})
	}
	routes = append(routes, mailboxQueryNotFound())
	rc.VirtualHosts = []*routev3.VirtualHost{{Name: "mailboxes", Domains: []string{"*"}, Routes: routes}}
	if err := rc.ValidateAll(); err != nil {
		return nil, fmt.Errorf("route configuration %s: %w", RouteConfigName, err)
	}
	return rc, nil
}

// gatewayRoutes is Envoy's table (see the package doc). Without query auth
// ext_authz is off for the virtual host and on for the two routes that
// need it (namespace lookup); under query auth it is on everywhere but the
// catch-all 404, where there is nothing to check. Either way no proxy
// route carries a per-route config, which would cost about 120 bytes each.
func gatewayRoutes(proxies []ir.Proxy, auth bool) (*routev3.RouteConfiguration, error) {
	on, err := extAuthzPerRoute(false)
	if err != nil {
		return nil, err
	}
	off, err := extAuthzPerRoute(true)
	if err != nil {
		return nil, err
	}
	routes := make([]*routev3.Route, 0, 2*len(proxies)+3)
	for _, p := range proxies {
		routes = append(routes, headerRoute(p.ID))
	}
	for _, p := range proxies {
		routes = append(routes, &routev3.Route{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: regex(mailboxPathRegex(p.ID))}},
			Action: routeTo(p.ID),
		})
	}
	namespaces, query, catchAll := notFound("namespace-not-found", NamespacesPrefix, NamespaceNotFoundBody), mailboxQueryNotFound(), notFound("not-found", "/", NotFoundBody)
	routes = append(routes, namespaces, query, catchAll)
	vh := &routev3.VirtualHost{Name: "mailboxes", Domains: []string{"*"}, Routes: routes, RetryPolicy: envoyRetryPolicy()}
	if auth {
		catchAll.TypedPerFilterConfig = map[string]*anypb.Any{extAuthzFilter: off}
	} else {
		vh.TypedPerFilterConfig = map[string]*anypb.Any{extAuthzFilter: off}
		namespaces.TypedPerFilterConfig = map[string]*anypb.Any{extAuthzFilter: on}
		query.TypedPerFilterConfig = map[string]*anypb.Any{extAuthzFilter: on}
	}
	rc := &routev3.RouteConfiguration{Name: GatewayRouteConfigName, VirtualHosts: []*routev3.VirtualHost{vh}}
	if err := rc.ValidateAll(); err != nil {
		return nil, fmt.Errorf("route configuration %s: %w", GatewayRouteConfigName, err)
	}
	return rc, nil
}

// envoyRetryPolicy is Envoy's retry of a query its runner did not answer:
// the connection was refused or could not be made (connect-failure), the
// runner refused the stream (refused-stream: it is going away) or reset it
// before answering (reset). Queries are reads, so sending one again is
// safe. Two retries, 25 ms apart doubling to at most 250 ms, cover a runner
// restarting on its address; the route's timeout bounds them. It is set on
// the virtual host, once, not per route. A retry goes to the cluster the
// route picked: Envoy runs ext_authz once per request, not per try, so a
// namespace whose runner answers that it no longer holds the mailbox (a 404
// without x-prism-mailbox) cannot be retried through a fresh lookup, and
// is not retried; prism gateway does that (gateway.Gateway.call).
// grpc-go's table carries no retry policy: prism gateway retries itself,
// and a route policy would multiply its attempts.
func envoyRetryPolicy() *routev3.RetryPolicy {
	return &routev3.RetryPolicy{
		RetryOn:    "connect-failure,refused-stream,reset",
		NumRetries: wrapperspb.UInt32(2),
		RetryBackOff: &routev3.RetryPolicy_RetryBackOff{
			BaseInterval: durationpb.New(25 * time.Millisecond),
			MaxInterval:  durationpb.New(250 * time.Millisecond),
		},
	}
}

// extAuthzPerRoute turns ext_authz off for a route or virtual host, or on
// (default check settings) where the virtual host turned it off: Envoy
// takes the most specific setting.
func extAuthzPerRoute(disabled bool) (*anypb.Any, error) {
	cfg := &extauthzv3.ExtAuthzPerRoute{}
	if disabled {
		cfg.Override = &extauthzv3.ExtAuthzPerRoute_Disabled{Disabled: true}
	} else {
		cfg.Override = &extauthzv3.ExtAuthzPerRoute_CheckSettings{CheckSettings: &extauthzv3.CheckSettings{}}
	}
	if err := cfg.ValidateAll(); err != nil {
		return nil, errors.Join(errors.New("ext_authz per route"), err)
	}
	return toAny(cfg)
}

// headerRoute sends every request whose x-mailbox-id ends in "@{proxyID}"
// to the proxy: mailbox ids hold exactly one "@" and proxy ids none, so the
// suffix picks exactly the proxy's mailboxes (a-proxy-1 never takes
// proxy-1's, the "@" is part of the suffix).
func headerRoute(proxyID string) *routev3.Route {
	return &routev3.Route{
		Match: &routev3.RouteMatch{
			PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
			Headers: []*routev3.HeaderMatcher{{
				Name: mesh.HeaderMailboxID,
				HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
					MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: "@" + proxyID},
				}},
			}},
		},
		Action: routeTo(proxyID),
	}
}

// mailboxPathRegex matches /v1/mailboxes/{ns}@{proxyID} and anything under
// it, with the "@" raw or percent-encoded; the namespace is any segment
// (its "$" raw or %24 alike). Envoy matches the whole path without the
// query; the optional [/?] tail keeps the regex right for a matcher that
// sees the query too. The other characters ids allow are unreserved and
// never encoded.
func mailboxPathRegex(proxyID string) string {
	return `^/v1/mailboxes/[^/]*(?:@|%40)` + regexp.QuoteMeta(proxyID) + `(?:[/?].*)?$`
}

func mailboxQueryNotFound() *routev3.Route {
	return &routev3.Route{
		Name:   "mailbox-query-not-found",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: MailboxQueryPrefix}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: AdminCluster}}},
	}
}

// notFound answers every path under prefix with a JSON 404.
func notFound(name, prefix, body string) *routev3.Route {
	return &routev3.Route{
		Name:  name,
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
			Status: 404,
			Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}},
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "content-type", Value: "application/json"},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}
}

func routeTo(proxyID string) *routev3.Route_Route {
	return &routev3.Route_Route{Route: &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName(proxyID)},
	}}
}

func regex(re string) *matcherv3.RegexMatcher { return &matcherv3.RegexMatcher{Regex: re} }
