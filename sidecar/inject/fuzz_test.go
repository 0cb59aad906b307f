package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzParseOptions: any annotation values either yield options the sidecar
// can run with or an error naming a prism.io/ annotation; never a panic,
// never a half-valid result.
func FuzzParseOptions(f *testing.F) {
	f.Add("proxy-01", "admin-0:7000,admin-1:7000", "15s", "5s", "127.0.0.1:7071", "100m", "64Mi")
	f.Add("", "", "", "", "", "", "")
	f.Add("a@b", "[::1]:7000", "1h0m1s", "0s", ":0", "1e3", "-1")
	f.Add("x", " ,admin:7000 ", "2s", "1s999ms", "host:65535", "0.5", "1Ei")
	f.Fuzz(func(t *testing.T, proxyID, endpoints, ttl, heartbeat, runner, cpu, memory string) {
		ann := map[string]string{}
		for k, v := range map[string]string{
			AnnotationProxyID: proxyID, AnnotationAdminEndpoints: endpoints, AnnotationLeaseTTL: ttl,
			AnnotationHeartbeatInterval: heartbeat, AnnotationRunnerAddr: runner, AnnotationCPU: cpu, AnnotationMemory: memory,
		} {
			if v != "" {
				ann[k] = v
			}
		}
		o, err := ParseOptions(ann, testDefaults())
		if err != nil {
			var ae *AnnotationError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), "prism.io/") {
				t.Fatalf("error %q names no annotation", err)
			}
			return
		}
		if o.HeartbeatInterval <= 0 || o.HeartbeatInterval >= o.LeaseTTL {
			t.Fatalf("accepted heartbeat %s with ttl %s", o.HeartbeatInterval, o.LeaseTTL)
		}
		if len(o.AdminEndpoints) == 0 || o.Image == "" || o.CPU.Sign() <= 0 || o.Memory.Sign() <= 0 {
			t.Fatalf("accepted incomplete options %+v", o)
		}
		for _, ep := range o.AdminEndpoints {
			if validateHostPort(ep) != nil || strings.Contains(ep, ",") {
				t.Fatalf("accepted endpoint %q", ep)
			}
		}
		if strings.Contains(o.ProxyID, "@") {
			t.Fatalf("accepted proxy id %q, which breaks mailbox ids", o.ProxyID)
		}
		pod := runnerPod()
		pod.Annotations = ann
		if _, err := podPatch(pod, o); err != nil {
			t.Fatalf("valid options, no patch: %v", err)
		}
	})
}

// FuzzWebhookBody: whatever the API server (or anyone reaching the port)
// sends, the webhook answers with a status and, on 200, a decodable review.
func FuzzWebhookBody(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"metadata":{"labels":{"prism.io/inject":"true"}},"spec":{"containers":[{"name":"r"}]}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"metadata":{"labels":{"prism.io/inject":"true"},"annotations":{"prism.io/lease-ttl":"x"}}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`))
	f.Add([]byte(`{`))
	w, _ := newTestWebhook(f)
	h := NewHandler(w, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, PathInjectNamespace, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			var out struct {
				Response *struct {
					UID     string `json:"uid"`
					Allowed bool   `json:"allowed"`
				} `json:"response"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
				t.Fatalf("200 with undecodable review %q: %v", rec.Body, err)
			}
		case http.StatusBadRequest:
		default:
			t.Fatalf("status %d for %q", rec.Code, body)
		}
	})
}
