package cache

import (
	"context"
	"io"
	"log/slog"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// TestGatewayPerDataPlane: both data planes are served the same gateway
// listener, which checks tokens under query auth and always asks the
// admin's ext_authz, each client from its own snapshot's marshaled bytes;
// only Envoy, which fetches the signing keys, is served the JWKS cluster.
func TestGatewayPerDataPlane(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		auth      bool
		want      string // the gateway listener's filters and route table
		envoyJWKS bool
	}{
		{name: "open", want: "envoy.filters.http.ext_authz envoy.filters.http.router " + translator.GatewayRouteConfigName},
		{name: "query auth", auth: true, envoyJWKS: true, want: "envoy.filters.http.jwt_authn envoy.filters.http.ext_authz envoy.filters.http.router " + translator.GatewayRouteConfigName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
			x := state(7, 1)
			if tc.auth {
				x.Gateway.QueryAuth = ir.QueryAuth{Issuer: "https://idp.example", Audience: "prism", JWKSURL: "https://idp.example/jwks.json"}
			}
			res, err := translator.Translate(x)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Set(context.Background(), 7, res); err != nil {
				t.Fatal(err)
			}
			gateway := func(userAgent string) string {
				t.Helper()
				out := sotw(t, c, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "gw", UserAgentName: userAgent}, TypeUrl: resource.ListenerType})
				for _, a := range out.GetResources() {
					l := &listenerv3.Listener{}
					if err := a.UnmarshalTo(l); err != nil {
						t.Fatal(err)
					}
					if l.GetName() != translator.GatewayListenerName {
						continue
					}
					hcm := &hcmv3.HttpConnectionManager{}
					if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
						t.Fatal(err)
					}
					s := ""
					for _, f := range hcm.GetHttpFilters() {
						s += f.GetName() + " "
					}
					return s + hcm.GetRds().GetRouteConfigName()
				}
				t.Fatal("no gateway listener")
				return ""
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
			for _, ua := range []string{"envoy", "gRPC Go"} {
				if got := gateway(ua); got != tc.want {
					t.Errorf("%s's gateway listener = %q, want %q", ua, got, tc.want)
				}
			}
			if got := hasJWKS("envoy"); got != tc.envoyJWKS {
				t.Errorf("Envoy served %s: %v, want %v", translator.JWKSCluster, got, tc.envoyJWKS)
			}
			if hasJWKS("gRPC Go") {
				t.Errorf("grpc-go served %s", translator.JWKSCluster)
			}
		})
	}
}
