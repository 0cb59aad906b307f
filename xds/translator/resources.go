package translator

import (
	"fmt"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// toAny packs m deterministically: a map inside (the access log format) must
// not reorder between translations, or every push would look like a change.
func toAny(m proto.Message) (*anypb.Any, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
	}
	return a, nil
}

// ads is where every dynamic resource comes from: the one ADS stream.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

// grpcCluster is grpc-go's form of an EDS cluster: only what grpc-go v1.85
// reads of a Cluster (xdsresource/unmarshal_cds.go), which is most of the
// clusters response at a thousand proxies. It always speaks HTTP/2 and
// never reads typed_extension_protocol_options, connect_timeout,
// health_checks or common_lb_config (it routes nothing to an endpoint the
// control plane marks unhealthy, with or without a panic threshold).
// lb_policy is left at ROUND_ROBIN. Of outlier detection grpc-go reads the
// ejection time and percentage, not the consecutive gateway failure
// fields, which are Envoy's.
func grpcCluster(name string) *clusterv3.Cluster {
	od := outlierDetection()
	od.ConsecutiveGatewayFailure, od.EnforcingConsecutiveGatewayFailure = nil, nil
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()},
		OutlierDetection:     od,
	}
}

// envoyCluster is Envoy's form of an EDS cluster: HTTP/2 to the upstream
// (both MailboxQuery gRPC and the runners' h2c HTTP API), a connect
// timeout, gRPC health checks, no panic routing and outlier detection.
func envoyCluster(name string) *clusterv3.Cluster {
	h2, _ := toAny(&upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
				},
			},
		},
	})
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2,
		},
		// A runner its checks found down is checked every 250 ms, so one
		// back on its address takes traffic again at once.
		HealthChecks: []*corev3.HealthCheck{{
			Timeout:            durationpb.New(time.Second),
			Interval:           durationpb.New(5 * time.Second),
			UnhealthyInterval:  durationpb.New(250 * time.Millisecond),
			UnhealthyThreshold: wrapperspb.UInt32(2),
			HealthyThreshold:   wrapperspb.UInt32(1),
			HealthChecker:      &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{}},
		}},
		// No panic routing: a runner the control plane marks unhealthy, or
		// that failed three connects running, gets no traffic and queries
		// fail at once (503) instead of each waiting out a connect timeout,
		// as grpc-go does with unhealthy endpoints. Each cluster has one host,
		// so Envoy's default 50% threshold would route to it regardless.
		CommonLbConfig:   &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}},
		OutlierDetection: outlierDetection(),
	}
}

// outlierDetection ejects a runner after three failed connects running,
// so queries to one that is gone fail at once instead of each waiting out
// the connect timeout. Envoy returns an ejected host only at its sweep
// (interval, default 10 s), after the ejection time times the number of
// times it was ejected: a sweep every second, a second per ejection and at
// most 5 s keep a runner that restarted on its address, whose queries
// failed to connect meanwhile (three tries of one query are enough), from
// staying out for 10 s; a successful health check returns it sooner.
func outlierDetection() *clusterv3.OutlierDetection {
	return &clusterv3.OutlierDetection{
		ConsecutiveGatewayFailure:          wrapperspb.UInt32(3),
		EnforcingConsecutiveGatewayFailure: wrapperspb.UInt32(100),
		Interval:                           durationpb.New(time.Second),
		BaseEjectionTime:                   durationpb.New(time.Second),
		MaxEjectionTime:                    durationpb.New(5 * time.Second),
		MaxEjectionPercent:                 wrapperspb.UInt32(100),
	}
}

// aggregateClusterType is the extension grpc-go (without an environment
// gate in v1.85) and Envoy know aggregate clusters by.
const aggregateClusterType = "envoy.clusters.aggregate"

// lookupCluster is grpc-go's aggregate over cluster alone, named
// ir.LookupCluster(cluster), which only RLS answers name. It carries no TLS
// and no endpoints: grpc-go connects through the leaf with the leaf's own
// settings. lb_policy stays ROUND_ROBIN, the root policy grpc-go applies
// to the leaf (it refuses CLUSTER_PROVIDED, which Envoy would want, but
// Envoy is never served these).
func lookupCluster(cluster string) (*clusterv3.Cluster, error) {
	cfg, err := toAny(&aggregatev3.ClusterConfig{Clusters: []string{cluster}})
	if err != nil {
		return nil, err
	}
	return &clusterv3.Cluster{
		Name: ir.LookupCluster(cluster),
		ClusterDiscoveryType: &clusterv3.Cluster_ClusterType{ClusterType: &clusterv3.Cluster_CustomClusterType{
			Name:        aggregateClusterType,
			TypedConfig: cfg,
		}},
	}, nil
}

func loadAssignment(cluster string, eps []*endpointv3.LbEndpoint) *endpointv3.ClusterLoadAssignment {
	la := &endpointv3.ClusterLoadAssignment{ClusterName: cluster}
	if len(eps) > 0 {
		// grpc-go rejects a locality without an ID and ignores one without
		// a weight.
		la.Endpoints = []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{},
			LbEndpoints:         eps,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}}
	}
	return la
}

func lbEndpoint(addr string, healthy bool) *endpointv3.LbEndpoint {
	host, port, _ := splitAddress(addr) // ir.Valid checked the form
	status := corev3.HealthStatus_HEALTHY
	if !healthy {
		status = corev3.HealthStatus_UNHEALTHY
	}
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       host,
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
			}}},
		}},
		HealthStatus: status,
	}
}

func proxyEndpoints(p ir.Proxy) *endpointv3.ClusterLoadAssignment {
	return loadAssignment(ClusterName(p.ID), []*endpointv3.LbEndpoint{lbEndpoint(p.Address, p.Healthy)})
}

func adminEndpoints(addrs []string) *endpointv3.ClusterLoadAssignment {
	eps := make([]*endpointv3.LbEndpoint, 0, len(addrs))
	for _, a := range addrs {
		eps = append(eps, lbEndpoint(a, true))
	}
	return loadAssignment(AdminCluster, eps)
}

func router() (*hcmv3.HttpFilter, error) {
	cfg, err := toAny(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: wellknown.Router, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: cfg}}, nil
}

func rds(name string) *hcmv3.HttpConnectionManager_Rds {
	return &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: ads(), RouteConfigName: name}}
}

// accessLogFormat is one JSON line per request with the mailbox and the
// runner that answered.
var accessLogFormat = map[string]any{
	"start":     "%START_TIME%",
	"method":    "%REQ(:METHOD)%",
	"path":      "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
	"status":    "%RESPONSE_CODE%",
	"grpc":      "%GRPC_STATUS%",
	"mailbox":   "%REQ(X-MAILBOX-ID)%",
	"cluster":   "%UPSTREAM_CLUSTER%",
	"upstream":  "%UPSTREAM_HOST%",
	"duration":  "%DURATION%",
	"flags":     "%RESPONSE_FLAGS%",
	"bytes_out": "%BYTES_SENT%",
}

// gatewayListener is the Envoy gateway's listener, routing by
// GatewayRouteConfigName with ext_authz (see queryauth.go) and, under query
// auth, jwt_authn before it. An invalid query auth setting is an error, so
// the listener is left out rather than served open.
func gatewayListener(addr string, q ir.QueryAuth) (*listenerv3.Listener, error) {
	host, port, err := splitAddress(addr)
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", GatewayListenerName, err)
	}
	rf, err := router()
	if err != nil {
		return nil, err
	}
	format, err := structpb.NewStruct(accessLogFormat)
	if err != nil {
		return nil, err
	}
	stdout, err := toAny(&streamv3.StdoutAccessLog{AccessLogFormat: &streamv3.StdoutAccessLog_LogFormat{
		LogFormat: &corev3.SubstitutionFormatString{Format: &corev3.SubstitutionFormatString_JsonFormat{JsonFormat: format}},
	}})
	if err != nil {
		return nil, err
	}
	if q.Enabled() {
		if err := q.Validate(); err != nil {
			return nil, fmt.Errorf("listener %s: %w", GatewayListenerName, err)
		}
	}
	filters, err := gatewayFilters(q)
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", GatewayListenerName, err)
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: GatewayListenerName,
		// AUTO serves HTTP/1.1 for curl and h2c for gRPC clients on one port.
		CodecType:      hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: rds(GatewayRouteConfigName),
		HttpFilters:    append(filters, rf),
		AccessLog: []*accesslogv3.AccessLog{{
			Name:       "envoy.access_loggers.stdout",
			ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: stdout},
		}},
	}
	if q.Enabled() {
		hcm.LocalReplyConfig = localReplies()
		// Routes, jwt_authn's rules and ext_authz see the path as the
		// runner will: no dot segments or doubled slashes can make a path
		// match one proxy's route and name another namespace to the
		// check, and mailbox ids never hold a slash, so an escaped one is
		// refused.
		hcm.NormalizePath = wrapperspb.Bool(true)
		hcm.MergeSlashes = true
		hcm.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_REJECT_REQUEST
	}
	if err := hcm.ValidateAll(); err != nil {
		return nil, fmt.Errorf("listener %s connection manager: %w", GatewayListenerName, err)
	}
	hcmAny, err := toAny(hcm)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name: GatewayListenerName,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address:       host,
			PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}},
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{
				Name:       wellknown.HTTPConnectionManager,
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcmAny},
			}},
		}},
	}, nil
}

func apiListener() (*listenerv3.Listener, error) {
	rf, err := router()
	if err != nil {
		return nil, err
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix:     "mailbox_query",
		RouteSpecifier: rds(RouteConfigName),
		HttpFilters:    []*hcmv3.HttpFilter{rf},
	}
	if err := hcm.ValidateAll(); err != nil {
		return nil, fmt.Errorf("listener %s connection manager: %w", mesh.QueryListenerName, err)
	}
	hcmAny, err := toAny(hcm)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name:        mesh.QueryListenerName,
		ApiListener: &listenerv3.ApiListener{ApiListener: hcmAny},
	}, nil
}
