package translator

import (
	"fmt"
	"net/netip"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	rbacfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// Query authentication on the Envoy gateway (ir.QueryAuth), by the rules
// prism gateway applies in Go (gateway/auth):
//   - envoy.filters.http.jwt_authn requires a token verified against the
//     JWKS (iss, aud, exp required, 30 s of clock skew) on every query path,
//     /v1/... and MailboxQuery gRPC, and nowhere else; the token comes from
//     Authorization: Bearer only, is not forwarded to the runners (they know
//     the gateway by its certificate), and its payload lands in dynamic
//     metadata;
//   - envoy.filters.http.rbac allows each mailbox and namespace route only
//     when the payload's namespaces claim names the route's namespace or
//     "*" (RBACPerRoute on the route); the not-found routes need only the
//     token;
//   - local_reply_config answers Envoy's own 401 and 403 in gateway/auth's
//     JSON shape, {"error", "code"}, with its WWW-Authenticate challenge.
//
// The per-route RBAC lives in its own route table, GatewayRouteConfigName,
// named by the Envoy gateway's listener only: grpc-go's table stays exactly
// as without query auth (prism gateway checks tokens itself, and every
// byte of that table counts against grpc-go's 4 MiB limit). The tables
// differ in name, not in variant, so both snapshots can hold both and the
// cache's shared marshaling never mixes them. The gateway table's header
// routes match MailboxQuery gRPC only: the runners' HTTP API serves the
// mailbox its path names, so an HTTP request must be routed, and scoped, by
// its path, never by an x-mailbox-id header naming a namespace the token may
// read. For the same reason a namespace header route there requires that no
// x-mailbox-id is sent (the runner would serve that mailbox first).
//
// The per-route RBAC costs about 330 bytes per route: 10,000 mailboxes with
// their aliases make an 18 MB gateway table (grpc-go's is 4 MB). Envoy takes
// xDS messages of any size, but every change resends it; per-proxy routes
// (ROUTING.md) would shrink it with the rest.
const (
	// GatewayRouteConfigName is the Envoy gateway's route table under query
	// auth.
	GatewayRouteConfigName = "gateway-routes"
	// JWKSCluster fetches a JWKS URL (Envoy only).
	JWKSCluster = "prism/jwks"

	jwtAuthnFilter = "envoy.filters.http.jwt_authn"
	rbacFilter     = wellknown.HTTPRoleBasedAccessControl
	jwtProvider    = "prism"
	// jwtPayloadKey and jwtFailureKey are where jwt_authn leaves the
	// verified payload and the reason of a failure, under jwtAuthnFilter's
	// dynamic metadata.
	jwtPayloadKey = "jwt_payload"
	jwtFailureKey = "jwt_failure"
	// authRealm is gateway/auth.Realm.
	authRealm = "prism"
	// clockSkew is gateway/auth's default leeway.
	clockSkew = 30 * time.Second
	// jwksFetchTimeout and jwksCacheFor are gateway/auth's defaults.
	jwksFetchTimeout = 5 * time.Second
	jwksCacheFor     = 5 * time.Minute
	// allNamespaces is gateway/auth.AllNamespaces.
	allNamespaces = "*"
)

// queryPrefixes are the paths that carry queries, the only ones needing a
// token: every route to a runner or to the not-found service is under one.
var queryPrefixes = []string{"/v1/", MailboxQueryPrefix}

// authFilters are the listener's filters before the router.
func authFilters(q ir.QueryAuth) ([]*hcmv3.HttpFilter, error) {
	provider := &jwtv3.JwtProvider{
		Issuer:                 q.Issuer,
		Audiences:              []string{q.Audience},
		RequireExpiration:      true,
		FromHeaders:            []*jwtv3.JwtHeader{{Name: "Authorization", ValuePrefix: "Bearer "}},
		PayloadInMetadata:      jwtPayloadKey,
		FailedStatusInMetadata: jwtFailureKey,
		ClockSkewSeconds:       uint32(clockSkew / time.Second),
	}
	if q.JWKSURL != "" {
		provider.JwksSourceSpecifier = &jwtv3.JwtProvider_RemoteJwks{RemoteJwks: &jwtv3.RemoteJwks{
			HttpUri: &corev3.HttpUri{
				Uri:              q.JWKSURL,
				HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: JWKSCluster},
				Timeout:          durationpb.New(jwksFetchTimeout),
			},
			CacheDuration: durationpb.New(jwksCacheFor),
			// Fetched when the listener is built, not by the first query.
			AsyncFetch: &jwtv3.JwksAsyncFetch{},
		}}
	} else {
		provider.JwksSourceSpecifier = &jwtv3.JwtProvider_LocalJwks{LocalJwks: &corev3.DataSource{
			Specifier: &corev3.DataSource_Filename{Filename: q.JWKSFile},
		}}
	}
	cfg := &jwtv3.JwtAuthentication{Providers: map[string]*jwtv3.JwtProvider{jwtProvider: provider}}
	for _, p := range queryPrefixes {
		cfg.Rules = append(cfg.Rules, &jwtv3.RequirementRule{
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}},
			RequirementType: &jwtv3.RequirementRule_Requires{Requires: &jwtv3.JwtRequirement{
				RequiresType: &jwtv3.JwtRequirement_ProviderName{ProviderName: jwtProvider},
			}},
		})
	}
	// No rules here: a route without its own RBACPerRoute (the not-found
	// ones, the direct 404) is open to whoever jwt_authn let through.
	rbac := &rbacfilterv3.RBAC{}
	var filters []*hcmv3.HttpFilter
	for _, f := range []struct {
		name string
		cfg  validator
	}{{jwtAuthnFilter, cfg}, {rbacFilter, rbac}} {
		if err := f.cfg.ValidateAll(); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		a, err := toAny(f.cfg)
		if err != nil {
			return nil, err
		}
		filters = append(filters, &hcmv3.HttpFilter{Name: f.name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}})
	}
	return filters, nil
}

// namespaceRBAC is the per-route RBAC of a route to namespace ns: the
// verified payload's claim lists ns or "*", or is ns or "*" itself
// (gateway/auth takes a list or one name).
func namespaceRBAC(claim, ns string) (*anypb.Any, error) {
	str := func(s string) *matcherv3.ValueMatcher {
		return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s},
		}}}
	}
	inList := func(s string) *matcherv3.ValueMatcher {
		return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{
			MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: str(s)},
		}}}
	}
	principal := &rbacv3.Principal{Identifier: &rbacv3.Principal_SourcedMetadata{SourcedMetadata: &rbacv3.SourcedMetadata{
		MetadataMatcher: &matcherv3.MetadataMatcher{
			Filter: jwtAuthnFilter,
			Path: []*matcherv3.MetadataMatcher_PathSegment{
				{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: jwtPayloadKey}},
				{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: claim}},
			},
			Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{
				ValueMatchers: []*matcherv3.ValueMatcher{inList(ns), inList(allNamespaces), str(ns), str(allNamespaces)},
			}}},
		},
	}}}
	cfg := &rbacfilterv3.RBACPerRoute{Rbac: &rbacfilterv3.RBAC{Rules: &rbacv3.RBAC{
		Action: rbacv3.RBAC_ALLOW,
		Policies: map[string]*rbacv3.Policy{"namespace": {
			Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
			Principals:  []*rbacv3.Principal{principal},
		}},
	}}}
	if err := cfg.ValidateAll(); err != nil {
		return nil, fmt.Errorf("namespace %q rbac: %w", ns, err)
	}
	return toAny(cfg)
}

// scope makes routes to namespace ns check the token's claim. The route is
// named after the namespace so the 403 can name it (%ROUTE_NAME%).
func scope(rbac *anypb.Any, ns string, routes ...*routev3.Route) {
	for _, r := range routes {
		r.Name = ns
		r.TypedPerFilterConfig = map[string]*anypb.Any{rbacFilter: rbac}
	}
}

// gRPCOnly narrows a header route to MailboxQuery calls.
func gRPCOnly(r *routev3.Route) *routev3.Route {
	r.Match.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: MailboxQueryPrefix}
	return r
}

// authMailboxRoutes are m's routes in the gateway table.
func authMailboxRoutes(claim string, m ir.Mailbox) (idRoutesPair, error) {
	rbac, err := namespaceRBAC(claim, m.Namespace)
	if err != nil {
		return idRoutesPair{}, err
	}
	hr := gRPCOnly(headerRoute(mesh.HeaderMailboxID, m.ID, m))
	hr.ResponseHeadersToAdd = whoAnswered(m)
	p := idRoutesPair{header: hr, path: mailboxPathRoutes(m)}
	scope(rbac, m.Namespace, append([]*routev3.Route{p.header}, p.path...)...)
	return p, nil
}

// authAliasRoutes are a's routes in the gateway table.
func authAliasRoutes(claim string, a ir.Alias, m ir.Mailbox) (idRoutesPair, error) {
	rbac, err := namespaceRBAC(claim, a.Namespace)
	if err != nil {
		return idRoutesPair{}, err
	}
	hr := gRPCOnly(headerRoute(mesh.HeaderNamespace, a.Namespace, m))
	hr.Match.Headers = append(hr.Match.Headers, &routev3.HeaderMatcher{
		Name:                 mesh.HeaderMailboxID,
		HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
		InvertMatch:          true,
	})
	p := idRoutesPair{header: hr, path: namespaceAliasRoutes(a, m)}
	scope(rbac, a.Namespace, append([]*routev3.Route{p.header}, p.path...)...)
	return p, nil
}

// localReplies answer Envoy's own refusals like gateway/auth: 401 with
// code missing_token (no Authorization: Bearer) or invalid_token, 403
// insufficient_scope, each with its WWW-Authenticate challenge. jwt_authn
// answers a token of another audience 403; gateway/auth says 401
// invalid_token, so that one is rewritten. gRPC calls keep Envoy's
// grpc-message text (a JSON body would land in it); only their status is
// corrected. Other local replies (the direct 404, 503s) are left alone.
func localReplies(claim string) *hcmv3.LocalReplyConfig {
	status := func(code uint32) *accesslogv3.AccessLogFilter {
		return &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_StatusCodeFilter{StatusCodeFilter: &accesslogv3.StatusCodeFilter{
			Comparison: &accesslogv3.ComparisonFilter{Op: accesslogv3.ComparisonFilter_EQ, Value: &corev3.RuntimeUInt32{
				DefaultValue: code, RuntimeKey: fmt.Sprintf("prism.local_reply.status_%d", code),
			}},
		}}}
	}
	header := func(name, prefix string, invert bool) *accesslogv3.AccessLogFilter {
		return &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_HeaderFilter{HeaderFilter: &accesslogv3.HeaderFilter{
			Header: &routev3.HeaderMatcher{
				Name: name,
				HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
					MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix},
				}},
				InvertMatch: invert,
			},
		}}}
	}
	bearer := header("authorization", "Bearer ", false)
	notGRPC := header("content-type", "application/grpc", true)
	isGRPC := header("content-type", "application/grpc", false)
	jwtFailed := &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_MetadataFilter{MetadataFilter: &accesslogv3.MetadataFilter{
		Matcher: &matcherv3.MetadataMatcher{
			Filter: jwtAuthnFilter,
			Path:   []*matcherv3.MetadataMatcher_PathSegment{{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: jwtFailureKey}}},
			Value:  &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_PresentMatch{PresentMatch: true}},
		},
	}}}
	and := func(fs ...*accesslogv3.AccessLogFilter) *accesslogv3.AccessLogFilter {
		return &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_AndFilter{AndFilter: &accesslogv3.AndFilter{Filters: fs}}}
	}
	body := func(msg, code string) *corev3.SubstitutionFormatString {
		return &corev3.SubstitutionFormatString{Format: &corev3.SubstitutionFormatString_JsonFormat{JsonFormat: &structpb.Struct{
			Fields: map[string]*structpb.Value{"error": structpb.NewStringValue(msg), "code": structpb.NewStringValue(code)},
		}}}
	}
	challenge := func(code string) []*corev3.HeaderValueOption {
		v := `Bearer realm="` + authRealm + `"`
		if code != "missing_token" {
			v += `, error="` + code + `"`
		}
		return []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "www-authenticate", Value: v},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}
	}
	unauthorized := wrapperspb.UInt32(401)
	return &hcmv3.LocalReplyConfig{Mappers: []*hcmv3.ResponseMapper{
		{
			Filter:             and(status(401), bearer, notGRPC),
			BodyFormatOverride: body("%LOCAL_REPLY_BODY%", "invalid_token"),
			HeadersToAdd:       challenge("invalid_token"),
		},
		{
			Filter:             and(status(401), notGRPC),
			BodyFormatOverride: body("%LOCAL_REPLY_BODY%: send Authorization: Bearer <JWT>", "missing_token"),
			HeadersToAdd:       challenge("missing_token"),
		},
		{
			Filter:             and(status(403), jwtFailed, notGRPC),
			StatusCode:         unauthorized,
			BodyFormatOverride: body("%LOCAL_REPLY_BODY%", "invalid_token"),
			HeadersToAdd:       challenge("invalid_token"),
		},
		{Filter: and(status(403), jwtFailed, isGRPC), StatusCode: unauthorized},
		{
			Filter: and(status(403), notGRPC),
			BodyFormatOverride: body(
				"%LOCAL_REPLY_BODY%: the token's "+claim+" claim names neither namespace %ROUTE_NAME% nor "+allNamespaces,
				"insufficient_scope"),
			HeadersToAdd: challenge("insufficient_scope"),
		},
	}}
}

// jwksCluster is how Envoy reaches q's JWKS URL: DNS, TLS verified
// against q.CA() and the URL's host name.
func jwksCluster(q ir.QueryAuth) (*clusterv3.Cluster, error) {
	host, port, err := q.JWKSHost()
	if err != nil {
		return nil, err
	}
	san := &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_DNS, Matcher: &matcherv3.StringMatcher{
		MatchPattern: &matcherv3.StringMatcher_Exact{Exact: host},
	}}
	sni := host
	if _, err := netip.ParseAddr(host); err == nil {
		san.SanType, sni = tlsv3.SubjectAltNameMatcher_IP_ADDRESS, ""
	}
	tlsAny, err := toAny(&tlsv3.UpstreamTlsContext{
		Sni: sni,
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa:                 &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: q.CA()}},
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{san},
			}},
		},
	})
	if err != nil {
		return nil, err
	}
	ep := &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address:       host,
			PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}},
	}}}
	return &clusterv3.Cluster{
		Name:                 JWKSCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS},
		// Many pods have no IPv6 route even where the identity provider
		// publishes an AAAA record.
		DnsLookupFamily: clusterv3.Cluster_V4_PREFERRED,
		ConnectTimeout:  durationpb.New(jwksFetchTimeout),
		LoadAssignment:  &endpointv3.ClusterLoadAssignment{ClusterName: JWKSCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{ep}}}},
		TransportSocket: &corev3.TransportSocket{Name: wellknown.TransportSocketTLS, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: tlsAny}},
	}, nil
}
