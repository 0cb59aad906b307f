package translator

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/authtest"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/xds/ir"
)

// TestEnvoyAcceptsResources runs `envoy --mode validate` on what every
// golden input gives Envoy, made static (route tables inline, EDS clusters
// with their endpoints), so Envoy itself, not only the protos' rules, checks
// the query auth filters, ext_authz per route and local replies. It needs an
// envoy binary on PATH and says so when it skips.
func TestEnvoyAcceptsResources(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("envoy")
	if err != nil {
		t.Skip("SKIP: no envoy on PATH; Envoy's own validation of the translated resources did not run")
	}
	inputs, err := filepath.Glob("testdata/*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	files := pkitest.New(t).Files(identity.Gateway, "envoy")
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	authtest.WriteJWKS(t, jwks, authtest.NewKey(t, "k1", jose.ES256))
	for _, in := range inputs {
		t.Run(strings.TrimSuffix(filepath.Base(in), ".in.yaml"), func(t *testing.T) {
			res, _ := Translate(readIR(t, in))
			b, err := protojson.Marshal(staticBootstrap(t, res, files))
			if err != nil {
				t.Fatal(err)
			}
			// The files the inputs name on the Envoy host, here.
			cfg := strings.NewReplacer(
				`"/etc/prism/jwks.json"`, `"`+jwks+`"`,
				`"/etc/prism/idp-ca.pem"`, `"`+files.CA+`"`,
				`"`+ir.DefaultJWKSCA+`"`, `"`+files.CA+`"`,
			).Replace(string(b))
			path := filepath.Join(t.TempDir(), "envoy.json")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "--mode", "validate", "-c", path, "--log-level", "warn").CombinedOutput()
			if err != nil {
				t.Fatalf("envoy rejects the resources: %v\n%s", err, out)
			}
		})
	}
}

// staticBootstrap is Envoy's variant of res as static resources, with the
// gateway identity's files as the static secrets the TLS clusters name.
func staticBootstrap(t *testing.T, res *Resources, files pki.Files) *bootstrapv3.Bootstrap {
	t.Helper()
	served := res.ForEnvoy()
	routes := map[string]*routev3.RouteConfiguration{}
	for _, r := range served[resource.RouteType] {
		rc := r.(*routev3.RouteConfiguration)
		routes[rc.Name] = rc
	}
	endpoints := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, r := range served[resource.EndpointType] {
		la := r.(*endpointv3.ClusterLoadAssignment)
		endpoints[la.ClusterName] = la
	}
	static := &bootstrapv3.Bootstrap_StaticResources{}
	for _, r := range served[resource.ListenerType] {
		l := proto.Clone(r).(*listenerv3.Listener)
		f := l.FilterChains[0].Filters[0]
		hcm := &hcmv3.HttpConnectionManager{}
		if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
			t.Fatal(err)
		}
		hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: routes[hcm.GetRds().GetRouteConfigName()]}
		a, err := toAny(hcm)
		if err != nil {
			t.Fatal(err)
		}
		f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
		static.Listeners = append(static.Listeners, l)
	}
	for _, r := range served[resource.ClusterType] {
		c := proto.Clone(r).(*clusterv3.Cluster)
		if c.GetType() == clusterv3.Cluster_EDS {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
			c.EdsClusterConfig = nil
			c.LoadAssignment = endpoints[c.Name]
		}
		static.Clusters = append(static.Clusters, c)
	}
	file := func(path string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}}
	}
	static.Secrets = []*tlsv3.Secret{
		{Name: EnvoyIdentitySecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: file(files.Cert), PrivateKey: file(files.Key),
		}}},
		{Name: EnvoyCASecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: file(files.CA),
		}}},
	}
	return &bootstrapv3.Bootstrap{StaticResources: static}
}
