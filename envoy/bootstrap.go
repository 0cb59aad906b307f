// Package envoy generates the Envoy gateway's bootstrap: everything dynamic
// (listeners, routes, clusters, endpoints) comes over one delta ADS stream
// from the admin cluster, so the bootstrap only says how to reach the admin
// nodes, who this Envoy is, and where its admin interface (and so its
// stats) lives.
// helm/prism/files/envoy-bootstrap.yaml is the chart's templated twin;
// helm's tests keep the two equivalent.
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
	// AdminAddress is Envoy's admin interface (stats at /stats/prometheus,
	// readiness at /ready), kept on loopback; default 127.0.0.1:9901.
	AdminAddress string `json:"adminAddress,omitempty"`
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
// Envoy next to a local `prism admin` on its default gRPC address.
var Example = Config{NodeID: "gateway-0", AdminNodes: []string{"127.0.0.1:8981"}}

func (c Config) withDefaults() Config {
	if c.NodeCluster == "" {
		c.NodeCluster = DefaultNodeCluster
	}
	if c.AdminAddress == "" {
		c.AdminAddress = "127.0.0.1:9901"
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
	var secrets []*tlsv3.Secret
	if c.TLS != nil {
		if xds.TransportSocket, err = xdsTLS(adminSAN); err != nil {
			return nil, fmt.Errorf("envoy bootstrap: %w", err)
		}
		secrets = staticSecrets(*c.TLS)
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
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			// The only static resources: listeners and the rest come over
			// ADS.
			Clusters: []*clusterv3.Cluster{xds},
			Secrets:  secrets,
		},
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

func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
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
		if _, err := netip.ParseAddr(sa.GetSocketAddress().GetAddress()); err != nil {
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
