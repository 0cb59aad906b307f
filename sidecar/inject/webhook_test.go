package inject

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	podKind        = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	deploymentKind = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
)

func TestInjectsNativeSidecar(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		path  string
		edit  func(*corev1.Pod)
		check func(t *testing.T, pod *corev1.Pod, sc corev1.Container)
	}{
		{
			name: "labelled pod gets defaults and its own name as proxy id",
			path: PathInjectPod,
			check: func(t *testing.T, pod *corev1.Pod, sc corev1.Container) {
				env := envOf(sc)
				if ref := env[EnvProxyID].ValueFrom; ref == nil || ref.FieldRef == nil || ref.FieldRef.FieldPath != "metadata.name" {
					t.Errorf("%s = %+v, want fieldRef metadata.name", EnvProxyID, env[EnvProxyID])
				}
				if got := env[EnvAdminEndpoints].Value; got != "prism-admin-0.prism-admin:7000,prism-admin-1.prism-admin:7000" {
					t.Errorf("%s = %q", EnvAdminEndpoints, got)
				}
				if got := env[EnvLeaseTTL].Value; got != "15s" {
					t.Errorf("%s = %q, want 15s", EnvLeaseTTL, got)
				}
				if got := env[EnvHeartbeatInterval].Value; got != "5s" {
					t.Errorf("%s = %q, want 5s", EnvHeartbeatInterval, got)
				}
				if sc.Image != "ghcr.io/prism-mesh/prism:test" {
					t.Errorf("image %q", sc.Image)
				}
			},
		},
		{
			name: "annotations override every default",
			path: PathInjectPod,
			edit: func(p *corev1.Pod) {
				p.Annotations = map[string]string{
					AnnotationProxyID:           "proxy-01",
					AnnotationAdminEndpoints:    "10.0.0.1:7000, admin.example:7001",
					AnnotationLeaseTTL:          "30s",
					AnnotationHeartbeatInterval: "2s",
					AnnotationRunnerAddr:        "127.0.0.1:9999",
					AnnotationQueryPort:         "8443",
					AnnotationImage:             "registry.local/prism:canary",
					AnnotationCPU:               "200m",
					AnnotationMemory:            "256Mi",
					AnnotationLogLevel:          "debug",
				}
			},
			check: func(t *testing.T, pod *corev1.Pod, sc corev1.Container) {
				env := envOf(sc)
				want := map[string]string{
					EnvProxyID: "proxy-01", EnvAdminEndpoints: "10.0.0.1:7000,admin.example:7001",
					EnvLeaseTTL: "30s", EnvHeartbeatInterval: "2s", EnvRunnerAddr: "127.0.0.1:9999", EnvLogLevel: "debug",
					EnvAdvertiseAddr: "$(PRISM_POD_IP):8443",
				}
				for k, v := range want {
					if env[k].Value != v || env[k].ValueFrom != nil {
						t.Errorf("%s = %+v, want %q", k, env[k], v)
					}
				}
				if sc.Image != "registry.local/prism:canary" {
					t.Errorf("image %q", sc.Image)
				}
				if q := sc.Resources.Requests[corev1.ResourceCPU]; q.String() != "200m" {
					t.Errorf("cpu request %s", q.String())
				}
				if q := sc.Resources.Limits[corev1.ResourceMemory]; q.String() != "256Mi" {
					t.Errorf("memory limit %s", q.String())
				}
			},
		},
		{
			name: "namespace selection injects an unlabelled pod",
			path: PathInjectNamespace,
			edit: func(p *corev1.Pod) { delete(p.Labels, LabelInject) },
		},
		{
			name: "copied status annotation without the sidecar",
			path: PathInjectPod,
			edit: func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationStatus: "injected"} },
		},
		{
			name: "controller pod without a name yet and no init containers",
			path: PathInjectPod,
			edit: func(p *corev1.Pod) {
				p.Name, p.GenerateName = "", "prism-runner-7d9f-"
				p.Spec.InitContainers = nil
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, _ := newTestWebhook(t)
			h := NewHandler(w, nil)
			pod := runnerPod()
			if tc.edit != nil {
				tc.edit(pod)
			}
			userInits := len(pod.Spec.InitContainers)
			original := mustJSON(t, pod)
			code, body := post(t, h, tc.path, reviewFor(t, original, admissionv1.Create, podKind))
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			resp := decodeResponse(t, body)
			if !resp.Allowed || resp.UID != "7f0b2c43-6b4e-4c55-9d2f-0d4c5a1b2c3d" {
				t.Fatalf("response %+v", resp)
			}
			patched := applyPatch(t, original, resp)
			got := decodePodStrict(t, patched)
			if n := sidecarCount(got); n != 1 {
				t.Fatalf("sidecar present %d times", n)
			}
			if len(got.Spec.InitContainers) != userInits+1 {
				t.Fatalf("init containers %d, want %d", len(got.Spec.InitContainers), userInits+1)
			}
			// The pod's own init containers keep their place and run
			// first; the sidecar is the last init container, so it is
			// started before the runner and stopped after it.
			sc := got.Spec.InitContainers[userInits]
			if sc.Name != ContainerName {
				t.Fatalf("init containers %v: sidecar not last", names(got.Spec.InitContainers))
			}
			if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Errorf("restartPolicy %v, want Always", sc.RestartPolicy)
			}
			if got.Spec.Containers[0].Name != "runner" || len(got.Spec.Containers) != 1 {
				t.Errorf("containers changed: %v", names(got.Spec.Containers))
			}
			if sc.ReadinessProbe == nil || sc.ReadinessProbe.HTTPGet == nil || sc.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %+v", sc.ReadinessProbe)
			}
			if sc.Resources.Requests.Cpu().IsZero() || sc.Resources.Requests.Memory().IsZero() {
				t.Errorf("resources %+v", sc.Resources)
			}
			if got.Annotations[AnnotationStatus] != "injected" {
				t.Errorf("annotations %v: not marked injected", got.Annotations)
			}
			checkArgsExpand(t, sc)
			if tc.check != nil {
				tc.check(t, got, sc)
			}

			// Idempotency: the API server may call again (reinvocation)
			// with the already mutated pod.
			code, body = post(t, h, tc.path, reviewFor(t, patched, admissionv1.Create, podKind))
			if code != http.StatusOK {
				t.Fatalf("second pass status %d", code)
			}
			again := decodeResponse(t, body)
			if !again.Allowed || len(again.Patch) != 0 {
				t.Fatalf("second pass changed the pod: allowed=%v patch=%s", again.Allowed, again.Patch)
			}
		})
	}
}

// checkArgsExpand asserts every $(VAR) in the sidecar's args names one of
// its env vars, and in an env value one defined before it: otherwise the
// kubelet passes the text through literally.
func checkArgsExpand(t *testing.T, c corev1.Container) {
	t.Helper()
	refs := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	defined := map[string]bool{}
	for _, e := range c.Env {
		for _, m := range refs.FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				t.Errorf("env %s=%q refers to %s, not defined before it", e.Name, e.Value, m[1])
			}
		}
		defined[e.Name] = true
	}
	for _, a := range c.Args {
		for _, m := range refs.FindAllStringSubmatch(a, -1) {
			if !defined[m[1]] {
				t.Errorf("arg %q refers to undefined env %s", a, m[1])
			}
		}
	}
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func TestLeavesOtherObjectsAlone(t *testing.T) {
	t.Parallel()
	labelled := runnerPod()
	unlabelled := runnerPod()
	delete(unlabelled.Labels, LabelInject)
	optedOut := runnerPod()
	optedOut.Labels[LabelInject] = "false"
	handMade := runnerPod()
	handMade.Spec.Containers = append(handMade.Spec.Containers, corev1.Container{Name: ContainerName, Image: "x"})

	tests := []struct {
		name    string
		path    string
		raw     []byte
		op      admissionv1.Operation
		kind    metav1.GroupVersionKind
		warning bool
	}{
		{"unlabelled pod selected by pod label", PathInjectPod, mustJSON(t, unlabelled), admissionv1.Create, podKind, false},
		{"opted-out pod in labelled namespace", PathInjectNamespace, mustJSON(t, optedOut), admissionv1.Create, podKind, false},
		{"opted-out pod selected by pod label", PathInjectPod, mustJSON(t, optedOut), admissionv1.Create, podKind, false},
		{"pod with a hand-made sidecar container", PathInjectPod, mustJSON(t, handMade), admissionv1.Create, podKind, false},
		{"pod update", PathInjectPod, mustJSON(t, labelled), admissionv1.Update, podKind, true},
		{"a deployment", PathInjectPod, []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}`), admissionv1.Create, deploymentKind, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, _ := newTestWebhook(t)
			code, body := post(t, NewHandler(w, nil), tc.path, reviewFor(t, tc.raw, tc.op, tc.kind))
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			resp := decodeResponse(t, body)
			if !resp.Allowed || len(resp.Patch) != 0 || resp.PatchType != nil {
				t.Fatalf("want allowed without patch, got %+v", resp)
			}
			if tc.warning != (len(resp.Warnings) > 0) {
				t.Errorf("warnings %q, want warning=%v", resp.Warnings, tc.warning)
			}
		})
	}
}

func TestDeniesInvalidAnnotations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		annotations map[string]string
		want        []string
	}{
		{"ttl not a duration", map[string]string{AnnotationLeaseTTL: "ten seconds"}, []string{AnnotationLeaseTTL, "ten seconds"}},
		{"ttl out of range", map[string]string{AnnotationLeaseTTL: "10ms"}, []string{AnnotationLeaseTTL}},
		{"heartbeat not below ttl", map[string]string{AnnotationLeaseTTL: "5s", AnnotationHeartbeatInterval: "5s"}, []string{AnnotationHeartbeatInterval, "shorter than lease ttl"}},
		{"default heartbeat above annotated ttl", map[string]string{AnnotationLeaseTTL: "2s"}, []string{AnnotationLeaseTTL, "shorter than lease ttl"}},
		{"proxy id with @", map[string]string{AnnotationProxyID: "proxy@01"}, []string{AnnotationProxyID}},
		{"endpoint without port", map[string]string{AnnotationAdminEndpoints: "admin-0"}, []string{AnnotationAdminEndpoints}},
		{"empty endpoint list", map[string]string{AnnotationAdminEndpoints: " , "}, []string{AnnotationAdminEndpoints}},
		{"runner addr bad port", map[string]string{AnnotationRunnerAddr: "127.0.0.1:99999"}, []string{AnnotationRunnerAddr}},
		{"query port out of range", map[string]string{AnnotationQueryPort: "0"}, []string{AnnotationQueryPort}},
		{"negative memory", map[string]string{AnnotationMemory: "-1Mi"}, []string{AnnotationMemory}},
		{"zero cpu", map[string]string{AnnotationCPU: "0"}, []string{AnnotationCPU}},
		{"quantity exponent that stalls ParseQuantity", map[string]string{AnnotationCPU: "1e-9999999"}, []string{AnnotationCPU}},
		{"image with space", map[string]string{AnnotationImage: "prism :1"}, []string{AnnotationImage}},
		{"two bad annotations both named", map[string]string{AnnotationCPU: "lots", AnnotationLogLevel: "loud"}, []string{AnnotationCPU, AnnotationLogLevel}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, reg := newTestWebhook(t)
			pod := runnerPod()
			pod.Annotations = tc.annotations
			code, body := post(t, NewHandler(w, reg), PathInjectPod, reviewFor(t, mustJSON(t, pod), admissionv1.Create, podKind))
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			resp := decodeResponse(t, body)
			if resp.Allowed || len(resp.Patch) != 0 || resp.Result == nil {
				t.Fatalf("want denial, got %+v", resp)
			}
			if resp.Result.Code != http.StatusUnprocessableEntity || resp.Result.Reason != metav1.StatusReasonInvalid {
				t.Errorf("result %+v", resp.Result)
			}
			for _, s := range tc.want {
				if !strings.Contains(resp.Result.Message, s) {
					t.Errorf("message %q does not name %q", resp.Result.Message, s)
				}
			}
			if n := testutil.ToFloat64(w.metrics.requests.WithLabelValues(outcomeDenied)); n != 1 {
				t.Errorf("denied requests counted %v, want 1", n)
			}
			if n := testutil.ToFloat64(w.metrics.denials.WithLabelValues(tc.want[0])); n != 1 {
				t.Errorf("denials for %s counted %v, want 1", tc.want[0], n)
			}
		})
	}
}

func TestBadRequestsAnswered(t *testing.T) {
	t.Parallel()
	validPod := mustJSON(t, runnerPod())
	tests := []struct {
		name        string
		method      string
		contentType string
		body        []byte
		wantCode    int
		wantDenied  bool
	}{
		{"malformed json", http.MethodPost, "application/json", []byte(`{"apiVersion":`), http.StatusBadRequest, false},
		{"not an object", http.MethodPost, "application/json", []byte(`[1,2,3]`), http.StatusBadRequest, false},
		{"v1beta1 review", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`), http.StatusBadRequest, false},
		{"review without request", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest, false},
		{"GET", http.MethodGet, "application/json", nil, http.StatusMethodNotAllowed, false},
		{"form post", http.MethodPost, "application/x-www-form-urlencoded", []byte("a=b"), http.StatusUnsupportedMediaType, false},
		{"huge body", http.MethodPost, "application/json", bytes.Repeat([]byte(" "), maxReviewBytes+1), http.StatusRequestEntityTooLarge, false},
		{"pod object is a number", http.MethodPost, "application/json",
			[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":42}}`),
			http.StatusOK, true},
		{"pod object missing", http.MethodPost, "application/json",
			[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}}`),
			http.StatusOK, true},
		{"valid review with charset", http.MethodPost, "application/json; charset=utf-8", reviewFor(t, validPod, admissionv1.Create, podKind), http.StatusOK, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, _ := newTestWebhook(t)
			req := httptest.NewRequest(tc.method, PathInjectPod, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			rec := httptest.NewRecorder()
			NewHandler(w, nil).ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantCode, rec.Body)
			}
			if rec.Code != http.StatusOK {
				if rec.Body.Len() == 0 {
					t.Error("error answered without a message")
				}
				return
			}
			resp := decodeResponse(t, rec.Body.Bytes())
			if resp.Allowed == tc.wantDenied {
				t.Errorf("allowed=%v, want denied=%v: %+v", resp.Allowed, tc.wantDenied, resp.Result)
			}
		})
	}
}

// TestPatchKeepsUnknownFields pins the choice to diff the re-encoded pod
// rather than the raw request: a field newer than our k8s.io/api must
// survive injection instead of being patched away.
func TestPatchKeepsUnknownFields(t *testing.T) {
	t.Parallel()
	w, _ := newTestWebhook(t)
	raw := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"r-0","labels":{"prism.io/inject":"true"}},
		"spec":{"futureSchedulingHint":{"zone":"a"},"containers":[{"name":"runner","image":"prism","futureField":true}]}}`)
	code, body := post(t, NewHandler(w, nil), PathInjectPod, reviewFor(t, raw, admissionv1.Create, podKind))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	patched := string(applyPatch(t, raw, decodeResponse(t, body)))
	for _, keep := range []string{`"futureSchedulingHint":{"zone":"a"}`, `"futureField":true`, `"prism-sidecar"`} {
		if !strings.Contains(patched, keep) {
			t.Errorf("patched pod lost %s: %s", keep, patched)
		}
	}
}

func TestNewWebhookRejectsBadDefaults(t *testing.T) {
	t.Parallel()
	noImage := testDefaults()
	noImage.Image = ""
	noAdmin := testDefaults()
	noAdmin.AdminEndpoints = nil
	for name, o := range map[string]Options{"no image": noImage, "no admin endpoints": noAdmin} {
		if _, err := NewWebhook(o, nil, nil, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
