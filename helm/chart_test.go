package helm

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/prism-mesh/prism/sidecar/inject"
)

const (
	adminName    = "prism-admin"
	adminPeers   = "prism-admin-peers"
	runnerName   = "prism-runner"
	injectorName = "prism-injector"
	gatewayName  = "prism-gateway"
)

// valueSets are the configurations the chart is tested under; every test
// that checks general invariants runs over all of them. "defaults" is the
// chart's defaults plus what every install must say: how the gateway checks
// query tokens.
var valueSets = map[string]map[string]any{
	"defaults": withQueryAuth(nil),
	"cert-manager": withQueryAuth(map[string]any{
		"injector": map[string]any{"certManager": map[string]any{"enabled": true}},
	}),
	"cert-manager with cluster issuer": withQueryAuth(map[string]any{
		"injector": map[string]any{"certManager": map[string]any{
			"enabled": true, "issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"},
		}},
	}),
	"custom kafka and static topics": withQueryAuth(map[string]any{
		"kafka":  map[string]any{"brokers": []any{"b-1.kafka.example:9094", "b-2.kafka.example:9094", "b-3.kafka.example:9094"}},
		"runner": map[string]any{"topics": []any{"audit.events", "billing.events"}, "mailbox": "audit-logs@proxy-01", "replicas": 4},
	}),
	"five soft-spread admins and a load balancer": withQueryAuth(map[string]any{
		"admin":   map[string]any{"replicas": 5, "antiAffinity": "soft"},
		"gateway": map[string]any{"service": map[string]any{"type": "LoadBalancer"}},
	}),
	"single admin": withQueryAuth(map[string]any{
		"admin": map[string]any{"replicas": 1},
	}),
	"tls from secrets":                secretMode,
	"insecure":                        insecureMode,
	"cert-manager with a corp issuer": corpIssuer,
	"no network policies":             withQueryAuth(map[string]any{"networkPolicy": map[string]any{"enabled": false}}),
	"query auth disabled":             queryAuth(map[string]any{"disabled": true}),
	"query auth from a ConfigMap": queryAuth(map[string]any{
		"jwksConfigMap": "prism-jwks", "issuer": "https://idp.example.com", "audience": "prism",
	}),
	"query auth with a CA and port": queryAuth(map[string]any{
		"jwksUrl": "https://idp.corp.example:8443/keys", "jwksCA": "/etc/prism/tls/ca.crt",
		"issuer": "https://idp.corp.example", "audience": "prism-queries", "namespacesClaim": "scopes",
	}),
}

// jwksURLAuth is the query auth of the value sets that are about something
// else: the chart refuses to render without one.
var jwksURLAuth = map[string]any{
	"jwksUrl": "https://idp.example.com/.well-known/jwks.json", "issuer": "https://idp.example.com", "audience": "prism",
}

// withQueryAuth is a copy of vals whose gateway.queryAuth is jwksURLAuth.
func withQueryAuth(vals map[string]any) map[string]any {
	out := maps.Clone(vals)
	if out == nil {
		out = map[string]any{}
	}
	gateway, _ := vals["gateway"].(map[string]any)
	gateway = maps.Clone(gateway)
	if gateway == nil {
		gateway = map[string]any{}
	}
	gateway["queryAuth"] = jwksURLAuth
	out["gateway"] = gateway
	return out
}

// queryAuth is the values setting gateway.queryAuth to q.
func queryAuth(q map[string]any) map[string]any {
	return map[string]any{"gateway": map[string]any{"queryAuth": q}}
}

// userConfigMaps are the ConfigMaps the values say the user provides.
func userConfigMaps(vals map[string]any) map[string]bool {
	gateway, _ := vals["gateway"].(map[string]any)
	q, _ := gateway["queryAuth"].(map[string]any)
	name, _ := q["jwksConfigMap"].(string)
	return map[string]bool{name: name != ""}
}

// userSecrets are the Secrets the values say the user provides.
func userSecrets(vals map[string]any) map[string]bool {
	out := map[string]bool{}
	tls, _ := vals["tls"].(map[string]any)
	secrets, _ := tls["secret"].(map[string]any)
	for _, v := range secrets {
		out[v.(string)] = true
	}
	return out
}

func TestChartLints(t *testing.T) {
	t.Parallel()
	for name, vals := range valueSets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			linter := lint.AllWithKubeVersion(chartDir, vals, namespace, &kubeVersion)
			for _, m := range linter.Messages {
				// INFO (e.g. "icon is recommended") is advice; anything
				// from WARNING up is a defect.
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

func TestChartMetadata(t *testing.T) {
	t.Parallel()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.AppVersion == "" || ch.Metadata.Version == "" || ch.Metadata.KubeVersion == "" {
		t.Errorf("Chart.yaml lacks appVersion, version or kubeVersion: %+v", ch.Metadata)
	}
}

// TestRenderedObjectsAreSound checks what must hold under every values set:
// strict decoding (done by render), resources and restricted security on
// every container, references between objects that resolve.
func TestRenderedObjectsAreSound(t *testing.T) {
	t.Parallel()
	for name, vals := range valueSets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := render(t, vals)
			for wl, tmpl := range r.podTemplates() {
				spec := tmpl.Spec
				for k, v := range tmpl.Labels {
					if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
						t.Errorf("%s: label %s=%q: %v", wl, k, v, msgs)
					}
				}
				if _, ok := r.accounts[spec.ServiceAccountName]; !ok {
					t.Errorf("%s: service account %q not rendered", wl, spec.ServiceAccountName)
				}
				if spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot {
					t.Errorf("%s: pod may run as root", wl)
				}
				if v := tmpl.Labels[inject.LabelInject]; v != "true" && v != "false" {
					t.Errorf("%s: pod template label %s=%q: every prism pod states whether it gets the sidecar", wl, inject.LabelInject, v)
				}
				for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
					if c.Image == "" || strings.HasSuffix(c.Image, ":") || c.ImagePullPolicy == "" {
						t.Errorf("%s/%s: image %q pull policy %q", wl, c.Name, c.Image, c.ImagePullPolicy)
					}
					req := c.Resources.Requests
					if req.Cpu().IsZero() || req.Memory().IsZero() {
						t.Errorf("%s/%s: no cpu or memory request", wl, c.Name)
					}
					sc := c.SecurityContext
					if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
						sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
						sc.Capabilities == nil || len(sc.Capabilities.Drop) == 0 {
						t.Errorf("%s/%s: security context not restricted: %s", wl, c.Name, toYAML(sc))
					}
				}
				for _, v := range spec.Volumes {
					switch {
					case v.ConfigMap != nil:
						if _, ok := r.configMaps[v.ConfigMap.Name]; !ok && !userConfigMaps(vals)[v.ConfigMap.Name] {
							t.Errorf("%s: volume %s: ConfigMap %s not rendered", wl, v.Name, v.ConfigMap.Name)
						}
					case v.Secret != nil:
						if !r.makesSecret(v.Secret.SecretName) && !userSecrets(vals)[v.Secret.SecretName] {
							t.Errorf("%s: volume %s: nothing makes Secret %s", wl, v.Name, v.Secret.SecretName)
						}
					}
				}
			}
			for _, pdb := range r.pdbs {
				if _, ok := r.selected(pdb.Spec.Selector.MatchLabels); !ok {
					t.Errorf("PDB %s selects no workload", pdb.Name)
				}
			}
			for sn, svc := range r.services {
				if msgs := validation.IsDNS1035Label(sn); len(msgs) > 0 {
					t.Errorf("service name %s: %v", sn, msgs)
				}
				tmpl, ok := r.selected(svc.Spec.Selector)
				if !ok {
					t.Errorf("service %s selects no workload: %v", sn, svc.Spec.Selector)
					continue
				}
				for _, p := range svc.Spec.Ports {
					if !hasPort(tmpl.Spec, p.TargetPort.String()) {
						t.Errorf("service %s port %s: target %s not a container port", sn, p.Name, p.TargetPort.String())
					}
				}
			}
		})
	}
}

func (r *rendered) makesSecret(name string) bool {
	if _, ok := r.secrets[name]; ok {
		return true
	}
	for _, c := range r.certificates {
		if c.Spec.SecretName == name {
			return true
		}
	}
	return false
}

// selected returns the pod template a Service selector matches.
func (r *rendered) selected(sel map[string]string) (corev1.PodTemplateSpec, bool) {
	for _, tmpl := range r.podTemplates() {
		match := len(sel) > 0
		for k, v := range sel {
			if tmpl.Labels[k] != v {
				match = false
			}
		}
		if match {
			return tmpl, true
		}
	}
	return corev1.PodTemplateSpec{}, false
}

func hasPort(spec corev1.PodSpec, target string) bool {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == target || fmt.Sprint(p.ContainerPort) == target {
				return true
			}
		}
	}
	return false
}

func TestAdminCluster(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		vals     map[string]any
		replicas int
		pdbMin   string
		hard     bool
	}{
		{"defaults", valueSets["defaults"], 3, "2", true},
		{"five soft", valueSets["five soft-spread admins and a load balancer"], 5, "3", false},
		{"single", valueSets["single admin"], 1, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			sts := mustGet(t, r.statefulSets, adminName)
			if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != tc.replicas {
				t.Fatalf("admin replicas %v, want %d", sts.Spec.Replicas, tc.replicas)
			}
			if sts.Spec.PodManagementPolicy != "Parallel" {
				t.Errorf("podManagementPolicy %q: voters must start together to elect a leader", sts.Spec.PodManagementPolicy)
			}
			if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().IsZero() {
				t.Errorf("admin has no sized PVC template")
			}
			headless := mustGet(t, r.services, adminPeers)
			if sts.Spec.ServiceName != adminPeers || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
				t.Errorf("admin serviceName %q; headless service %s", sts.Spec.ServiceName, toYAML(headless.Spec))
			}
			c := container(t, sts.Spec.Template.Spec, "admin")
			if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %s, want GET /readyz", toYAML(p))
			}
			if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
				t.Errorf("liveness probe %s, want GET /healthz", toYAML(p))
			}
			a := args(c)
			peers := strings.Split(a["--peers"], ",")
			if len(peers) != tc.replicas {
				t.Fatalf("--peers %q: want %d peers", a["--peers"], tc.replicas)
			}
			for i, p := range peers {
				host := fmt.Sprintf("%s-%d.%s.%s.svc", adminName, i, adminPeers, namespace)
				want := fmt.Sprintf("%s-%d=%s:7000=%s:7001", adminName, i, host, host)
				if p != want {
					t.Errorf("peer %d = %q, want %q", i, p, want)
				}
			}
			// Each node finds itself in --peers by its id, the pod name.
			if a["--node-id"] != "$(POD_NAME)" || a["--raft-advertise"] != "$(POD_IP):7000" || a["--data-dir"] != "/var/lib/prism" {
				t.Errorf("node id / raft advertise / data dir: %q %q %q", a["--node-id"], a["--raft-advertise"], a["--data-dir"])
			}
			if mount := c.VolumeMounts; len(mount) == 0 || mount[0].MountPath != a["--data-dir"] || mount[0].Name != sts.Spec.VolumeClaimTemplates[0].Name {
				t.Errorf("--data-dir %s is not the PVC mount %v", a["--data-dir"], mount)
			}
			aff := sts.Spec.Template.Spec.Affinity
			if aff == nil || aff.PodAntiAffinity == nil {
				t.Fatal("admin has no pod anti-affinity")
			}
			if hard := len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 1; hard != tc.hard {
				t.Errorf("hard anti-affinity %v, want %v", hard, tc.hard)
			}
			pdb, ok := r.pdbs[adminName]
			if tc.pdbMin == "" {
				if ok {
					t.Errorf("a PDB on a single admin node blocks every drain")
				}
				return
			}
			if !ok || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.String() != tc.pdbMin {
				t.Fatalf("admin PDB %v, want minAvailable %s (quorum)", pdb, tc.pdbMin)
			}
			if !matches(pdb.Spec.Selector.MatchLabels, sts.Spec.Template.Labels) {
				t.Errorf("PDB selector %v does not select admin pods", pdb.Spec.Selector.MatchLabels)
			}
		})
	}
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func TestRunnerAndKafka(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		vals    map[string]any
		brokers string
		topics  []string
	}{
		{"defaults", valueSets["defaults"], "kafka:9092", nil},
		{"custom", valueSets["custom kafka and static topics"], "b-1.kafka.example:9094,b-2.kafka.example:9094,b-3.kafka.example:9094", []string{"audit.events", "billing.events"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			sts := mustGet(t, r.statefulSets, runnerName)
			if sts.Spec.Template.Labels[inject.LabelInject] != "true" {
				t.Errorf("runner pods not labelled for injection: %v", sts.Spec.Template.Labels)
			}
			if len(sts.Spec.VolumeClaimTemplates) != 1 {
				t.Errorf("runner has no data PVC")
			}
			c := container(t, sts.Spec.Template.Spec, "runner")
			if got := args(c)["--kafka"]; got != tc.brokers {
				t.Errorf("--kafka=%q, want %q", got, tc.brokers)
			}
			var topics []string
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--topic="); ok {
					topics = append(topics, v)
				}
			}
			if strings.Join(topics, ",") != strings.Join(tc.topics, ",") {
				t.Errorf("topics %v, want %v", topics, tc.topics)
			}
		})
	}
}

// TestBadValuesRejected: a values mistake fails the install with a message
// naming the value, through values.schema.json or the templates' checks,
// instead of deploying a broken mesh.
func TestBadValuesRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		vals map[string]any
		want string
	}{
		{"no kafka brokers", map[string]any{"kafka": map[string]any{"brokers": []any{}}}, "kafka/brokers"},
		{"broker without port", map[string]any{"kafka": map[string]any{"brokers": []any{"kafka"}}}, "kafka/brokers/0"},
		{"misspelled key", map[string]any{"runner": map[string]any{"replica": 3}}, "replica"},
		{"ttl without unit", map[string]any{"lease": map[string]any{"ttl": "15"}}, "lease/ttl"},
		{"unknown failure policy", map[string]any{"injector": map[string]any{"failurePolicy": "Sometimes"}}, "injector/failurePolicy"},
		{"anti-affinity typo", map[string]any{"admin": map[string]any{"antiAffinity": "strict"}}, "admin/antiAffinity"},
		{"unknown tls mode", map[string]any{"tls": map[string]any{"mode": "mtls"}}, "tls/mode"},
		{"secret mode without the runners' Secret", map[string]any{"tls": map[string]any{"mode": "secret", "secret": map[string]any{"admin": "a", "gateway": "g"}}}, "tls/secret/runner"},
		{"trust domain with a path", map[string]any{"tls": map[string]any{"trustDomain": "prism.local/x"}}, "tls/trustDomain"},
		{"no query auth", nil, "set gateway.queryAuth.jwksUrl or gateway.queryAuth.jwksConfigMap, with gateway.queryAuth.issuer and gateway.queryAuth.audience; or gateway.queryAuth.disabled=true"},
		{"jwks url without an audience", queryAuth(map[string]any{"jwksUrl": "https://idp.example.com/jwks", "issuer": "https://idp.example.com"}), "gateway.queryAuth.audience"},
		{"jwks without an issuer", queryAuth(map[string]any{"jwksConfigMap": "jwks", "audience": "prism"}), "gateway.queryAuth.issuer"},
		{"issuer and audience without a jwks", queryAuth(map[string]any{"issuer": "https://idp.example.com", "audience": "prism"}), "gateway.queryAuth.jwksUrl or gateway.queryAuth.jwksConfigMap"},
		{"disabled with a jwks url", queryAuth(map[string]any{"disabled": true, "jwksUrl": "https://idp.example.com/jwks"}), "gateway.queryAuth.disabled=true excludes gateway.queryAuth.jwksUrl"},
		{"jwks url and configmap", queryAuth(map[string]any{"jwksUrl": "https://idp.example.com/jwks", "jwksConfigMap": "jwks", "issuer": "i", "audience": "a"}), "exclude each other"},
		{"jwks ca without a url", queryAuth(map[string]any{"jwksConfigMap": "jwks", "jwksCA": "/etc/ca.crt", "issuer": "i", "audience": "a"}), "gateway.queryAuth.jwksCA is only for gateway.queryAuth.jwksUrl"},
		{"plain http jwks url", queryAuth(map[string]any{"jwksUrl": "http://idp.example.com/jwks", "issuer": "i", "audience": "a"}), "gateway/queryAuth/jwksUrl"},
		{"disabled not a bool", queryAuth(map[string]any{"disabled": "yes"}), "gateway/queryAuth/disabled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ch := loadChart(t)
			caps := chartutil.DefaultCapabilities.Copy()
			caps.KubeVersion = kubeVersion
			vals, err := chartutil.ToRenderValues(ch, tc.vals, chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true}, caps)
			if err == nil {
				_, err = engine.Render(ch, vals)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestTemplateChecks covers what the schema cannot see: a chart rendered
// with kafka.brokers emptied past the schema still refuses.
func TestTemplateChecks(t *testing.T) {
	t.Parallel()
	ch := loadChart(t)
	ch.Schema = nil
	vals := renderValues(t, ch, withQueryAuth(map[string]any{"kafka": map[string]any{"brokers": []any{}}}))
	if _, err := engine.Render(ch, vals); err == nil || !strings.Contains(err.Error(), "kafka.brokers is required") {
		t.Fatalf("render without brokers: %v, want an error naming kafka.brokers", err)
	}
}

func TestInjectorWebhook(t *testing.T) {
	t.Parallel()
	for _, certManager := range []bool{false, true} {
		name := "generated TLS"
		vals := valueSets["defaults"]
		if certManager {
			name, vals = "cert-manager", valueSets["cert-manager"]
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := render(t, vals)
			if len(r.webhooks) != 1 {
				t.Fatalf("%d webhook configurations, want 1", len(r.webhooks))
			}
			var cfg *admissionregistrationv1.MutatingWebhookConfiguration
			for _, c := range r.webhooks {
				cfg = c
			}
			svc := mustGet(t, r.services, injectorName)
			paths := map[string]bool{}
			for _, w := range cfg.Webhooks {
				cc := w.ClientConfig.Service
				if cc == nil || cc.Name != svc.Name || cc.Namespace != namespace || cc.Port == nil || *cc.Port != svc.Spec.Ports[0].Port {
					t.Errorf("%s: clientConfig %s does not reach service %s", w.Name, toYAML(w.ClientConfig), svc.Name)
				}
				if cc != nil && cc.Path != nil {
					paths[*cc.Path] = true
				}
				if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
					t.Errorf("%s: sideEffects %v", w.Name, w.SideEffects)
				}
				if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail {
					t.Errorf("%s: failurePolicy %v", w.Name, w.FailurePolicy)
				}
				if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
					t.Errorf("%s: reinvocationPolicy %v", w.Name, w.ReinvocationPolicy)
				}
				if len(w.AdmissionReviewVersions) != 1 || w.AdmissionReviewVersions[0] != "v1" {
					t.Errorf("%s: admissionReviewVersions %v", w.Name, w.AdmissionReviewVersions)
				}
				if w.ObjectSelector == nil || w.NamespaceSelector == nil {
					t.Errorf("%s: selectors missing: a webhook without them sees every pod", w.Name)
				}
				if certManager != (len(w.ClientConfig.CABundle) == 0) {
					t.Errorf("%s: caBundle length %d with cert-manager=%v", w.Name, len(w.ClientConfig.CABundle), certManager)
				}
			}
			if !paths[inject.PathInjectPod] || !paths[inject.PathInjectNamespace] || len(cfg.Webhooks) != 2 {
				t.Errorf("webhook paths %v, want %s and %s", paths, inject.PathInjectPod, inject.PathInjectNamespace)
			}
			secretName := injectorName + "-tls"
			if certManager {
				cert := mustGet(t, r.certificates, injectorName)
				if cert.Spec.SecretName != secretName || cfg.Annotations["cert-manager.io/inject-ca-from"] != namespace+"/"+injectorName {
					t.Errorf("certificate secret %q, inject-ca-from %q", cert.Spec.SecretName, cfg.Annotations["cert-manager.io/inject-ca-from"])
				}
				if !contains(cert.Spec.DNSNames, injectorName+"."+namespace+".svc") {
					t.Errorf("certificate names %v lack the service", cert.Spec.DNSNames)
				}
				if _, ok := r.issuers[cert.Spec.IssuerRef.Name]; !ok {
					t.Errorf("issuer %s not rendered", cert.Spec.IssuerRef.Name)
				}
				if len(r.secrets) != 0 {
					t.Errorf("chart renders Secrets %v that cert-manager owns", r.secrets)
				}
				return
			}
			secret := mustGet(t, r.secrets, secretName)
			verifyServingCert(t, secret, cfg.Webhooks[0].ClientConfig.CABundle, injectorName+"."+namespace+".svc")
			for _, w := range cfg.Webhooks[1:] {
				if string(w.ClientConfig.CABundle) != string(cfg.Webhooks[0].ClientConfig.CABundle) {
					t.Errorf("webhooks trust different CAs")
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// verifyServingCert checks what the API server will: the webhook's CA
// bundle verifies the Secret's certificate for the service's DNS name, and
// the key belongs to the certificate.
func verifyServingCert(t testing.TB, secret *corev1.Secret, caBundle []byte, dnsName string) {
	t.Helper()
	if _, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"]); err != nil {
		t.Fatalf("Secret %s: key does not match certificate: %v", secret.Name, err)
	}
	if string(secret.Data["ca.crt"]) != string(caBundle) {
		t.Errorf("Secret ca.crt differs from the webhook caBundle")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caBundle) {
		t.Fatalf("caBundle is not PEM: %q", caBundle)
	}
	block, _ := pem.Decode(secret.Data["tls.crt"])
	if block == nil {
		t.Fatal("tls.crt is not PEM")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: dnsName}); err != nil {
		t.Errorf("serving certificate does not verify for %s: %v", dnsName, err)
	}
}

func TestNotes(t *testing.T) {
	t.Parallel()
	const warning = "WARNING: gateway.queryAuth.disabled is true"
	tests := []struct {
		name    string
		vals    map[string]any
		want    []string
		notWant []string
	}{
		{"cluster ip", valueSets["defaults"], []string{"kubectl port-forward -n mesh svc/prism-gateway 8080:80", "GATEWAY_URL=http://127.0.0.1:8080",
			`curl -H "Authorization: Bearer $TOKEN" "$GATEWAY_URL/v1/namespaces/audit-logs/events?principal=user-123&limit=10"`,
			"iss https://idp.example.com, aud prism", "prism_namespaces listing audit-logs", "https://idp.example.com/.well-known/jwks.json",
			"namespace create audit-logs --topic audit.events"}, []string{warning}},
		{"load balancer", valueSets["five soft-spread admins and a load balancer"], []string{".status.loadBalancer.ingress[0]", "GATEWAY_URL=http://$GATEWAY_HOST:80", `"$GATEWAY_URL/v1/`}, nil},
		{"jwks configmap", valueSets["query auth from a ConfigMap"], []string{"ConfigMap prism-jwks (restart the gateway", `Authorization: Bearer $TOKEN`}, []string{warning}},
		{"query auth disabled", valueSets["query auth disabled"], []string{warning, "anyone who reaches it reads every mailbox",
			`curl "$GATEWAY_URL/v1/namespaces/audit-logs/events?principal=user-123&limit=10"`}, []string{"Bearer"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			for _, w := range tc.want {
				if !strings.Contains(r.notes, w) {
					t.Errorf("NOTES.txt lacks %q:\n%s", w, r.notes)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(r.notes, w) {
					t.Errorf("NOTES.txt says %q:\n%s", w, r.notes)
				}
			}
		})
	}
}
