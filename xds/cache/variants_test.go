package cache

import (
	"context"
	"io"
	"log/slog"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

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
