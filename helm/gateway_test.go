package helm

import (
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	// Register the typed_config types the bootstrap uses.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// parseBootstrap decodes an Envoy bootstrap YAML into go-control-plane's
// type, rejecting unknown fields, and runs Envoy's own validation rules:
// Envoy cannot run on our build machines, so this is what stands in for it.
func parseBootstrap(t *testing.T, name string, doc []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("%s: not an Envoy v3 bootstrap: %v", name, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &b
}

// checkADSOnly asserts the shape every prism gateway bootstrap has: all
// configuration from delta ADS over gRPC v3 (as envoy/ gives), no static
// listeners, one static cluster (the xDS server) spoken to over HTTP/2. It
// returns that cluster's first endpoint.
func checkADSOnly(t *testing.T, name string, b *bootstrapv3.Bootstrap) *corev3.SocketAddress {
	t.Helper()
	ads := b.GetDynamicResources().GetAdsConfig()
	if ads.GetApiType() != corev3.ApiConfigSource_DELTA_GRPC || ads.GetTransportApiVersion() != corev3.ApiVersion_V3 || len(ads.GetGrpcServices()) != 1 {
		t.Fatalf("%s: ads_config %v, want one delta gRPC v3 service", name, ads)
	}
	for what, src := range map[string]*corev3.ConfigSource{"lds": b.GetDynamicResources().GetLdsConfig(), "cds": b.GetDynamicResources().GetCdsConfig()} {
		if src.GetAds() == nil || src.GetResourceApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("%s: %s_config %v, want ADS v3", name, what, src)
		}
	}
	if n := len(b.GetStaticResources().GetListeners()); n != 0 {
		t.Errorf("%s: %d static listeners; listeners come from xDS", name, n)
	}
	clusters := b.GetStaticResources().GetClusters()
	xdsName := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	if len(clusters) != 1 || clusters[0].GetName() != xdsName {
		t.Fatalf("%s: static clusters %d, want only the xDS cluster %q", name, len(clusters), xdsName)
	}
	if _, ok := clusters[0].GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
		t.Errorf("%s: xDS cluster %s does not speak HTTP/2 (gRPC needs it)", name, xdsName)
	}
	eps := clusters[0].GetLoadAssignment().GetEndpoints()
	if len(eps) == 0 || len(eps[0].GetLbEndpoints()) == 0 {
		t.Fatalf("%s: xDS cluster has no endpoint", name)
	}
	return eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
}

func TestGatewayBootstrap(t *testing.T) {
	t.Parallel()
	r := render(t, valueSets["defaults"])
	cm := mustGet(t, r.configMaps, gatewayName+"-bootstrap")
	b := parseBootstrap(t, "chart bootstrap", []byte(cm.Data["bootstrap.yaml"]))
	addr := checkADSOnly(t, "chart bootstrap", b)
	if addr.GetAddress() != adminPeers+"."+namespace+".svc" || addr.GetPortValue() != 7001 {
		t.Errorf("xDS server %s:%d, want the admin nodes' gRPC port via %s", addr.GetAddress(), addr.GetPortValue(), adminPeers)
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" {
		t.Errorf("Envoy admin on %q: it must stay on loopback", a.GetAddress())
	}
	if mon := b.GetOverloadManager().GetResourceMonitors(); len(mon) != 1 || mon[0].GetTypedConfig() == nil {
		t.Errorf("no downstream connection limit: %v", mon)
	}
	if b.GetNode().GetCluster() != gatewayName {
		t.Errorf("node.cluster %q", b.GetNode().GetCluster())
	}
	dep := mustGet(t, r.deployments, gatewayName)
	envoy := container(t, dep.Spec.Template.Spec, "envoy")
	if a := args(envoy); a["--service-node"] != "$(POD_NAME)" && a["--service-node"] != gatewayName+"/$(POD_NAME)" || a["--config-path"] != "/etc/envoy/bootstrap.yaml" {
		t.Errorf("envoy args %v: each Envoy needs its own node id and the mounted bootstrap", envoy.Args)
	}
	if p := envoy.ReadinessProbe; p == nil || p.TCPSocket == nil || p.TCPSocket.Port.String() != "http" {
		t.Errorf("gateway readiness %s, want the xDS-delivered listener port", toYAML(p))
	}
}

// TestGatewayBootstrapMatchesEnvoyDir keeps the chart's bootstrap (Helm
// cannot read files outside the chart) equivalent to the one in envoy/ in
// what matters: ADS-only, no static listeners, one HTTP/2 xDS cluster.
func TestGatewayBootstrapMatchesEnvoyDir(t *testing.T) {
	t.Parallel()
	matches, _ := filepath.Glob(filepath.Join("..", "envoy", "*bootstrap*.yaml"))
	if len(matches) == 0 {
		t.Skip("envoy/ has no bootstrap yet; the chart's own bootstrap is checked by TestGatewayBootstrap")
	}
	r := render(t, valueSets["defaults"])
	chartB := parseBootstrap(t, "chart bootstrap", []byte(mustGet(t, r.configMaps, gatewayName+"-bootstrap").Data["bootstrap.yaml"]))
	checkADSOnly(t, "chart bootstrap", chartB)
	for _, path := range matches {
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		repoB := parseBootstrap(t, path, doc)
		checkADSOnly(t, path, repoB)
		if chartB.GetDynamicResources().GetAdsConfig().GetSetNodeOnFirstMessageOnly() != repoB.GetDynamicResources().GetAdsConfig().GetSetNodeOnFirstMessageOnly() {
			t.Errorf("%s: set_node_on_first_message_only differs from the chart's", path)
		}
	}
}

// TestHelmTestQueriesGateway: the `helm test` pod asks the gateway Service
// for an unknown mailbox without a token: with query tokens on it expects
// the gateway's 401 missing_token refusal, with gateway.queryAuth.disabled
// the JSON 404 the xDS routes send.
func TestHelmTestQueriesGateway(t *testing.T) {
	t.Parallel()
	// The scripts grep for what the translator's direct 404 and the Envoy
	// gateway's refusal of a query without a token say.
	if !strings.Contains(translator.NotFoundBody, "NOT_FOUND") {
		t.Fatalf("gateway 404 body %s no longer says NOT_FOUND; update the test pod", translator.NotFoundBody)
	}
	if refusal := envoyListenersJSON(t, ir.QueryAuth{JWKSURL: "https://idp.example.com/jwks", Issuer: "i", Audience: "a"}); !strings.Contains(refusal, `"missing_token"`) {
		t.Fatalf("the Envoy gateway's listener no longer answers a query without a token with code missing_token; update the test pod:\n%s", refusal)
	}
	tests := []struct {
		name string
		vals map[string]any
		want []string
	}{
		{"query tokens", valueSets["defaults"], []string{`[ "$code" = 401 ]`, "missing_token", "query tokens are on"}},
		{"query auth disabled", valueSets["query auth disabled"], []string{`[ "$code" = 404 ]`, "NOT_FOUND"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			pod := mustGet(t, r.pods, gatewayName+"-test")
			if pod.Annotations["helm.sh/hook"] != "test" || pod.Spec.RestartPolicy != "Never" {
				t.Errorf("test pod hook %q restartPolicy %q", pod.Annotations["helm.sh/hook"], pod.Spec.RestartPolicy)
			}
			script := strings.Join(pod.Spec.Containers[0].Args, "\n")
			svc := mustGet(t, r.services, gatewayName)
			for _, want := range append([]string{fmt.Sprintf("http://%s:%d/v1/mailboxes/", svc.Name, svc.Spec.Ports[0].Port)}, tc.want...) {
				if !strings.Contains(script, want) {
					t.Errorf("test script lacks %q:\n%s", want, script)
				}
			}
			if strings.Contains(script, "Authorization") {
				t.Errorf("test script sends a token it does not have:\n%s", script)
			}
		})
	}
}

// envoyListenersJSON is the Envoy gateway's listeners the admin sends with q.
func envoyListenersJSON(t *testing.T, q ir.QueryAuth) string {
	t.Helper()
	res, err := translator.Translate(&ir.IR{Version: 1, Gateway: ir.Gateway{Address: "0.0.0.0:10000", QueryAuth: q}})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range res.ForEnvoy()[resource.ListenerType] {
		js, err := protojson.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(js)
	}
	return b.String()
}

// TestGatewayQueryAuth: the admin nodes get the query token rules of
// gateway.queryAuth as flags, and a JWKS from a ConfigMap is mounted in the
// Envoy pods at the path the flag names.
func TestGatewayQueryAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		vals      map[string]any
		want      map[string]string // admin flags and their values
		noAuth    bool
		configMap string
	}{
		{"jwks url", valueSets["defaults"], map[string]string{
			"--gateway-jwks-url": "https://idp.example.com/.well-known/jwks.json", "--gateway-jwt-issuer": "https://idp.example.com",
			"--gateway-jwt-audience": "prism", "--gateway-jwt-namespaces-claim": "prism_namespaces",
		}, false, ""},
		{"jwks url with a CA", valueSets["query auth with a CA and port"], map[string]string{
			"--gateway-jwks-url": "https://idp.corp.example:8443/keys", "--gateway-jwks-ca": "/etc/prism/tls/ca.crt",
			"--gateway-jwt-issuer": "https://idp.corp.example", "--gateway-jwt-audience": "prism-queries", "--gateway-jwt-namespaces-claim": "scopes",
		}, false, ""},
		{"jwks configmap", valueSets["query auth from a ConfigMap"], map[string]string{
			"--gateway-jwks-file": "/etc/prism/jwks/jwks.json", "--gateway-jwt-issuer": "https://idp.example.com",
			"--gateway-jwt-audience": "prism", "--gateway-jwt-namespaces-claim": "prism_namespaces",
		}, false, "prism-jwks"},
		{"disabled", valueSets["query auth disabled"], map[string]string{}, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			admin := container(t, mustGet(t, r.statefulSets, adminName).Spec.Template.Spec, "admin")
			got := map[string]string{}
			for k, v := range args(admin) {
				if strings.HasPrefix(k, "--gateway-j") {
					got[k] = v
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("admin query auth flags %v, want %v", got, tc.want)
			}
			if noAuth := slices.Contains(admin.Args, "--gateway-no-query-auth"); noAuth != tc.noAuth {
				t.Errorf("--gateway-no-query-auth %v, want %v", noAuth, tc.noAuth)
			}
			spec := mustGet(t, r.deployments, gatewayName).Spec.Template.Spec
			var mounted string
			for _, v := range spec.Volumes {
				if v.ConfigMap == nil || v.ConfigMap.Name != tc.configMap {
					continue
				}
				for _, m := range container(t, spec, "envoy").VolumeMounts {
					if m.Name != v.Name {
						continue
					}
					if !m.ReadOnly {
						t.Errorf("JWKS mount %s is writable", m.MountPath)
					}
					for _, item := range v.ConfigMap.Items {
						if item.Key == "jwks.json" {
							mounted = path.Join(m.MountPath, item.Path)
						}
					}
				}
			}
			if tc.configMap != "" && mounted != tc.want["--gateway-jwks-file"] {
				t.Errorf("ConfigMap %s key jwks.json is at %q in the Envoy pods; the admins send --gateway-jwks-file=%s", tc.configMap, mounted, tc.want["--gateway-jwks-file"])
			}
		})
	}
}

// What listens is what the chart points at: the listener the admin announces
// over xDS (--gateway-addr) is on the port of the Envoy container that the
// readiness probe and the Service's targetPort name. Without it Envoy listens
// on prism admin's default 8080 and its pods never become Ready.
func TestGatewayListenerIsWhatTheChartProbes(t *testing.T) {
	t.Parallel()
	for _, port := range []int{0, 12345} {
		t.Run(fmt.Sprint(port), func(t *testing.T) {
			t.Parallel()
			overrides := valueSets["defaults"]
			if port != 0 {
				overrides = withQueryAuth(map[string]any{"gateway": map[string]any{"port": port}})
			}
			r := render(t, overrides)
			admin := container(t, mustGet(t, r.statefulSets, adminName).Spec.Template.Spec, "admin")
			listen := args(admin)["--gateway-addr"]
			envoy := container(t, mustGet(t, r.deployments, gatewayName).Spec.Template.Spec, "envoy")
			var http int32
			for _, p := range envoy.Ports {
				if p.Name == "http" {
					http = p.ContainerPort
				}
			}
			if want := fmt.Sprintf("0.0.0.0:%d", http); http == 0 || listen != want {
				t.Fatalf("admin announces the gateway listener at %q; Envoy's http port is %d (want %q)", listen, http, want)
			}
			if port != 0 && http != int32(port) {
				t.Fatalf("envoy http port %d, want gateway.port %d", http, port)
			}
			if p := envoy.ReadinessProbe.TCPSocket.Port.String(); p != "http" {
				t.Errorf("readiness probe on port %q, want the http port", p)
			}
			svc := mustGet(t, r.services, gatewayName)
			if tp := svc.Spec.Ports[0].TargetPort.String(); tp != "http" {
				t.Errorf("Service targetPort %q, want the http port", tp)
			}
		})
	}
}

// TestGatewayNodeIDMatchesIdentity: the admin nodes serve a gateway/<name>
// identity over xDS only as node <name> or <name>/<replica>, so each mode's
// Envoy node id must start with the name of the certificate it presents:
// the pod's own in cert-manager mode, the one shared identity (the hook Job's
// --gateway-name, or tls.secret.gatewayName) otherwise.
func TestGatewayNodeIDMatchesIdentity(t *testing.T) {
	t.Parallel()
	withName := withQueryAuth(map[string]any{"tls": map[string]any{"mode": "secret", "secret": map[string]any{
		"admin": "admin-certs", "runner": "proxy-certs", "gateway": "gateway-certs", "gatewayName": "edge",
	}}})
	for _, tc := range []struct {
		name string
		vals map[string]any
		want func(r *rendered) string
	}{
		{"cert-manager", valueSets["defaults"], func(*rendered) string { return "$(POD_NAME)" }},
		{"secret", secretMode, func(*rendered) string { return gatewayName + "/$(POD_NAME)" }},
		{"secret with a named identity", withName, func(*rendered) string { return "edge/$(POD_NAME)" }},
		{"generate", generateMode, func(r *rendered) string {
			for _, j := range r.jobs {
				for _, c := range j.Spec.Template.Spec.Containers {
					if n := args(c)["--gateway-name"]; n != "" {
						return n + "/$(POD_NAME)"
					}
				}
			}
			t.Fatal("no hook Job issues the gateway's identity")
			return ""
		}},
	} {
		r := render(t, tc.vals)
		envoy := container(t, mustGet(t, r.deployments, gatewayName).Spec.Template.Spec, "envoy")
		if got, want := args(envoy)["--service-node"], tc.want(r); got != want {
			t.Errorf("%s: Envoy's node id %q, want %q", tc.name, got, want)
		}
	}
}

// grpc-go gateways look namespaces up (RLS) at the target the admins send
// over xDS: it must be the admin Service's gRPC port, which reaches any
// ready admin node, not one pod's own address.
func TestLookupTargetIsTheAdminService(t *testing.T) {
	t.Parallel()
	r := render(t, valueSets["defaults"])
	admin := container(t, mustGet(t, r.statefulSets, adminName).Spec.Template.Spec, "admin")
	svc := mustGet(t, r.services, adminName)
	var grpcPort int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			grpcPort = p.Port
		}
	}
	want := fmt.Sprintf("dns:///%s.%s.svc:%d", svc.Name, svc.Namespace, grpcPort)
	if got := args(admin)["--lookup-target"]; grpcPort == 0 || got != want {
		t.Fatalf("--lookup-target=%q, want the admin Service's gRPC port %q", got, want)
	}
}
