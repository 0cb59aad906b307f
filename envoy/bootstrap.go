// Package envoy generates the Envoy gateway's bootstrap: everything dynamic
// (listeners, routes, clusters, endpoints) comes over one delta ADS stream
// from the admin cluster, so the bootstrap only says how to reach the admin
// nodes, who this Envoy is, where its admin interface lives, and optionally
// one static listener that shows the network two of the admin interface's
// pages: Prometheus stats and readiness.
// helm/prism/files/envoy-bootstrap.yaml is the chart's templated twin;
// helm's tests check it equals what Bootstrap builds from the same values.
package envoy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	overloadv3 "github.com/envoyproxy/go-control-plane/envoy/config/overload/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	downstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/xds/translator"
)

// Names the bootstrap defines.
const (
	// XDSCluster is the admin nodes' ADS endpoints.
	XDSCluster = "prism-xds"
	// AdminInterfaceCluster is Envoy's own admin interface, which only the
	// stats listener routes to. The control plane's clusters are named
	// prism/..., so neither static name can collide with one sent over CDS.
	AdminInterfaceCluster = "envoy-admin"
	// StatsListener serves /stats/prometheus and /ready from the admin
	// interface; the control plane's listeners have other names.
	StatsListener = "envoy-stats"
	// StatsPath and ReadyPath are the only admin pages StatsListener passes
	// on (GET only): the rest of the admin interface can change or stop
	// Envoy.
	StatsPath = "/stats/prometheus"
	ReadyPath = "/ready"
	// DefaultMaxConnections bounds the client connections one Envoy holds.
	DefaultMaxConnections = 50000
	// DefaultNodeCluster is the node cluster every gateway reports.
	DefaultNodeCluster = "prism-gateway"
)

// Config is what varies between gateways.
type Config struct {
	// NodeID identifies this Envoy to the control plane (e.g. the pod name);
	// empty leaves it to envoy --service-node.
	NodeID string `json:"nodeId,omitempty"`
	// NodeCluster groups gateways; default DefaultNodeCluster.
	NodeCluster string `json:"nodeCluster,omitempty"`
	// AdminNodes are the admin nodes' gRPC addresses (host:port). IPs give a
	// STATIC cluster; any host name makes it STRICT_DNS (e.g. a headless
	// Service, which resolves to every admin pod).
	AdminNodes []string `json:"adminNodes"`
	// AdminAddress is Envoy's admin interface, kept on loopback; default
	// 127.0.0.1:9901.
	AdminAddress string `json:"adminAddress,omitempty"`
	// StatsAddress, when set, is a static listener (an IP and port) passing
	// only GET /stats/prometheus and /ready on to the admin interface, for
	// callers outside the host such as Prometheus and the kubelet's
	// readiness probe. Empty: no such listener (on one machine the admin
	// interface serves both on loopback).
	StatsAddress string `json:"statsAddress,omitempty"`
	// MaxConnections bounds the downstream connections Envoy accepts at
	// once (the overload manager's global limit; the stats listener is
	// exempt, so probes and scrapes still answer at the limit); default
	// DefaultMaxConnections.
	MaxConnections int64 `json:"maxConnections,omitempty"`
	// TLS, when set, makes this Envoy speak mutual TLS to the admin nodes
	// and to the runners with its gateway identity's files.
	TLS *TLS `json:"tls,omitempty"`
}

// TLS is the Envoy gateway's identity (a gateway/<name> certificate) and its
// trust bundle. The bootstrap defines them as the static secrets the
// control plane's clusters name (translator.EnvoyIdentitySecret and
// translator.EnvoyCASecret), so the admin nodes never see a private key.
// Envoy reads static secrets once: a rotated certificate takes a restart
// (or a hot restart) of Envoy.
type TLS struct {
	// CA, Cert and Key are PEM file paths as Envoy sees them.
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
	// TrustDomain is the mesh's; the admin nodes must present
	// spiffe://<TrustDomain>/admin/... (default identity.DefaultTrustDomain).
	TrustDomain string `json:"trustDomain,omitempty"`
}

// Example is the configuration of bootstrap.yaml in this directory: one
// Envoy next to a local `prism admin` on its default gRPC address, with a
// stats listener (on loopback too).
var Example = Config{NodeID: "gateway-0", AdminNodes: []string{"127.0.0.1:8981"}, StatsAddress: "127.0.0.1:9902"}

func (c Config) withDefaults() Config {
	if c.NodeCluster == "" {
		c.NodeCluster = DefaultNodeCluster
	}
	if c.AdminAddress == "" {
		c.AdminAddress = "127.0.0.1:9901"
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.TLS != nil && c.TLS.TrustDomain == "" {
		t := *c.TLS
		t.TrustDomain = identity.DefaultTrustDomain
		c.TLS = &t
	}
	return c
}

// Bootstrap builds and validates the bootstrap for c.
func Bootstrap(c Config) (*bootstrapv3.Bootstrap, error) {
	c = c.withDefaults()
	var errs []error
	if len(c.AdminNodes) == 0 {
		errs = append(errs, errors.New("at least one admin node address is required"))
	}
	adminNodes, dns, err := endpoints(c.AdminNodes)
	if err != nil {
		errs = append(errs, fmt.Errorf("admin nodes: %w", err))
	}
	adminAddr, err := socketAddress(c.AdminAddress)
	if err != nil {
		errs = append(errs, fmt.Errorf("admin address: %w", err))
	} else if ip, perr := netip.ParseAddr(adminAddr.GetSocketAddress().GetAddress()); perr != nil || !ip.IsLoopback() {
		errs = append(errs, fmt.Errorf("admin address %q must be a loopback IP: the admin interface can stop Envoy", c.AdminAddress))
	}
	var statsAddr *corev3.Address
	if c.StatsAddress != "" {
		a, err := socketAddress(c.StatsAddress)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("stats address: %w", err))
		case !isIP(a):
			errs = append(errs, fmt.Errorf("stats address %q: a listener binds an IP, not a name", c.StatsAddress))
		case a.GetSocketAddress().GetPortValue() == adminAddr.GetSocketAddress().GetPortValue():
			// Different IPs would do, but 0.0.0.0 takes the port on
			// loopback too.
			errs = append(errs, fmt.Errorf("stats address %q and admin address %q share a port", c.StatsAddress, c.AdminAddress))
		default:
			statsAddr = a
		}
	}
	if c.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("max connections %d: must be positive", c.MaxConnections))
	}
	var adminSAN *matcherv3.StringMatcher
	if t := c.TLS; t != nil {
		if t.CA == "" || t.Cert == "" || t.Key == "" {
			errs = append(errs, fmt.Errorf("tls: the CA bundle, certificate and key files are all required (have %+v)", *t))
		}
		if _, err := spiffeid.TrustDomainFromString(t.TrustDomain); err != nil {
			errs = append(errs, fmt.Errorf("tls: trust domain %q: %w", t.TrustDomain, err))
		}
		adminSAN = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
			Prefix: "spiffe://" + t.TrustDomain + "/" + string(identity.Admin) + "/",
		}}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	xds := xdsCluster(adminNodes, dns)
	static := &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{xds}}
	if statsAddr != nil {
		stats, err := statsListener(statsAddr)
		if err != nil {
			return nil, fmt.Errorf("envoy bootstrap: %w", err)
		}
		static.Listeners = []*listenerv3.Listener{stats}
		static.Clusters = append(static.Clusters, adminInterfaceCluster(adminAddr))
	}
	overload, err := connectionLimit(c.MaxConnections)
	if err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	if c.TLS != nil {
		if xds.TransportSocket, err = xdsTLS(adminSAN); err != nil {
			return nil, fmt.Errorf("envoy bootstrap: %w", err)
		}
		static.Secrets = staticSecrets(*c.TLS)
	}

	b := &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: c.NodeID, Cluster: c.NodeCluster},
		Admin: &bootstrapv3.Admin{Address: adminAddr},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &corev3.ApiConfigSource{
				// Delta: a change sends the resources that changed (one
				// ClusterLoadAssignment when a runner moves, one cluster when a
				// proxy joins), where state of the world would resend every
				// cluster; and a gateway that reconnects to another admin node
				// tells it the versions it holds, so it is sent only what
				// differs. The routes and endpoints the listeners and clusters
				// name (ads: {}) come over this same delta stream.
				ApiType:                   corev3.ApiConfigSource_DELTA_GRPC,
				TransportApiVersion:       corev3.ApiVersion_V3,
				SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{
					TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{
						ClusterName: XDSCluster,
						// Reconnect fast when an admin node dies: routes stay
						// served meanwhile, changes wait for the new stream.
						RetryPolicy: &corev3.RetryPolicy{RetryBackOff: &corev3.BackoffStrategy{
							BaseInterval: durationpb.New(250 * time.Millisecond),
							MaxInterval:  durationpb.New(5 * time.Second),
						}},
					}},
				}},
			},
			CdsConfig: ads(),
			LdsConfig: ads(),
		},
		// The gateway's own listener, routes and runner clusters come over
		// ADS; statically only the way to the admin nodes, the identity
		// they are reached with, and the stats listener with the admin
		// interface behind it.
		StaticResources: static,
		OverloadManager: overload,
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	return b, nil
}

// YAML renders the bootstrap for c as Envoy reads it (-c bootstrap.yaml).
func YAML(c Config) ([]byte, error) {
	b, err := Bootstrap(c)
	if err != nil {
		return nil, err
	}
	j, err := protojson.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	return yaml.JSONToYAML(j)
}

// Parse reads a bootstrap YAML back and validates it.
func Parse(y []byte) (*bootstrapv3.Bootstrap, error) {
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		return nil, fmt.Errorf("envoy bootstrap yaml: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(j, b); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	return b, nil
}

// ads is the listeners' and clusters' source. With no initial fetch timeout
// Envoy stays INITIALIZING, and /ready answers 503, until the admin nodes
// have answered both; the default (15s) would let it go LIVE, ready to the
// kubelet, with no gateway listener at all when no admin node answers. A
// stream that cannot connect does not end the wait; a first response that
// Envoy rejects does.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		InitialFetchTimeout:   durationpb.New(0),
	}
}

func isIP(a *corev3.Address) bool {
	_, err := netip.ParseAddr(a.GetSocketAddress().GetAddress())
	return err == nil
}

func socketAddress(hostport string) (*corev3.Address, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return nil, fmt.Errorf("%q: bad port", hostport)
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)},
	}}}, nil
}

// endpoints turns the admin node addresses into endpoints and says whether
// any needs DNS.
func endpoints(addrs []string) ([]*endpointv3.LbEndpoint, bool, error) {
	var out []*endpointv3.LbEndpoint
	var errs []error
	dns := false
	for _, a := range addrs {
		sa, err := socketAddress(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !isIP(sa) {
			dns = true
		}
		out = append(out, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
			Endpoint: &endpointv3.Endpoint{Address: sa},
		}})
	}
	return out, dns, errors.Join(errs...)
}

func http2Options() map[string]*anypb.Any {
	h2, _ := anypb.New(&upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{
						// Keepalive pings notice a silently dead admin node
						// long before TCP would.
						ConnectionKeepalive: &corev3.KeepaliveSettings{
							Interval: durationpb.New(10 * time.Second),
							Timeout:  durationpb.New(5 * time.Second),
						},
					},
				},
			},
		},
	})
	return map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2}
}

// xdsCluster reaches every admin node: leaders and followers all serve xDS
// from their own FSM, so any healthy one will do.
func xdsCluster(eps []*endpointv3.LbEndpoint, dns bool) *clusterv3.Cluster {
	typ := clusterv3.Cluster_STATIC
	if dns {
		typ = clusterv3.Cluster_STRICT_DNS
	}
	return &clusterv3.Cluster{
		Name:                          XDSCluster,
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: typ},
		ConnectTimeout:                durationpb.New(time.Second),
		LbPolicy:                      clusterv3.Cluster_ROUND_ROBIN,
		TypedExtensionProtocolOptions: http2Options(),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: XDSCluster,
			Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}},
		},
		HealthChecks: []*corev3.HealthCheck{{
			Timeout:            durationpb.New(time.Second),
			Interval:           durationpb.New(2 * time.Second),
			UnhealthyThreshold: wrapperspb.UInt32(2),
			HealthyThreshold:   wrapperspb.UInt32(1),
			HealthChecker:      &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{}},
		}},
	}
}

// staticSecrets are the gateway's certificate and trust bundle, from files.
func staticSecrets(t TLS) []*tlsv3.Secret {
	file := func(path string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}}
	}
	return []*tlsv3.Secret{
		{Name: translator.EnvoyIdentitySecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: file(t.Cert), PrivateKey: file(t.Key),
		}}},
		{Name: translator.EnvoyCASecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: file(t.CA),
		}}},
	}
}

// xdsTLS is mutual TLS to an admin node: the static secrets, and a peer of
// the bundle whose URI SAN is an admin identity. The control plane's
// clusters take the same form for runners (xds/translator).
func xdsTLS(adminSAN *matcherv3.StringMatcher) (*corev3.TransportSocket, error) {
	cfg, err := anypb.New(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_3},
		// The admin nodes are grpc-go servers, which refuse a TLS client
		// that does not offer h2.
		AlpnProtocols:                  []string{"h2"},
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: translator.EnvoyIdentitySecret}},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: &tlsv3.CertificateValidationContext{
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: adminSAN}},
			},
			ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: translator.EnvoyCASecret},
		}},
	}})
	if err != nil {
		return nil, err
	}
	return &corev3.TransportSocket{Name: wellknown.TransportSocketTLS, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: cfg}}, nil
}

// statsListener passes GET /stats/prometheus and GET /ready to the admin
// interface; any other request gets Envoy's 404 (no route). Exact paths, so
// nothing such as /ready/../quitquitquit reaches the admin interface.
func statsListener(addr *corev3.Address) (*listenerv3.Listener, error) {
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		return nil, fmt.Errorf("stats listener: %w", err)
	}
	var routes []*routev3.Route
	for _, path := range []string{StatsPath, ReadyPath} {
		routes = append(routes, &routev3.Route{
			Match: &routev3.RouteMatch{
				PathSpecifier: &routev3.RouteMatch_Path{Path: path},
				Headers: []*routev3.HeaderMatcher{{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
					StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "GET"}},
				}}},
			},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: AdminInterfaceCluster},
			}},
		})
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: StatsListener,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name:         StatsListener,
			VirtualHosts: []*routev3.VirtualHost{{Name: StatsListener, Domains: []string{"*"}, Routes: routes}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: wellknown.Router, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, fmt.Errorf("stats listener: %w", err)
	}
	return &listenerv3.Listener{
		Name:    StatsListener,
		Address: addr,
		// Scrapes and readiness probes still answer when clients hold every
		// connection the overload manager allows.
		IgnoreGlobalConnLimit: true,
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       wellknown.HTTPConnectionManager,
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm},
		}}}},
	}, nil
}

// adminInterfaceCluster is Envoy's own admin interface on loopback.
func adminInterfaceCluster(addr *corev3.Address) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 AdminInterfaceCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: AdminInterfaceCluster,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}},
			}}}},
		},
	}
}

// connectionLimit is the gateway's bound on client connections: an edge
// proxy without one runs out of file descriptors or memory first (and
// Envoy warns at start that none is set).
func connectionLimit(n int64) (*overloadv3.OverloadManager, error) {
	cfg, err := anypb.New(&downstreamv3.DownstreamConnectionsConfig{MaxActiveDownstreamConnections: n})
	if err != nil {
		return nil, fmt.Errorf("connection limit: %w", err)
	}
	return &overloadv3.OverloadManager{ResourceMonitors: []*overloadv3.ResourceMonitor{{
		Name:       "envoy.resource_monitors.global_downstream_max_connections",
		ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: cfg},
	}}}, nil
}
