package inject

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

func testDefaults() Options {
	o := DefaultOptions()
	o.Image = "ghcr.io/prism-mesh/prism:test"
	o.AdminEndpoints = []string{"prism-admin-0.prism-admin:7000", "prism-admin-1.prism-admin:7000"}
	o.TLS.Mode, o.TLS.Issuer.Name = TLSCSI, "prism-ca"
	return o
}

func newTestWebhook(t testing.TB) (*Webhook, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	w, err := NewWebhook(testDefaults(), slog.New(slog.DiscardHandler), reg, clock.RealClock{})
	if err != nil {
		t.Fatal(err)
	}
	return w, reg
}

// runnerPod is a pod as the API server sends it for the chart's runner
// StatefulSet: named, labelled, with an init container of its own.
func runnerPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "prism-runner-0", Namespace: "prism",
			Labels: map[string]string{LabelInject: "true", "app.kubernetes.io/name": "prism-runner"},
		},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "prepare-data", Image: "busybox", Command: []string{"true"}}},
			Containers: []corev1.Container{{
				Name: "runner", Image: "ghcr.io/prism-mesh/prism:test", Args: []string{"runner"},
			}},
		},
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reviewFor wraps an object's JSON in the AdmissionReview the API server
// would POST for it.
func reviewFor(t testing.TB, raw []byte, op admissionv1.Operation, gvk metav1.GroupVersionKind) []byte {
	t.Helper()
	return mustJSON(t, admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("7f0b2c43-6b4e-4c55-9d2f-0d4c5a1b2c3d"),
			Kind:      gvk,
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "prism",
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
}

// post sends body to h as the API server does and returns the status and
// the raw response.
func post(t testing.TB, h http.Handler, path string, body []byte) (int, []byte) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

func decodeResponse(t testing.TB, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("decode response %s: %v", body, err)
	}
	if out.Response == nil {
		t.Fatalf("response review has no response: %s", body)
	}
	return out.Response
}

// applyPatch applies the webhook's JSONPatch to the original object JSON
// with an independent JSON-patch implementation, as the API server does.
func applyPatch(t testing.TB, original []byte, resp *admissionv1.AdmissionResponse) []byte {
	t.Helper()
	if len(resp.Patch) == 0 {
		return original
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v, want JSONPatch", resp.PatchType)
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("decode patch %s: %v", resp.Patch, err)
	}
	out, err := p.Apply(original)
	if err != nil {
		t.Fatalf("apply patch %s: %v", resp.Patch, err)
	}
	return out
}

// decodePodStrict fails on any field corev1.Pod does not know, so a patch
// that writes a misspelled field is caught here and not by the API server.
func decodePodStrict(t testing.TB, raw []byte) *corev1.Pod {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var pod corev1.Pod
	if err := dec.Decode(&pod); err != nil {
		t.Fatalf("decode patched pod: %v\n%s", err, raw)
	}
	return &pod
}

func sidecarCount(p *corev1.Pod) int {
	n := 0
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if c.Name == ContainerName {
			n++
		}
	}
	return n
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// writeSelfSigned writes a fresh self-signed pair for 127.0.0.1 and returns
// the certificate for clients to trust.
func writeSelfSigned(t testing.TB, certFile, keyFile string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "prism-inject.prism.svc"},
		DNSNames:              []string{"prism-inject.prism.svc"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// writeFile replaces path atomically, as the kubelet's symlink swap does
// for a mounted Secret.
func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func readAll(t testing.TB, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
