package translator

import (
	"fmt"
	"net/netip"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
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
//   - envoy.filters.http.ext_authz, which runs on every route to a proxy or
//     the admin nodes, is given that payload (metadata_context_namespaces)
//     and the admin nodes check that its namespaces claim names every
//     namespace the request does (path, x-mailbox-id, x-prism-namespace) or
//     "*", answering 403 in gateway/auth's JSON shape otherwise. One check
//     in Go, next to the namespace lookup, instead of a per-route RBAC
//     policy naming each namespace;
//   - local_reply_config answers jwt_authn's own 401 and 403 in
//     gateway/auth's JSON shape, {"error", "code"}, with its
//     WWW-Authenticate challenge.
//
// grpc-go's resources never change with it: prism gateway checks tokens
// itself.
const (
	// JWKSCluster fetches a JWKS URL (Envoy only).
	JWKSCluster = "prism/jwks"

	jwtAuthnFilter = "envoy.filters.http.jwt_authn"
	extAuthzFilter = wellknown.HTTPExternalAuthorization
	jwtProvider    = "prism"
	// jwtPayloadKey and jwtFailureKey are where jwt_authn leaves the
	// verified payload and the reason of a failure, under jwtAuthnFilter's
	// dynamic metadata.
	jwtPayloadKey = "jwt_payload"
	jwtFailureKey = "jwt_failure"
	// clockSkew is gateway/auth's default leeway.
	clockSkew = 30 * time.Second
	// jwksFetchTimeout and jwksCacheFor are gateway/auth's defaults.
	jwksFetchTimeout = 5 * time.Second
	jwksCacheFor     = 5 * time.Minute
	// extAuthzTimeout bounds a check: an FSM read on an admin node, plus
	// the network, as for grpc-go's lookups.
	extAuthzTimeout = rlsLookupTimeout
)

// queryPrefixes are the paths that carry queries, the only ones needing a
// token: every route to a runner or to the not-found service is under one.
var queryPrefixes = []string{"/v1/", MailboxQueryPrefix}

// gatewayFilters are the listener's filters before the router: jwt_authn
// under query auth, then ext_authz.
func gatewayFilters(q ir.QueryAuth) ([]*hcmv3.HttpFilter, error) {
	type filter struct {
		name string
		cfg  validator
	}
	var cfgs []filter
	if q.Enabled() {
		cfgs = append(cfgs, filter{jwtAuthnFilter, jwtAuthn(q)})
	}
	cfgs = append(cfgs, filter{extAuthzFilter, extAuthz()})
	filters := make([]*hcmv3.HttpFilter, 0, len(cfgs))
	for _, f := range cfgs {
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

// extAuthz asks the admin nodes (prism/admin) about every request on a
// route that enables it. It fails closed (503), and clears the route cache
// so the x-mailbox-id it may set picks the proxy route.
func extAuthz() *extauthzv3.ExtAuthz {
	return &extauthzv3.ExtAuthz{
		Services: &extauthzv3.ExtAuthz_GrpcService{GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: AdminCluster}},
			Timeout:         durationpb.New(extAuthzTimeout),
		}},
		TransportApiVersion:       corev3.ApiVersion_V3,
		ClearRouteCache:           true,
		FailureModeAllow:          false,
		MetadataContextNamespaces: []string{jwtAuthnFilter},
		StatusOnError:             &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
	}
}

// jwtAuthn verifies the token on the query paths.
func jwtAuthn(q ir.QueryAuth) *jwtv3.JwtAuthentication {
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
	return cfg
}

// localReplies answer jwt_authn's refusals like gateway/auth: 401 with code
// missing_token (no Authorization: Bearer) or invalid_token, each with its
// WWW-Authenticate challenge. Every mapper requires jwt_authn's failure in
// the metadata: ext_authz's refusals (401, 403 insufficient_scope) come from
// the admin nodes already in that shape, and no mapper may touch them. jwt_authn
// answers a token of another audience 403; gateway/auth says 401
// invalid_token, so that one is rewritten. gRPC calls keep Envoy's
// grpc-message text (a JSON body would land in it); only their status is
// corrected. Other local replies (the direct 404, 503s) are left alone.
func localReplies() *hcmv3.LocalReplyConfig {
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
		// Unset means true: a reply without jwt_authn's failure (ext_authz's
		// own 401 and 403, already in gateway/auth's shape) would match.
		MatchIfKeyNotFound: wrapperspb.Bool(false),
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
		v := `Bearer realm="` + mesh.AuthRealm + `"`
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
			Filter:             and(status(401), jwtFailed, bearer, notGRPC),
			BodyFormatOverride: body("%LOCAL_REPLY_BODY%", "invalid_token"),
			HeadersToAdd:       challenge("invalid_token"),
		},
		{
			Filter:             and(status(401), jwtFailed, notGRPC),
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
