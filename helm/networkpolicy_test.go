package helm

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/prism-mesh/prism/helm/chartrender"
)

// endpoint is one side of a flow: a pod's labels and, as a destination,
// its containers (whose ports a policy's named or numbered ports resolve
// against).
type endpoint struct {
	labels map[string]string
	spec   corev1.PodSpec
}

// containerPort finds a port of e by name.
func (e endpoint) port(t *testing.T, name string) corev1.ContainerPort {
	t.Helper()
	for _, c := range append(append([]corev1.Container{}, e.spec.InitContainers...), e.spec.Containers...) {
		for _, p := range c.Ports {
			if p.Name == name {
				return p
			}
		}
	}
	t.Fatalf("no container port %s", name)
	return corev1.ContainerPort{}
}

func peerMatches(peers []networkingv1.NetworkPolicyPeer, labels map[string]string) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		// Same-namespace pod selectors only; anything else names no pod of
		// this release.
		if p.PodSelector != nil && p.NamespaceSelector == nil && p.IPBlock == nil && len(p.PodSelector.MatchExpressions) == 0 &&
			matchesAll(p.PodSelector.MatchLabels, labels) {
			return true
		}
	}
	return false
}

func matchesAll(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func portMatches(ports []networkingv1.NetworkPolicyPort, p corev1.ContainerPort) bool {
	if len(ports) == 0 {
		return true
	}
	for _, np := range ports {
		if np.Port == nil {
			return true
		}
		switch np.Port.Type {
		case intstr.String:
			if np.Port.StrVal == p.Name {
				return true
			}
		default:
			if np.Port.IntVal == p.ContainerPort {
				return true
			}
		}
	}
	return false
}

// allowed says whether the release's policies let src reach dst's port:
// ingress of every policy selecting dst and egress of every policy
// selecting src must allow it (no policy selecting a side allows all).
func allowed(r *rendered, src, dst endpoint, p corev1.ContainerPort) bool {
	in, out := true, true
	for _, pol := range r.Policies {
		if matchesAll(pol.Spec.PodSelector.MatchLabels, dst.labels) && contains(policyTypes(pol), "Ingress") {
			ok := false
			for _, rule := range pol.Spec.Ingress {
				ok = ok || (peerMatches(rule.From, src.labels) && portMatches(rule.Ports, p))
			}
			in = in && ok
		}
		if matchesAll(pol.Spec.PodSelector.MatchLabels, src.labels) && contains(policyTypes(pol), "Egress") {
			ok := false
			for _, rule := range pol.Spec.Egress {
				ok = ok || (peerMatches(rule.To, dst.labels) && portMatches(rule.Ports, p))
			}
			out = out && ok
		}
	}
	return in && out
}

func policyTypes(p *networkingv1.NetworkPolicy) []string {
	var out []string
	for _, t := range p.Spec.PolicyTypes {
		out = append(out, string(t))
	}
	return out
}

// TestNetworkPoliciesAllowOnlyTheMeshFlows evaluates the rendered policies
// against the rendered pods and their named container ports (the runner
// after injection, so the sidecar's port counts), flow by flow.
func TestNetworkPoliciesAllowOnlyTheMeshFlows(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		vals      map[string]any
		operator  map[string]string // an operator pod's labels
		anyPodOps bool              // any pod in the namespace counts as an operator
	}{
		{"defaults", valueSets["defaults"], map[string]string{"app": "prismctl"}, true},
		{"operators by label", withQueryAuth(map[string]any{"networkPolicy": map[string]any{"operators": []any{
			map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"role": "prism-operator"}}},
		}}}), map[string]string{"role": "prism-operator"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			if len(r.Policies) != 4 {
				t.Fatalf("%d NetworkPolicies, want admin, runner, gateway, injector", len(r.Policies))
			}
			pod := func(name string) endpoint {
				tmpl := r.PodTemplates()[name]
				return endpoint{labels: tmpl.Labels, spec: tmpl.Spec}
			}
			admin, gateway, injector := pod(adminName), pod(gatewayName), pod(injectorName)
			rp := injectedRunner(t, r)
			runner := endpoint{labels: rp.Labels, spec: rp.Spec}
			operator := endpoint{labels: tc.operator}
			stranger := endpoint{labels: map[string]string{"app": "curious"}}
			kubelet := endpoint{labels: nil}
			kafka := endpoint{labels: map[string]string{"app": "kafka"}, spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kafka", Ports: []corev1.ContainerPort{{Name: "kafka", ContainerPort: 9092}}}}}}
			idp := endpoint{labels: map[string]string{"app": "idp"}, spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "idp", Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 443}}}}}}
			flows := []struct {
				from, to string
				src, dst endpoint
				port     string
				want     bool
			}{
				{"gateway", "admin", gateway, admin, "grpc", true},
				{"gateway", "runner", gateway, runner, "grpc", true},
				{"runner", "admin", runner, admin, "grpc", true},
				{"admin", "admin", admin, admin, "raft", true},
				{"admin", "admin", admin, admin, "grpc", true},
				{"operator", "admin", operator, admin, "grpc", true},
				{"operator", "runner", operator, runner, "grpc", true},
				{"kubelet", "admin", kubelet, admin, "http", true},
				{"kubelet", "runner", kubelet, runner, "http", true},
				{"kubelet", "sidecar", kubelet, runner, "sidecar-http", true},
				{"client", "gateway", stranger, gateway, "http", true},
				{"kubelet", "gateway stats", kubelet, gateway, "stats", true},
				{"api server", "injector", kubelet, injector, "https", true},
				{"runner", "kafka", runner, kafka, "kafka", true},
				{"gateway", "jwks url", gateway, idp, "https", true},
				{"runner", "jwks url", runner, idp, "https", false},
				{"stranger", "admin", stranger, admin, "grpc", tc.anyPodOps},
				{"stranger", "runner", stranger, runner, "grpc", tc.anyPodOps},
				{"runner", "admin raft", runner, admin, "raft", false},
				{"gateway", "admin raft", gateway, admin, "raft", false},
				{"operator", "admin raft", operator, admin, "raft", false},
				{"gateway", "kafka", gateway, kafka, "kafka", false},
				{"admin", "runner", admin, runner, "grpc", false},
				{"runner", "runner", runner, runner, "grpc", false},
			}
			for _, f := range flows {
				if got := allowed(r, f.src, f.dst, f.dst.port(t, f.port)); got != f.want {
					t.Errorf("%s -> %s %s: allowed %v, want %v", f.from, f.to, f.port, got, f.want)
				}
			}
			// Every port a policy names is a port of the pods on that side.
			for name, pol := range r.Policies {
				var own []endpoint
				for _, e := range []endpoint{admin, gateway, injector, runner} {
					if matchesAll(pol.Spec.PodSelector.MatchLabels, e.labels) {
						own = append(own, e)
					}
				}
				if len(own) != 1 {
					t.Fatalf("policy %s selects %d pods", name, len(own))
				}
				for _, rule := range pol.Spec.Ingress {
					for _, p := range rule.Ports {
						if !hasPort(own[0].spec, p.Port.String()) && !hasInitPort(own[0].spec, p.Port.String()) {
							t.Errorf("policy %s: ingress port %s is no port of its pods", name, p.Port.String())
						}
					}
				}
				for _, rule := range pol.Spec.Egress {
					for _, to := range rule.To {
						for _, e := range []endpoint{admin, gateway, runner} {
							if to.PodSelector == nil || !matchesAll(to.PodSelector.MatchLabels, e.labels) {
								continue
							}
							for _, p := range rule.Ports {
								if !hasPort(e.spec, p.Port.String()) {
									t.Errorf("policy %s: egress port %s is no port of the pods it names", name, p.Port.String())
								}
							}
						}
					}
				}
			}
		})
	}
}

func hasInitPort(spec corev1.PodSpec, target string) bool {
	return hasPort(corev1.PodSpec{Containers: spec.InitContainers}, target)
}

// TestNetworkPolicyKafkaPorts: the runners' Kafka egress opens the ports
// of kafka.brokers, to the peers networkPolicy.kafka names.
func TestNetworkPolicyKafkaPorts(t *testing.T) {
	t.Parallel()
	r := render(t, withQueryAuth(map[string]any{
		"kafka":         map[string]any{"brokers": []any{"b-1.kafka:9094", "b-2.kafka:9094", "b-3.kafka:19094"}},
		"networkPolicy": map[string]any{"kafka": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.20.0.0/16"}}}},
	}))
	pol := chartrender.MustGet(t, r.Policies, runnerName)
	var ports []string
	for _, rule := range pol.Spec.Egress {
		if len(rule.To) == 1 && rule.To[0].IPBlock != nil && rule.To[0].IPBlock.CIDR == "10.20.0.0/16" {
			for _, p := range rule.Ports {
				ports = append(ports, p.Port.String())
			}
		}
	}
	if strings.Join(ports, ",") != "9094,19094" {
		t.Errorf("kafka egress ports %v, want 9094,19094 to 10.20.0.0/16", ports)
	}
	if off := render(t, valueSets["no network policies"]); len(off.Policies) != 0 {
		t.Errorf("networkPolicy.enabled=false still renders %d policies", len(off.Policies))
	}
}

// TestNetworkPolicyJWKSPort: the gateway's Envoys may fetch the JWKS of
// gateway.queryAuth.jwksUrl, on its port and from the peers
// networkPolicy.jwks names, and nothing else when there is no URL.
func TestNetworkPolicyJWKSPort(t *testing.T) {
	t.Parallel()
	idp := []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.30.0.0/16"}}}
	tests := []struct {
		name string
		vals map[string]any
		want string // the JWKS egress rule's peers and ports; empty: no such rule
	}{
		{"default port, any address", valueSets["defaults"], "any:443"},
		{"own port and peers", map[string]any{
			"gateway":       valueSets["query auth with a CA and port"]["gateway"],
			"networkPolicy": map[string]any{"jwks": idp},
		}, "10.30.0.0/16:8443"},
		{"configmap", valueSets["query auth from a ConfigMap"], ""},
		{"disabled", valueSets["query auth disabled"], ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pol := chartrender.MustGet(t, render(t, tc.vals).Policies, gatewayName)
			var got []string
			for _, rule := range pol.Spec.Egress {
				if len(rule.To) > 0 && rule.To[0].PodSelector != nil {
					continue // the mesh's own pods
				}
				peer := "any"
				if len(rule.To) == 1 && rule.To[0].IPBlock != nil {
					peer = rule.To[0].IPBlock.CIDR
				}
				for _, p := range rule.Ports {
					if p.Port.String() != "53" {
						got = append(got, peer+":"+p.Port.String())
					}
				}
			}
			if strings.Join(got, ",") != tc.want {
				t.Errorf("gateway egress outside the mesh %v, want %q", got, tc.want)
			}
		})
	}
}
