package helm

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	// Register the typed_config types the bootstrap uses.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/helm/chartrender"
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
// configuration from delta ADS over gRPC v3 (as envoy/ gives), waited for
// without an initial fetch timeout (so Envoy is not LIVE, /ready not 200,
// before the admin nodes answer); one static listener, the stats listener,
// passing only GET /stats/prometheus and GET /ready to the admin interface
// on loopback; static clusters only the xDS server, spoken to over HTTP/2,
// and that admin interface. It returns the xDS cluster's first endpoint and
// the stats listener's port.
func checkADSOnly(t *testing.T, name string, b *bootstrapv3.Bootstrap) (xds *corev3.SocketAddress, statsPort uint32) {
	t.Helper()
	ads := b.GetDynamicResources().GetAdsConfig()
	if ads.GetApiType() != corev3.ApiConfigSource_DELTA_GRPC || ads.GetTransportApiVersion() != corev3.ApiVersion_V3 || len(ads.GetGrpcServices()) != 1 {
		t.Fatalf("%s: ads_config %v, want one delta gRPC v3 service", name, ads)
	}
	for what, src := range map[string]*corev3.ConfigSource{"lds": b.GetDynamicResources().GetLdsConfig(), "cds": b.GetDynamicResources().GetCdsConfig()} {
		if src.GetAds() == nil || src.GetResourceApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("%s: %s_config %v, want ADS v3", name, what, src)
		}
		if ft := src.GetInitialFetchTimeout(); ft == nil || ft.AsDuration() != 0 {
			t.Errorf("%s: %s_config initial_fetch_timeout %v, want 0s: Envoy would go LIVE without its configuration", name, what, ft)
		}
	}
	clusters := b.GetStaticResources().GetClusters()
	xdsName := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	if len(clusters) != 2 || clusters[0].GetName() != xdsName {
		t.Fatalf("%s: static clusters %d, want the xDS cluster %q and the admin interface", name, len(clusters), xdsName)
	}
	if _, ok := clusters[0].GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
		t.Errorf("%s: xDS cluster %s does not speak HTTP/2 (gRPC needs it)", name, xdsName)
	}
	eps := clusters[0].GetLoadAssignment().GetEndpoints()
	if len(eps) == 0 || len(eps[0].GetLbEndpoints()) == 0 {
		t.Fatalf("%s: xDS cluster has no endpoint", name)
	}
	admin := b.GetAdmin().GetAddress()
	if a := admin.GetSocketAddress().GetAddress(); a != "127.0.0.1" {
		t.Errorf("%s: Envoy admin on %q: it must stay on loopback", name, a)
	}
	adminEps := clusters[1].GetLoadAssignment().GetEndpoints()
	if len(adminEps) != 1 || len(adminEps[0].GetLbEndpoints()) != 1 || !proto.Equal(adminEps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress(), admin) {
		t.Errorf("%s: static cluster %s %v is not the admin interface %v", name, clusters[1].GetName(), adminEps, admin)
	}

	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%s: %d static listeners, want only the stats listener; the gateway's comes from xDS", name, len(listeners))
	}
	stats := listeners[0]
	if !stats.GetIgnoreGlobalConnLimit() {
		t.Errorf("%s: stats listener counts against the connection limit: probes would fail when clients hold every connection", name)
	}
	chains := stats.GetFilterChains()
	if len(chains) != 1 || len(chains[0].GetFilters()) != 1 {
		t.Fatalf("%s: stats listener filter chains %v, want one HTTP connection manager", name, chains)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := chains[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatalf("%s: stats listener: %v", name, err)
	}
	var paths []string
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			m := r.GetMatch()
			if m.GetPath() == "" {
				t.Errorf("%s: stats route %v does not match one exact path", name, m)
			}
			if h := m.GetHeaders(); len(h) != 1 || h[0].GetName() != ":method" || h[0].GetStringMatch().GetExact() != "GET" {
				t.Errorf("%s: stats route %s is not GET only", name, m.GetPath())
			}
			if c := r.GetRoute().GetCluster(); c != clusters[1].GetName() {
				t.Errorf("%s: stats route %s goes to %q, want the admin interface", name, m.GetPath(), c)
			}
			paths = append(paths, m.GetPath())
		}
	}
	if slices.Sort(paths); !slices.Equal(paths, []string{"/ready", "/stats/prometheus"}) {
		t.Errorf("%s: stats listener passes %q to the admin interface, want only /ready and /stats/prometheus", name, paths)
	}
	return eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress(), stats.GetAddress().GetSocketAddress().GetPortValue()
}

// containerPort is c's port named name; 0 if none.
func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func TestGatewayBootstrap(t *testing.T) {
	t.Parallel()
	r := render(t, valueSets["defaults"])
	cm := chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap")
	b := parseBootstrap(t, "chart bootstrap", []byte(cm.Data["bootstrap.yaml"]))
	addr, statsPort := checkADSOnly(t, "chart bootstrap", b)
	if addr.GetAddress() != adminPeers+"."+namespace+".svc" || addr.GetPortValue() != 7001 {
		t.Errorf("xDS server %s:%d, want the admin nodes' gRPC port via %s", addr.GetAddress(), addr.GetPortValue(), adminPeers)
	}
	if mon := b.GetOverloadManager().GetResourceMonitors(); len(mon) != 1 || mon[0].GetTypedConfig() == nil {
		t.Errorf("no downstream connection limit: %v", mon)
	}
	if b.GetNode().GetCluster() != gatewayName {
		t.Errorf("node.cluster %q", b.GetNode().GetCluster())
	}
	dep := chartrender.MustGet(t, r.Deployments, gatewayName)
	proxy := container(t, dep.Spec.Template.Spec, "envoy")
	if a := args(proxy); a["--service-node"] != "$(POD_NAME)" && a["--service-node"] != gatewayName+"/$(POD_NAME)" || a["--config-path"] != "/etc/envoy/bootstrap.yaml" {
		t.Errorf("envoy args %v: each Envoy needs its own node id and the mounted bootstrap", proxy.Args)
	}
	if p := proxy.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/ready" || p.HTTPGet.Port.String() != "stats" {
		t.Errorf("gateway readiness %s, want GET /ready on the stats port", toYAML(p))
	}
	if got := containerPort(proxy, "stats"); got == 0 || uint32(got) != statsPort {
		t.Errorf("envoy container port stats %d, the bootstrap's stats listener %d", got, statsPort)
	}
}

// TestGatewayBootstrapIsEnvoyBootstrap: the chart's bootstrap (a template,
// as Helm cannot run Go) is, field for field, what envoy.Bootstrap builds
// from the same values, under every values set: one bootstrap, two spellings.
func TestGatewayBootstrapIsEnvoyBootstrap(t *testing.T) {
	t.Parallel()
	sets := maps.Clone(valueSets)
	sets["other ports and limit"] = withQueryAuth(map[string]any{
		"gateway": map[string]any{"port": 8000, "adminPort": 19000, "statsPort": 15090, "maxConnections": 1234},
		"admin":   map[string]any{"ports": map[string]any{"grpc": 9443}},
	})
	for name, vals := range sets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := render(t, vals)
			chart := parseBootstrap(t, "chart bootstrap", []byte(chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap").Data["bootstrap.yaml"]))
			want, err := envoy.Bootstrap(envoyConfig(t, vals))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := bootstrapYAML(t, chart), bootstrapYAML(t, want); got != want {
				t.Errorf("the chart's bootstrap is not envoy.Bootstrap's for the same values (- envoy, + chart):\n%s", lineDiff(want, got))
			}
		})
	}
}

// envoyConfig is the envoy.Config of the chart's values merged with vals.
func envoyConfig(t *testing.T, vals map[string]any) envoy.Config {
	t.Helper()
	ch := loadChart(t)
	v := renderValues(t, ch, vals)
	get := func(path string) any {
		x, err := v.PathValue("Values." + path)
		if err != nil {
			t.Fatalf("values %s: %v", path, err)
		}
		return x
	}
	num := func(path string) int64 {
		switch n := get(path).(type) {
		case float64:
			return int64(n)
		case int:
			return int64(n)
		case int64:
			return n
		default:
			t.Fatalf("values %s: %T %v is not a number", path, n, n)
			return 0
		}
	}
	c := envoy.Config{
		NodeCluster:    gatewayName,
		AdminNodes:     []string{fmt.Sprintf("%s.%s.svc:%d", adminPeers, namespace, num("admin.ports.grpc"))},
		AdminAddress:   fmt.Sprintf("127.0.0.1:%d", num("gateway.adminPort")),
		StatsAddress:   fmt.Sprintf("0.0.0.0:%d", num("gateway.statsPort")),
		MaxConnections: num("gateway.maxConnections"),
	}
	if get("tls.mode") != "insecure" {
		c.TLS = &envoy.TLS{CA: "/etc/prism/tls/ca.crt", Cert: "/etc/prism/tls/tls.crt", Key: "/etc/prism/tls/tls.key", TrustDomain: get("tls.trustDomain").(string)}
	}
	return c
}

// bootstrapYAML is b as sorted YAML, typed configs unpacked, so equal
// bootstraps give equal text however their Any bytes were marshalled.
func bootstrapYAML(t *testing.T, b *bootstrapv3.Bootstrap) string {
	t.Helper()
	js, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		t.Fatal(err)
	}
	return string(y)
}

// lineDiff lists the lines of a and b outside their longest common
// subsequence, - for a's and + for b's, in order.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case j < len(y) && (i == len(x) || lcs[i][j+1] >= lcs[i+1][j]):
			fmt.Fprintf(&out, "+ %s\n", y[j])
			j++
		default:
			fmt.Fprintf(&out, "- %s\n", x[i])
			i++
		}
	}
	return out.String()
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
			pod := chartrender.MustGet(t, r.Pods, gatewayName+"-test")
			if pod.Annotations["helm.sh/hook"] != "test" || pod.Spec.RestartPolicy != "Never" {
				t.Errorf("test pod hook %q restartPolicy %q", pod.Annotations["helm.sh/hook"], pod.Spec.RestartPolicy)
			}
			script := strings.Join(pod.Spec.Containers[0].Args, "\n")
			svc := chartrender.MustGet(t, r.Services, gatewayName)
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
			admin := container(t, chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec, "admin")
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
			spec := chartrender.MustGet(t, r.Deployments, gatewayName).Spec.Template.Spec
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
// Service's targetPort names, and the readiness probe asks Envoy's /ready on
// the container port where the bootstrap's stats listener passes it to the
// admin interface. Without --gateway-addr Envoy listens on prism admin's
// default 8080 and serves no one.
func TestGatewayListenerIsWhatTheChartProbes(t *testing.T) {
	t.Parallel()
	for _, ports := range []map[string]any{nil, {"port": 12345, "statsPort": 12346, "adminPort": 12347}} {
		t.Run(fmt.Sprint(ports), func(t *testing.T) {
			t.Parallel()
			overrides := valueSets["defaults"]
			if ports != nil {
				overrides = withQueryAuth(map[string]any{"gateway": ports})
			}
			r := render(t, overrides)
			admin := container(t, chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec, "admin")
			listen := args(admin)["--gateway-addr"]
			proxy := container(t, chartrender.MustGet(t, r.Deployments, gatewayName).Spec.Template.Spec, "envoy")
			http, stats := containerPort(proxy, "http"), containerPort(proxy, "stats")
			if want := fmt.Sprintf("0.0.0.0:%d", http); http == 0 || listen != want {
				t.Fatalf("admin announces the gateway listener at %q; Envoy's http port is %d (want %q)", listen, http, want)
			}
			if ports != nil && (http != int32(ports["port"].(int)) || stats != int32(ports["statsPort"].(int))) {
				t.Fatalf("envoy http and stats ports %d and %d, want gateway.port %v and gateway.statsPort %v", http, stats, ports["port"], ports["statsPort"])
			}
			b := parseBootstrap(t, "chart bootstrap", []byte(chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap").Data["bootstrap.yaml"]))
			if _, listener := checkADSOnly(t, "chart bootstrap", b); stats == 0 || uint32(stats) != listener {
				t.Errorf("envoy stats port %d, the bootstrap's stats listener is on %d", stats, listener)
			}
			if p := proxy.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "stats" || p.HTTPGet.Path != "/ready" {
				t.Errorf("readiness probe %s, want GET /ready on the stats port", toYAML(p))
			}
			svc := chartrender.MustGet(t, r.Services, gatewayName)
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
			for _, j := range r.Jobs {
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
		proxy := container(t, chartrender.MustGet(t, r.Deployments, gatewayName).Spec.Template.Spec, "envoy")
		if got, want := args(proxy)["--service-node"], tc.want(r); got != want {
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
	admin := container(t, chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec, "admin")
	svc := chartrender.MustGet(t, r.Services, adminName)
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
