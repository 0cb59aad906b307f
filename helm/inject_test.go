package helm

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/sidecar/inject"
)

// injectorOptions reads the rendered injector's flags the way `prism
// inject` does, so the test runs the webhook exactly as the chart
// configures it.
func injectorOptions(t *testing.T, c corev1.Container) inject.Options {
	t.Helper()
	a := args(c)
	o := inject.DefaultOptions()
	o.Image = a["--sidecar-image"]
	o.AdminEndpoints = strings.Split(a["--admin-endpoints"], ",")
	o.RunnerAddr = a["--runner-addr"]
	o.LogLevel = a["--sidecar-log-level"]
	var err error
	if o.LeaseTTL, err = time.ParseDuration(a["--lease-ttl"]); err != nil {
		t.Fatalf("--lease-ttl: %v", err)
	}
	if o.HeartbeatInterval, err = time.ParseDuration(a["--heartbeat-interval"]); err != nil {
		t.Fatalf("--heartbeat-interval: %v", err)
	}
	if err := json.Unmarshal([]byte(a["--runner-query-port"]), &o.QueryPort); err != nil {
		t.Fatalf("--runner-query-port: %v", err)
	}
	if o.CPU, err = resource.ParseQuantity(a["--sidecar-cpu"]); err != nil {
		t.Fatalf("--sidecar-cpu: %v", err)
	}
	if o.Memory, err = resource.ParseQuantity(a["--sidecar-memory"]); err != nil {
		t.Fatalf("--sidecar-memory: %v", err)
	}
	o.TLS.Mode = inject.TLSMode(a["--mesh-tls"])
	o.TLS.Containers = strings.Split(a["--mesh-tls-containers"], ",")
	o.TLS.SecretName = a["--mesh-tls-secret"]
	if td, ok := a["--mesh-trust-domain"]; ok {
		o.TLS.TrustDomain = td
	}
	o.TLS.Issuer = inject.IssuerRef{Name: a["--mesh-issuer-name"], Kind: a["--mesh-issuer-kind"], Group: a["--mesh-issuer-group"]}
	if d, ok := a["--mesh-cert-duration"]; ok {
		if o.TLS.Duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("--mesh-cert-duration: %v", err)
		}
	}
	o.TLS.Key = inject.KeyOptions{Algorithm: a["--mesh-key-algorithm"], Encoding: a["--mesh-key-encoding"]}
	if n, ok := a["--mesh-key-size"]; ok {
		if o.TLS.Key.Size, err = strconv.Atoi(n); err != nil {
			t.Fatalf("--mesh-key-size: %v", err)
		}
	}
	return o
}

// TestInjectorOnRenderedRunnerPod feeds the runner pod the chart's
// StatefulSet would create to the injector configured by the chart's own
// flags, applies the patch with an independent JSON-patch library, and
// checks the pod the kubelet would run.
func TestInjectorOnRenderedRunnerPod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		vals map[string]any
	}{
		{"defaults", valueSets["defaults"]},
		{"custom kafka", valueSets["custom kafka"]},
		{"lease override by pod annotation", withQueryAuth(map[string]any{"runner": map[string]any{"podAnnotations": map[string]any{
			inject.AnnotationLeaseTTL: "30s", inject.AnnotationHeartbeatInterval: "10s",
		}}})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			sts := chartrender.MustGet(t, r.StatefulSets, runnerName)
			injector := container(t, chartrender.MustGet(t, r.Deployments, injectorName).Spec.Template.Spec, "injector")
			opts := injectorOptions(t, injector)
			reg := prometheus.NewRegistry()
			wh, err := inject.NewWebhook(opts, slog.New(slog.DiscardHandler), reg, clock.RealClock{})
			if err != nil {
				t.Fatalf("injector rejects the chart's flags: %v", err)
			}
			h := inject.NewHandler(wh, reg)

			// The pod the StatefulSet controller creates from the template.
			pod := corev1.Pod{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: *sts.Spec.Template.ObjectMeta.DeepCopy(),
				Spec:       *sts.Spec.Template.Spec.DeepCopy(),
			}
			pod.Name, pod.Namespace = runnerName+"-0", namespace
			original, err := json.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			patched := review(t, h, original)
			got := decodePod(t, patched)

			var sidecars []int
			for i, c := range got.Spec.InitContainers {
				if c.Name == inject.ContainerName {
					sidecars = append(sidecars, i)
				}
			}
			for _, c := range got.Spec.Containers {
				if c.Name == inject.ContainerName {
					t.Fatal("sidecar injected as a regular container")
				}
			}
			if len(sidecars) != 1 {
				t.Fatalf("sidecar present %d times", len(sidecars))
			}
			sc := got.Spec.InitContainers[sidecars[0]]
			// A native sidecar: the kubelet starts it before the runner
			// container and stops it after.
			if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Errorf("sidecar restartPolicy %v, want Always", sc.RestartPolicy)
			}
			if len(got.Spec.Containers) != 1 || got.Spec.Containers[0].Name != "runner" {
				t.Errorf("containers %v, want the runner alone", got.Spec.Containers)
			}
			if sc.Image != "ghcr.io/prism-mesh/prism:0.1.0" {
				t.Errorf("sidecar image %q, want the chart's prism image", sc.Image)
			}

			env := map[string]corev1.EnvVar{}
			for _, e := range sc.Env {
				env[e.Name] = e
			}
			wantTTL, wantHB := "15s", "5s"
			if ann := pod.Annotations; ann[inject.AnnotationLeaseTTL] != "" {
				wantTTL, wantHB = ann[inject.AnnotationLeaseTTL], ann[inject.AnnotationHeartbeatInterval]
			}
			want := map[string]string{
				inject.EnvAdminEndpoints:    "prism-admin-0.prism-admin-peers.mesh.svc:7001,prism-admin-1.prism-admin-peers.mesh.svc:7001,prism-admin-2.prism-admin-peers.mesh.svc:7001",
				inject.EnvLeaseTTL:          wantTTL,
				inject.EnvHeartbeatInterval: wantHB,
				inject.EnvRunnerAddr:        "127.0.0.1:7071",
				inject.EnvAdvertiseAddr:     "$(PRISM_POD_IP):9090",
			}
			for k, v := range want {
				if env[k].Value != v {
					t.Errorf("%s = %q, want %q", k, env[k].Value, v)
				}
			}
			if ref := env[inject.EnvProxyID].ValueFrom; ref == nil || ref.FieldRef == nil || ref.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s = %+v: the proxy id must default to the pod name", inject.EnvProxyID, env[inject.EnvProxyID])
			}
			// The advertised port is the runner's.
			if !hasPort(got.Spec, "9090") {
				t.Errorf("runner does not listen on the advertised port 9090")
			}
			// Pod-level security still applies to the injected container.
			if got.Spec.SecurityContext == nil || got.Spec.SecurityContext.RunAsNonRoot == nil || !*got.Spec.SecurityContext.RunAsNonRoot {
				t.Errorf("pod security context lost")
			}

			// Idempotent: the API server re-invoking the webhook adds nothing.
			again := review(t, h, patched)
			if !bytes.Equal(again, patched) {
				t.Errorf("second injection changed the pod")
			}
		})
	}
}

// review sends one pod creation to the webhook and returns the pod with the
// answer's patch applied.
func review(t *testing.T, h http.Handler, podJSON []byte) []byte {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "b1e7a6a0-2f7c-4c1e-9a57-0c8f1f2f6b11",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: namespace,
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: podJSON},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, inject.PathInjectPod, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("webhook status %d: %s", rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("webhook answer %s: %v", rec.Body, err)
	}
	if !out.Response.Allowed {
		t.Fatalf("webhook denied the chart's runner pod: %+v", out.Response.Result)
	}
	if len(out.Response.Patch) == 0 {
		return podJSON
	}
	p, err := jsonpatch.DecodePatch(out.Response.Patch)
	if err != nil {
		t.Fatalf("decode patch: %v", err)
	}
	patched, err := p.Apply(podJSON)
	if err != nil {
		t.Fatalf("apply patch: %v", err)
	}
	return patched
}

func decodePod(t *testing.T, raw []byte) *corev1.Pod {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var pod corev1.Pod
	if err := dec.Decode(&pod); err != nil {
		t.Fatalf("patched pod does not decode strictly: %v", err)
	}
	return &pod
}
