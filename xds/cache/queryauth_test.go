package cache

import (
	"context"
	"io"
	"log/slog"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// TestGatewayListenerPerDataPlane: under query auth Envoy's gateway
// listener checks tokens and routes by the gateway table while grpc-go's
// snapshot keeps the open listener on mailbox-routes, at the same version
// and under the same name, each from its own marshaled bytes; without query
// auth both get the same listener.
func TestGatewayListenerPerDataPlane(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		auth      bool
		wantEnvoy string // the gateway listener's filters and route table
	}{
		{name: "open", wantEnvoy: "envoy.filters.http.router " + translator.RouteConfigName},
		{name: "query auth", auth: true, wantEnvoy: "envoy.filters.http.jwt_authn envoy.filters.http.rbac envoy.filters.http.router " + translator.GatewayRouteConfigName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
			x := state(7, 1)
			if tc.auth {
				x.Gateway.QueryAuth = ir.QueryAuth{Issuer: "https://idp.example", Audience: "prism", JWKSFile: "/jwks.json"}
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
			// Envoy first, so a shared memo would hand grpc-go Envoy's bytes.
			if got := gateway("envoy"); got != tc.wantEnvoy {
				t.Errorf("Envoy's gateway listener = %q, want %q", got, tc.wantEnvoy)
			}
			if got, want := gateway("gRPC Go"), "envoy.filters.http.router "+translator.RouteConfigName; got != want {
				t.Errorf("grpc-go's gateway listener = %q, want %q", got, want)
			}
		})
	}
}
