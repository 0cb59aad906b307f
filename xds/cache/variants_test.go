package cache

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/prism-mesh/prism/mesh"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// TestClustersPerDataPlane: under upstream TLS an Envoy is served Envoy's
// clusters (SDS secrets) and a grpc-go client grpc-go's (certificate provider
// instances), at the same version, each from its own marshaled bytes; in a
// plaintext mesh both get the same clusters.
func TestClustersPerDataPlane(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		tls                 bool
		wantGRPC, wantEnvoy string // what the runner cluster's TLS names; "" none
	}{
		{name: "plaintext"},
		{name: "mtls", tls: true, wantGRPC: "provider " + translator.CertProviderInstance, wantEnvoy: "secret " + translator.EnvoyIdentitySecret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
			x := state(7, 1)
			if tc.tls {
				x.Gateway.UpstreamTLS = ir.UpstreamTLS{TrustDomain: "prism.local"}
			}
			res, err := translator.Translate(x)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Set(context.Background(), 7, res); err != nil {
				t.Fatal(err)
			}
			clusterTLS := func(userAgent string) string {
				t.Helper()
				out := sotw(t, c, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "gw", UserAgentName: userAgent}, TypeUrl: resource.ClusterType})
				if out.GetVersionInfo() != "7" {
					t.Fatalf("%s: version %q, want 7", userAgent, out.GetVersionInfo())
				}
				for _, a := range out.GetResources() {
					cl := &clusterv3.Cluster{}
					if err := a.UnmarshalTo(cl); err != nil {
						t.Fatal(err)
					}
					if cl.GetName() != translator.ClusterName("proxy-01") {
						continue
					}
					if cl.GetTransportSocket() == nil {
						return ""
					}
					up := &tlsv3.UpstreamTlsContext{}
					if err := cl.GetTransportSocket().GetTypedConfig().UnmarshalTo(up); err != nil {
						t.Fatal(err)
					}
					common := up.GetCommonTlsContext()
					if p := common.GetTlsCertificateProviderInstance(); p != nil {
						return "provider " + p.GetInstanceName()
					}
					if s := common.GetTlsCertificateSdsSecretConfigs(); len(s) == 1 {
						return "secret " + s[0].GetName()
					}
					return "unknown TLS"
				}
				t.Fatal("no runner cluster")
				return ""
			}
			// Envoy first, so a shared memo would hand grpc-go Envoy's bytes.
			if got := clusterTLS("envoy"); got != tc.wantEnvoy {
				t.Errorf("Envoy's runner cluster TLS = %q, want %q", got, tc.wantEnvoy)
			}
			if got := clusterTLS("gRPC Go"); got != tc.wantGRPC {
				t.Errorf("grpc-go's runner cluster TLS = %q, want %q", got, tc.wantGRPC)
			}
		})
	}
}

// TestListenersPerDataPlane: over either ADS protocol, a stream whose node
// says "envoy" is sent the gateway's socket listener alone (Envoy skips an
// api_listener with a warning), which under query auth checks tokens and
// always asks the admin's ext_authz, and a grpc-go stream ("gRPC Go", by
// name as grpc-go asks or wildcard) the API listener mailbox-query alone.
// Each snapshot holds only the route table its listener names, and only
// Envoy, which fetches the signing keys, is served the JWKS cluster.
func TestListenersPerDataPlane(t *testing.T) {
	t.Parallel()
	const envoy, grpcGo = "envoy", "gRPC Go"
	for _, tc := range []struct {
		name      string
		auth      bool
		gateway   string // the gateway listener's filters and route table
		envoyJWKS bool
	}{
		{name: "open", gateway: "envoy.filters.http.ext_authz envoy.filters.http.router " + translator.GatewayRouteConfigName},
		{name: "query auth", auth: true, envoyJWKS: true, gateway: "envoy.filters.http.jwt_authn envoy.filters.http.ext_authz envoy.filters.http.router " + translator.GatewayRouteConfigName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
			x := state(7, 1)
			if tc.auth {
				x.Gateway.QueryAuth = ir.QueryAuth{Issuer: "https://idp.example", Audience: "prism", JWKSURL: "https://idp.example/jwks.json"}
			}
			res, err := translator.Translate(x)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Set(ctx, 7, res); err != nil {
				t.Fatal(err)
			}
			conn := serve(ctx, t, c)
			api := "api " + translator.RouteConfigName
			for _, cl := range []struct {
				userAgent string
				delta     bool
				names     []string // nil: wildcard
				want      map[string]string
			}{
				{userAgent: envoy, want: map[string]string{translator.GatewayListenerName: tc.gateway}},
				{userAgent: envoy, delta: true, want: map[string]string{translator.GatewayListenerName: tc.gateway}},
				{userAgent: grpcGo, names: []string{mesh.QueryListenerName}, want: map[string]string{mesh.QueryListenerName: api}},
				{userAgent: grpcGo, want: map[string]string{mesh.QueryListenerName: api}},
				{userAgent: grpcGo, delta: true, want: map[string]string{mesh.QueryListenerName: api}},
			} {
				got := listeners(ctx, t, conn, &corev3.Node{Id: "gw", UserAgentName: cl.userAgent}, cl.delta, cl.names)
				if !maps.Equal(got, cl.want) {
					t.Errorf("%s (delta %v, names %v) is sent listeners %v, want %v", cl.userAgent, cl.delta, cl.names, got, cl.want)
				}
			}
			for key, want := range map[string]string{EnvoyNodeKey: translator.GatewayRouteConfigName, NodeKey: translator.RouteConfigName} {
				snap, err := c.snapshot(key)
				if err != nil {
					t.Fatal(err)
				}
				if got := slices.Collect(maps.Keys(snap.GetResources(resource.RouteType))); !slices.Equal(got, []string{want}) {
					t.Errorf("%s's route tables %v, want %s", key, got, want)
				}
			}
			hasJWKS := func(userAgent string) bool {
				t.Helper()
				out := sotw(t, c, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "gw", UserAgentName: userAgent}, TypeUrl: resource.ClusterType})
				for _, a := range out.GetResources() {
					cl := &clusterv3.Cluster{}
					if err := a.UnmarshalTo(cl); err != nil {
						t.Fatal(err)
					}
					if cl.GetName() == translator.JWKSCluster {
						return true
					}
				}
				return false
			}
			if got := hasJWKS(envoy); got != tc.envoyJWKS {
				t.Errorf("Envoy served %s: %v, want %v", translator.JWKSCluster, got, tc.envoyJWKS)
			}
			if hasJWKS(grpcGo) {
				t.Errorf("grpc-go served %s", translator.JWKSCluster)
			}
		})
	}
}

// serve serves c over ADS on a loopback port until ctx ends and returns a
// connection to it.
func serve(ctx context.Context, t *testing.T, c *Cache) *grpc.ClientConn {
	t.Helper()
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, c.Watcher(), nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// listeners opens an ADS stream as node, subscribes to listeners (names,
// or wildcard when nil) and describes each listener of the first response
// by name: a socket listener by its HTTP filters and route table, an API
// listener as "api" and its table. Each must pass ValidateAll.
func listeners(ctx context.Context, t *testing.T, conn *grpc.ClientConn, node *corev3.Node, delta bool, names []string) map[string]string {
	t.Helper()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	var anys []*anypb.Any
	if delta {
		s, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sub := names
		if sub == nil {
			sub = []string{"*"}
		}
		if err := s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, ResourceNamesSubscribe: sub}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetResources() {
			anys = append(anys, r.GetResource())
		}
	} else {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		anys = resp.GetResources()
	}
	out := map[string]string{}
	for _, a := range anys {
		l := &listenerv3.Listener{}
		if err := a.UnmarshalTo(l); err != nil {
			t.Fatal(err)
		}
		if err := l.ValidateAll(); err != nil {
			t.Errorf("listener %s: %v", l.GetName(), err)
		}
		hcm := &hcmv3.HttpConnectionManager{}
		if api := l.GetApiListener().GetApiListener(); api != nil {
			if err := api.UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			out[l.GetName()] = "api " + hcm.GetRds().GetRouteConfigName()
			continue
		}
		if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
			t.Fatal(err)
		}
		s := ""
		for _, f := range hcm.GetHttpFilters() {
			s += f.GetName() + " "
		}
		out[l.GetName()] = s + hcm.GetRds().GetRouteConfigName()
	}
	return out
}
