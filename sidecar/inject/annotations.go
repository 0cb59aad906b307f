package inject

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Keys a pod uses to ask for the sidecar and to tune it. The label selects;
// the annotations configure, and every one of them is optional.
const (
	// LabelInject opts a pod in ("true") or out ("false"); a namespace carries
	// the same label to opt in all of its pods.
	LabelInject = "prism.io/inject"

	AnnotationProxyID           = "prism.io/proxy-id"
	AnnotationAdminEndpoints    = "prism.io/admin-endpoints"
	AnnotationLeaseTTL          = "prism.io/lease-ttl"
	AnnotationHeartbeatInterval = "prism.io/heartbeat-interval"
	AnnotationRunnerAddr        = "prism.io/runner-addr"
	AnnotationQueryPort         = "prism.io/runner-query-port"
	AnnotationImage             = "prism.io/sidecar-image"
	AnnotationCPU               = "prism.io/sidecar-cpu"
	AnnotationMemory            = "prism.io/sidecar-memory"
	AnnotationLogLevel          = "prism.io/sidecar-log-level"
	// AnnotationTLSSecret names the Secret of the proxy identity in the
	// injector's secret mode.
	AnnotationTLSSecret = "prism.io/tls-secret"
	// AnnotationTLSContainers lists, comma-separated, the pod's containers
	// that share the sidecar's identity (the runner).
	AnnotationTLSContainers = "prism.io/tls-containers"

	// AnnotationStatus is written by the injector for people and tools
	// looking at a pod; whether to inject is decided by the container.
	AnnotationStatus = "prism.io/sidecar-status"
)

// Bounds keep a typo ("10" read as 10ns, "300h") from producing a sidecar
// that thrashes the admin cluster or holds a dead runner's lease for days.
const (
	minLeaseTTL     = time.Second
	maxLeaseTTL     = time.Hour
	minHeartbeat    = 100 * time.Millisecond
	maxProxyIDBytes = 253
)

// Options is the sidecar configuration of one pod: the injector's defaults
// overlaid with the pod's annotations.
type Options struct {
	// ProxyID names the proxy the sidecar registers; empty means the pod's
	// own name, resolved by the kubelet through the downward API.
	ProxyID string
	// AdminEndpoints are host:port gRPC addresses of admin nodes; any one
	// works because followers forward writes to the leader.
	AdminEndpoints []string
	// LeaseTTL is how long a lease lives without a heartbeat.
	LeaseTTL time.Duration
	// HeartbeatInterval is how often the sidecar renews; always below LeaseTTL.
	HeartbeatInterval time.Duration
	// RunnerAddr is the runner's local control API, reached over loopback.
	RunnerAddr string
	// QueryPort is the runner's query port; the sidecar registers
	// podIP:QueryPort as the address Envoy routes the runner's mailboxes to.
	QueryPort int
	// Image is the sidecar image (normally the prism image itself).
	Image string
	// CPU and Memory are the sidecar's requests; Memory is also its limit.
	CPU, Memory resource.Quantity
	// LogLevel is passed through to the sidecar's slog handler.
	LogLevel string
	// TLS is how the sidecar and the runner get their proxy identity.
	TLS TLSOptions
}

// AnnotationError names the annotation that made a pod uninjectable, so the
// denial tells the user exactly what to fix.
type AnnotationError struct {
	Key, Value string
	Err        error
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s=%q: %v", e.Key, e.Value, e.Err)
}

func (e *AnnotationError) Unwrap() error { return e.Err }

// ParseOptions overlays the pod's annotations on defaults and validates the
// result. Every bad annotation is reported, joined, not only the first.
func ParseOptions(annotations map[string]string, defaults Options) (Options, error) {
	o := defaults
	var errs []error
	bad := func(key string, err error) {
		errs = append(errs, &AnnotationError{Key: key, Value: annotations[key], Err: err})
	}
	if v, ok := annotations[AnnotationProxyID]; ok {
		if err := validateProxyID(v); err != nil {
			bad(AnnotationProxyID, err)
		}
		o.ProxyID = v
	}
	if v, ok := annotations[AnnotationAdminEndpoints]; ok {
		eps, err := parseEndpoints(v)
		if err != nil {
			bad(AnnotationAdminEndpoints, err)
		}
		o.AdminEndpoints = eps
	}
	if v, ok := annotations[AnnotationLeaseTTL]; ok {
		d, err := parseDuration(v, minLeaseTTL, maxLeaseTTL)
		if err != nil {
			bad(AnnotationLeaseTTL, err)
		}
		o.LeaseTTL = d
	}
	if v, ok := annotations[AnnotationHeartbeatInterval]; ok {
		d, err := parseDuration(v, minHeartbeat, maxLeaseTTL)
		if err != nil {
			bad(AnnotationHeartbeatInterval, err)
		}
		o.HeartbeatInterval = d
	}
	if v, ok := annotations[AnnotationRunnerAddr]; ok {
		if err := validateHostPort(v); err != nil {
			bad(AnnotationRunnerAddr, err)
		}
		o.RunnerAddr = v
	}
	if v, ok := annotations[AnnotationQueryPort]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			bad(AnnotationQueryPort, errors.New("want a port number 1-65535"))
		}
		o.QueryPort = n
	}
	if v, ok := annotations[AnnotationImage]; ok {
		if err := validateImage(v); err != nil {
			bad(AnnotationImage, err)
		}
		o.Image = v
	}
	if v, ok := annotations[AnnotationCPU]; ok {
		q, err := parseQuantity(v)
		if err != nil {
			bad(AnnotationCPU, err)
		}
		o.CPU = q
	}
	if v, ok := annotations[AnnotationMemory]; ok {
		q, err := parseQuantity(v)
		if err != nil {
			bad(AnnotationMemory, err)
		}
		o.Memory = q
	}
	if v, ok := annotations[AnnotationLogLevel]; ok {
		switch v {
		case "debug", "info", "warn", "error":
			o.LogLevel = v
		default:
			bad(AnnotationLogLevel, errors.New("want one of debug, info, warn, error"))
		}
	}
	parseTLS(annotations, &o, bad)
	if len(errs) > 0 {
		return Options{}, errors.Join(errs...)
	}
	// The pair is checked only once both are known valid, and blamed on the
	// heartbeat: a heartbeat as slow as the TTL lets every lease lapse.
	if o.HeartbeatInterval >= o.LeaseTTL {
		key := AnnotationHeartbeatInterval
		if _, ok := annotations[key]; !ok {
			key = AnnotationLeaseTTL
		}
		return Options{}, &AnnotationError{Key: key, Value: annotations[key],
			Err: fmt.Errorf("heartbeat interval %s must be shorter than lease ttl %s", o.HeartbeatInterval, o.LeaseTTL)}
	}
	if len(o.AdminEndpoints) == 0 {
		return Options{}, &AnnotationError{Key: AnnotationAdminEndpoints, Value: annotations[AnnotationAdminEndpoints],
			Err: errors.New("no admin endpoints: set the annotation or the injector's --admin-endpoints")}
	}
	if o.QueryPort < 1 || o.QueryPort > 65535 {
		return Options{}, &AnnotationError{Key: AnnotationQueryPort, Value: annotations[AnnotationQueryPort],
			Err: errors.New("no runner query port: set the annotation or the injector's --runner-query-port")}
	}
	if o.Image == "" {
		return Options{}, &AnnotationError{Key: AnnotationImage, Value: annotations[AnnotationImage],
			Err: errors.New("no sidecar image: set the annotation or the injector's --sidecar-image")}
	}
	if err := o.TLS.validate(annotations); err != nil {
		return Options{}, err
	}
	return o, nil
}

// validateProxyID keeps proxy ids usable inside mailbox ids
// ("{namespace}@{proxy_id}") and as Kubernetes-style names in routes.
func validateProxyID(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	if len(v) > maxProxyIDBytes {
		return fmt.Errorf("longer than %d bytes", maxProxyIDBytes)
	}
	if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

func parseEndpoints(v string) ([]string, error) {
	var eps []string
	for _, raw := range strings.Split(v, ",") {
		ep := strings.TrimSpace(raw)
		if ep == "" {
			continue
		}
		if err := validateHostPort(ep); err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, errors.New("want a comma-separated list of host:port")
	}
	return eps, nil
}

func validateHostPort(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if host == "" {
		return fmt.Errorf("%q: empty host", v)
	}
	if strings.ContainsAny(host, " \t\n/") {
		return fmt.Errorf("%q: invalid host", v)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1-65535", v)
	}
	return nil
}

func parseDuration(v string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("want a duration such as 10s or 1m30s")
	}
	if d < lo || d > hi {
		return 0, fmt.Errorf("want between %s and %s", lo, hi)
	}
	return d, nil
}

// quantityForm is the subset of Kubernetes quantities a sidecar request
// needs. resource.ParseQuantity itself takes seconds on inputs such as
// "1e-9999999" (found by FuzzParseOptions), too slow for an admission
// path, so exponents never reach it.
var quantityForm = regexp.MustCompile(`^[0-9]{1,12}(\.[0-9]{1,6})?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$`)

func parseQuantity(v string) (resource.Quantity, error) {
	if !quantityForm.MatchString(v) {
		return resource.Quantity{}, errors.New("want a quantity such as 100m, 0.5 or 64Mi")
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("want a quantity such as 100m or 64Mi: %w", err)
	}
	if q.Sign() <= 0 {
		return resource.Quantity{}, errors.New("want a positive quantity")
	}
	return q, nil
}

// validateImage rejects what the kubelet would only reject at pull time,
// after the pod is already scheduled.
func validateImage(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	if strings.ContainsAny(v, " \t\r\n") || strings.TrimSpace(v) != v {
		return errors.New("contains whitespace")
	}
	if len(v) > 512 {
		return errors.New("longer than 512 bytes")
	}
	return nil
}
