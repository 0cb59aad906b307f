package inject

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/prism-mesh/prism/mesh/identity"
)

// ContainerName is the injected container's name; finding it in a pod is
// how the injector knows it already ran.
const ContainerName = "prism-sidecar"

// Ports and paths the injected sidecar serves, which its probes rely on.
const (
	SidecarHTTPPort     = 9102
	sidecarHTTPPortName = "sidecar-http"
	statusInjected      = "injected"
)

// Env names the sidecar reads; its flags default to them, and its args
// repeat them as $(VAR) so `kubectl describe` shows the effective command.
const (
	EnvProxyID           = "PRISM_PROXY_ID"
	EnvPodName           = "PRISM_POD_NAME"
	EnvPodNamespace      = "PRISM_POD_NAMESPACE"
	EnvPodIP             = "PRISM_POD_IP"
	EnvAdminEndpoints    = "PRISM_ADMIN_ENDPOINTS"
	EnvLeaseTTL          = "PRISM_LEASE_TTL"
	EnvHeartbeatInterval = "PRISM_HEARTBEAT_INTERVAL"
	EnvRunnerAddr        = "PRISM_RUNNER_ADDR"
	EnvAdvertiseAddr     = "PRISM_ADVERTISE_ADDR"
	EnvHTTPAddr          = "PRISM_HTTP_ADDR"
	EnvLogLevel          = "PRISM_LOG_LEVEL"
)

// Injected reports whether pod already carries the sidecar, as a container
// of either kind: a user who added it by hand is not given a second one.
func Injected(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == ContainerName {
			return true
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == ContainerName {
			return true
		}
	}
	return false
}

// Mutate adds the sidecar to pod as a native sidecar: an init container
// with restartPolicy Always. It goes after the pod's own init containers,
// so it starts only when the pod is otherwise ready to run, and before the
// runner: the kubelet starts it first and stops it last, which is what
// lets the lease be released after the runner has committed its offsets.
// The sidecar, and the containers o.TLS names, get the proxy identity the
// TLS mode says; it fails only when that identity cannot be named.
func Mutate(pod *corev1.Pod, o Options) error {
	always := corev1.ContainerRestartPolicyAlways
	sidecar := corev1.Container{
		Name:          ContainerName,
		Image:         o.Image,
		Args:          sidecarArgs(),
		Env:           sidecarEnv(o),
		RestartPolicy: &always,
		Ports: []corev1.ContainerPort{{
			Name: sidecarHTTPPortName, ContainerPort: SidecarHTTPPort, Protocol: corev1.ProtocolTCP,
		}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: o.CPU, corev1.ResourceMemory: o.Memory},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: o.Memory},
		},
		// The kubelet starts the runner only once this passes, so the
		// sidecar is registered before the runner can be asked for work.
		StartupProbe:  httpProbe("/healthz", 1, 60),
		LivenessProbe: httpProbe("/healthz", 10, 3),
		// Ready only while the sidecar holds its leases: a pod that lost
		// them leaves the Service's endpoints too.
		ReadinessProbe:           httpProbe("/readyz", 5, 2),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          restrictedSecurityContext(),
	}
	if err := addTLS(pod, &sidecar, o); err != nil {
		return err
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, sidecar)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationStatus] = statusInjected
	return nil
}

func sidecarArgs() []string {
	return []string{
		"sidecar",
		"--proxy-id=$(" + EnvProxyID + ")",
		"--admin-endpoints=$(" + EnvAdminEndpoints + ")",
		"--lease-ttl=$(" + EnvLeaseTTL + ")",
		"--heartbeat-interval=$(" + EnvHeartbeatInterval + ")",
		"--runner-addr=$(" + EnvRunnerAddr + ")",
		"--advertise-addr=$(" + EnvAdvertiseAddr + ")",
		"--http-addr=$(" + EnvHTTPAddr + ")",
		"--log-level=$(" + EnvLogLevel + ")",
	}
}

func sidecarEnv(o Options) []corev1.EnvVar {
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}
	}
	// Pod name and namespace come first: Kubernetes expands $(VAR) only
	// from variables defined earlier in the list.
	env := []corev1.EnvVar{
		{Name: EnvPodName, ValueFrom: field("metadata.name")},
		{Name: EnvPodNamespace, ValueFrom: field("metadata.namespace")},
		{Name: EnvPodIP, ValueFrom: field("status.podIP")},
	}
	if o.ProxyID == "" {
		env = append(env, corev1.EnvVar{Name: EnvProxyID, ValueFrom: field("metadata.name")})
	} else {
		env = append(env, corev1.EnvVar{Name: EnvProxyID, Value: o.ProxyID})
	}
	level := o.LogLevel
	if level == "" {
		level = "info"
	}
	return append(env,
		corev1.EnvVar{Name: EnvAdminEndpoints, Value: strings.Join(o.AdminEndpoints, ",")},
		corev1.EnvVar{Name: EnvLeaseTTL, Value: o.LeaseTTL.String()},
		corev1.EnvVar{Name: EnvHeartbeatInterval, Value: o.HeartbeatInterval.String()},
		corev1.EnvVar{Name: EnvRunnerAddr, Value: o.RunnerAddr},
		// Expanded by the kubelet from PRISM_POD_IP above: Envoy's EDS
		// needs an IP, and only the kubelet knows it.
		corev1.EnvVar{Name: EnvAdvertiseAddr, Value: "$(" + EnvPodIP + "):" + strconv.Itoa(o.QueryPort)},
		corev1.EnvVar{Name: EnvHTTPAddr, Value: ":" + strconv.Itoa(SidecarHTTPPort)},
		corev1.EnvVar{Name: EnvLogLevel, Value: level},
	)
}

func httpProbe(path string, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromString(sidecarHTTPPortName),
		}},
		PeriodSeconds:    period,
		FailureThreshold: failures,
		TimeoutSeconds:   1,
	}
}

func restrictedSecurityContext() *corev1.SecurityContext {
	yes, no := true, false
	return &corev1.SecurityContext{
		RunAsNonRoot:             &yes,
		ReadOnlyRootFilesystem:   &yes,
		AllowPrivilegeEscalation: &no,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// DefaultOptions are the injector's built-in defaults; the command's flags
// override them and pod annotations override those. The TLS mode has no
// default: the injector is told how pods get their identity, or it refuses
// to start.
func DefaultOptions() Options {
	return Options{
		LeaseTTL:          15 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		RunnerAddr:        "127.0.0.1:7071",
		QueryPort:         9090,
		CPU:               resource.MustParse("50m"),
		Memory:            resource.MustParse("64Mi"),
		LogLevel:          "info",
		TLS:               TLSOptions{TrustDomain: identity.DefaultTrustDomain, Containers: []string{"runner"}},
	}
}

// describe is a short human summary for logs and the status annotation's
// readers.
func (o Options) describe() string {
	id := o.ProxyID
	if id == "" {
		id = "<pod name>"
	}
	return fmt.Sprintf("proxy=%s admin=%s ttl=%s heartbeat=%s tls=%s", id, strings.Join(o.AdminEndpoints, ","), o.LeaseTTL, o.HeartbeatInterval, o.TLS.Mode)
}
