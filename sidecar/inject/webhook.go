// Package inject is the mutating admission webhook that adds the prism
// sidecar to runner pods: selection, annotation parsing, the pod mutation,
// and the HTTPS server that answers the API server's AdmissionReviews.
package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
)

// maxReviewBytes bounds a request body. The API server caps objects at
// about 1.5 MiB and a review carries at most two of them plus metadata.
const maxReviewBytes = 8 << 20

// Selection says why the API server sent a pod, which decides what the
// absence of the inject label means.
type Selection int

const (
	// SelectedByPod: the webhook's objectSelector matched the pod's label,
	// so only a pod labelled "true" is injected.
	SelectedByPod Selection = iota
	// SelectedByNamespace: the namespace is labelled, so every pod is
	// injected unless it opts out with the label "false".
	SelectedByNamespace
)

// Outcomes of one review, as counted in prism_inject_requests_total.
const (
	outcomeInjected   = "injected"
	outcomeSkipped    = "skipped"
	outcomeIgnored    = "ignored"
	outcomeDenied     = "denied"
	outcomeBadRequest = "bad_request"
	outcomeError      = "error"
)

var podGVK = metav1.GroupVersionKind{Group: "", Version: "v1", Kind: "Pod"}

// Webhook turns AdmissionReviews for pods into sidecar patches.
type Webhook struct {
	defaults Options
	log      *slog.Logger
	clock    clock.PassiveClock
	metrics  *metrics
}

// NewWebhook validates defaults (a pod with no annotations must be
// injectable) and registers the webhook's metrics on reg. clk times the
// requests; nil is the real clock.
func NewWebhook(defaults Options, log *slog.Logger, reg prometheus.Registerer, clk clock.PassiveClock) (*Webhook, error) {
	if _, err := ParseOptions(nil, defaults); err != nil {
		return nil, fmt.Errorf("injector defaults: %w", err)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Webhook{defaults: defaults, log: log, clock: clk, metrics: m}, nil
}

// Handler answers AdmissionReviews POSTed by the API server for pods
// selected the way sel says.
func (w *Webhook) Handler(sel Selection) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		start := w.clock.Now()
		outcome := w.serve(rw, r, sel)
		w.metrics.requests.WithLabelValues(outcome).Inc()
		w.metrics.latency.Observe(w.clock.Since(start).Seconds())
	})
}

func (w *Webhook) serve(rw http.ResponseWriter, r *http.Request, sel Selection) string {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		http.Error(rw, "method not allowed: POST an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return outcomeBadRequest
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(rw, "unsupported Content-Type: want application/json", http.StatusUnsupportedMediaType)
		return outcomeBadRequest
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxReviewBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(rw, fmt.Sprintf("request body larger than %d bytes", maxReviewBytes), http.StatusRequestEntityTooLarge)
			return outcomeBadRequest
		}
		http.Error(rw, "read request body: "+err.Error(), http.StatusBadRequest)
		return outcomeBadRequest
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(rw, "decode AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return outcomeBadRequest
	}
	if gv := admissionv1.SchemeGroupVersion.String(); review.APIVersion != gv || review.Kind != "AdmissionReview" {
		http.Error(rw, fmt.Sprintf("want apiVersion %s kind AdmissionReview, got %q %q", gv, review.APIVersion, review.Kind), http.StatusBadRequest)
		return outcomeBadRequest
	}
	if review.Request == nil {
		http.Error(rw, "AdmissionReview has no request", http.StatusBadRequest)
		return outcomeBadRequest
	}
	resp, outcome := w.Review(review.Request, sel)
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(rw, "encode AdmissionReview: "+err.Error(), http.StatusInternalServerError)
		return outcomeError
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(out)
	return outcome
}

// Review decides one admission request. It never fails open on a pod it
// should inject but cannot: a runner without its sidecar would consume
// with no lease, so such a pod is denied with the reason.
func (w *Webhook) Review(req *admissionv1.AdmissionRequest, sel Selection) (*admissionv1.AdmissionResponse, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	// Anything but a pod creation is let through untouched: the webhook
	// configuration should never send it, and a misconfiguration must not
	// block unrelated objects cluster-wide.
	if req.Kind != podGVK || req.SubResource != "" || req.Operation != admissionv1.Create {
		resp.Warnings = []string{fmt.Sprintf("prism injector ignores %s %s/%s %s: only pod creation is injected",
			req.Operation, req.Kind.Group, req.Kind.Version, req.Kind.Kind)}
		return resp, outcomeIgnored
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, "prism injector: decode pod: "+err.Error()), outcomeError
	}
	log := w.log.With("namespace", req.Namespace, "pod", podName(&pod), "uid", req.UID)
	switch label := pod.Labels[LabelInject]; {
	case label == "false":
		return resp, outcomeSkipped
	case sel == SelectedByPod && label != "true":
		return resp, outcomeSkipped
	}
	// The container, not the status annotation, is the truth: a pod spec
	// copied from an injected pod carries the annotation without the
	// sidecar, and must still get one.
	if Injected(&pod) {
		return resp, outcomeSkipped
	}
	opts, err := ParseOptions(pod.Annotations, w.defaults)
	if err != nil {
		for _, key := range badAnnotations(err) {
			w.metrics.denials.WithLabelValues(key).Inc()
		}
		log.Warn("sidecar injection denied", "err", err)
		return deny(resp, http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "prism sidecar injection: "+err.Error()), outcomeDenied
	}
	if _, err := tlsIdentityName(&pod, opts); err != nil {
		w.metrics.denials.WithLabelValues(AnnotationProxyID).Inc()
		log.Warn("sidecar injection denied", "err", err)
		return deny(resp, http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "prism sidecar injection: "+err.Error()), outcomeDenied
	}
	patch, err := podPatch(&pod, opts)
	if err != nil {
		log.Error("build sidecar patch", "err", err)
		return deny(resp, http.StatusInternalServerError, metav1.StatusReasonInternalError, "prism injector: "+err.Error()), outcomeError
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	log.Info("sidecar injected", "options", opts.describe())
	return resp, outcomeInjected
}

// podPatch diffs the pod before and after the mutation, both re-encoded
// from the same Go value, so the patch holds only the injector's changes:
// fields this build of k8s.io/api does not know are never removed.
func podPatch(pod *corev1.Pod, o Options) ([]byte, error) {
	before, err := json.Marshal(pod)
	if err != nil {
		return nil, fmt.Errorf("encode pod: %w", err)
	}
	mutated := pod.DeepCopy()
	if err := Mutate(mutated, o); err != nil {
		return nil, err
	}
	after, err := json.Marshal(mutated)
	if err != nil {
		return nil, fmt.Errorf("encode mutated pod: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(before, after)
	if err != nil {
		return nil, fmt.Errorf("create patch: %w", err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encode patch: %w", err)
	}
	return patch, nil
}

func deny(resp *admissionv1.AdmissionResponse, code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
	resp.Allowed = false
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}
	return resp
}

// badAnnotations lists the annotation keys named by err, for the denial
// metric; the set is bounded by the keys ParseOptions knows.
func badAnnotations(err error) []string {
	var ae *AnnotationError
	// err itself, not something wrapping it: joined errors are walked below.
	if errors.As(err, &ae) && err == error(ae) { //nolint:errorlint // identity is the point
		return []string{ae.Key}
	}
	var keys []string
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			keys = append(keys, badAnnotations(e)...)
		}
	}
	return keys
}

// podName is the pod's name, or its generateName prefix for pods created by
// controllers, which get their name only after admission.
func podName(p *corev1.Pod) string {
	if p.Name != "" {
		return p.Name
	}
	return p.GenerateName
}
