// Package helm holds the tests of the Helm chart in helm/prism: it renders
// the chart with Helm's own Go packages, decodes every object strictly into
// k8s.io/api types, checks the invariants the mesh depends on, and runs the
// real injector on the rendered runner pod.
package helm

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "prism"
	releaseName = "prism"
	namespace   = "mesh"
)

// kubeVersion is a cluster new enough for native sidecars, as Chart.yaml's
// kubeVersion demands.
var kubeVersion = chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}

// Minimal cert-manager types: only the fields the chart writes, so strict
// decoding still catches a misspelled one.
type certManagerIssuer struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   objectMeta     `json:"metadata"`
	Spec       map[string]any `json:"spec"`
}

type certManagerCertificate struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		SecretName string   `json:"secretName"`
		CommonName string   `json:"commonName"`
		DNSNames   []string `json:"dnsNames"`
		URIs       []string `json:"uris"`
		IsCA       bool     `json:"isCA"`
		Usages     []string `json:"usages"`
		Duration   string   `json:"duration"`
		PrivateKey struct {
			Algorithm string `json:"algorithm"`
			Size      int    `json:"size"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

// rendered is one render of the chart, every object decoded.
type rendered struct {
	notes        string
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	jobs         map[string]*batchv1.Job
	roles        map[string]*rbacv1.Role
	roleBindings map[string]*rbacv1.RoleBinding
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	accounts     map[string]*corev1.ServiceAccount
	pods         map[string]*corev1.Pod
	pdbs         map[string]*policyv1.PodDisruptionBudget
	webhooks     map[string]*admissionregistrationv1.MutatingWebhookConfiguration
	issuers      map[string]*certManagerIssuer
	certificates map[string]*certManagerCertificate
	policies     map[string]*networkingv1.NetworkPolicy
	monitors     map[string]*serviceMonitor
	rules        map[string]*prometheusRule
}

// serviceMonitor and prometheusRule are the fields of the Prometheus
// operator's kinds the chart sets; strict decoding refuses any other.
type serviceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Scheme      string `json:"scheme"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   objectMeta     `json:"metadata"`
	Spec       map[string]any `json:"spec"`
}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// renderValues merges overrides into the chart's values as `helm install`
// does for a first install into namespace.
func renderValues(t testing.TB, ch *chart.Chart, overrides map[string]any) chartutil.Values {
	t.Helper()
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	vals, err := chartutil.ToRenderValues(ch, overrides, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	return vals
}

// render renders the chart with overrides (nil for the defaults) and
// decodes every object strictly.
func render(t testing.TB, overrides map[string]any) *rendered {
	t.Helper()
	ch := loadChart(t)
	files, err := engine.Render(ch, renderValues(t, ch, overrides))
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return decodeAll(t, files)
}

func decodeAll(t testing.TB, files map[string]string) *rendered {
	t.Helper()
	r := &rendered{
		statefulSets: map[string]*appsv1.StatefulSet{}, deployments: map[string]*appsv1.Deployment{},
		jobs: map[string]*batchv1.Job{}, roles: map[string]*rbacv1.Role{}, roleBindings: map[string]*rbacv1.RoleBinding{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, accounts: map[string]*corev1.ServiceAccount{}, pods: map[string]*corev1.Pod{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, webhooks: map[string]*admissionregistrationv1.MutatingWebhookConfiguration{},
		issuers: map[string]*certManagerIssuer{}, certificates: map[string]*certManagerCertificate{},
		policies: map[string]*networkingv1.NetworkPolicy{},
		monitors: map[string]*serviceMonitor{}, rules: map[string]*prometheusRule{},
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		content := files[name]
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			r.notes = content
			continue
		case strings.HasPrefix(filepath.Base(name), "_"):
			continue
		}
		for _, doc := range releaseutil.SplitManifests(content) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			r.add(t, name, []byte(doc))
		}
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// add decodes one document into its k8s.io/api type, refusing unknown or
// duplicate fields, and files it by name; a kind the chart is not expected
// to make fails the test.
func (r *rendered) add(t testing.TB, file string, doc []byte) {
	t.Helper()
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatalf("%s: not YAML: %v\n%s", file, err, doc)
	}
	name := head.Metadata.Name
	var obj any
	switch gvk := head.APIVersion + "/" + head.Kind; gvk {
	case "apps/v1/StatefulSet":
		obj = put(r.statefulSets, name, t, gvk)
	case "apps/v1/Deployment":
		obj = put(r.deployments, name, t, gvk)
	case "batch/v1/Job":
		obj = put(r.jobs, name, t, gvk)
	case "rbac.authorization.k8s.io/v1/Role":
		obj = put(r.roles, name, t, gvk)
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		obj = put(r.roleBindings, name, t, gvk)
	case "v1/Service":
		obj = put(r.services, name, t, gvk)
	case "v1/ConfigMap":
		obj = put(r.configMaps, name, t, gvk)
	case "v1/Secret":
		obj = put(r.secrets, name, t, gvk)
	case "v1/Pod":
		obj = put(r.pods, name, t, gvk)
	case "v1/ServiceAccount":
		obj = put(r.accounts, name, t, gvk)
	case "policy/v1/PodDisruptionBudget":
		obj = put(r.pdbs, name, t, gvk)
	case "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration":
		obj = put(r.webhooks, name, t, gvk)
	case "cert-manager.io/v1/Issuer":
		obj = put(r.issuers, name, t, gvk)
	case "cert-manager.io/v1/Certificate":
		obj = put(r.certificates, name, t, gvk)
	case "networking.k8s.io/v1/NetworkPolicy":
		obj = put(r.policies, name, t, gvk)
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj = put(r.monitors, name, t, gvk)
	case "monitoring.coreos.com/v1/PrometheusRule":
		obj = put(r.rules, name, t, gvk)
	default:
		t.Fatalf("%s: unexpected object %s %s", file, gvk, name)
	}
	// The API server's own strict decoding: case-sensitive field names,
	// no unknown and no duplicate fields. encoding/json would take
	// "readonly" for "readOnly" without a word.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		t.Fatalf("%s: %s %s: %v", file, head.Kind, name, err)
	}
	strictErrs, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil {
		err = errors.Join(strictErrs...)
	}
	if err != nil {
		t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", file, head.Kind, name, err, doc)
	}
	if head.Kind != "MutatingWebhookConfiguration" && head.Metadata.Namespace != namespace {
		t.Errorf("%s %s in namespace %q, want %q", head.Kind, name, head.Metadata.Namespace, namespace)
	}
}

// put allocates the object of type T under name, failing on a duplicate.
func put[T any](m map[string]*T, name string, t testing.TB, gvk string) *T {
	t.Helper()
	if _, dup := m[name]; dup {
		t.Fatalf("%s %s rendered twice", gvk, name)
	}
	v := new(T)
	m[name] = v
	return v
}

// podTemplates are every workload's pod template (StatefulSets, Deployments
// and hook Jobs), by workload name, and the bare pods (helm test hooks).
func (r *rendered) podTemplates() map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for n, p := range r.pods {
		out[n] = corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	}
	for n, s := range r.statefulSets {
		out[n] = s.Spec.Template
	}
	for n, d := range r.deployments {
		out[n] = d.Spec.Template
	}
	for n, j := range r.jobs {
		out[n] = j.Spec.Template
	}
	return out
}

func args(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok {
			m[k] = v
		}
	}
	return m
}

func container(t testing.TB, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s in %v", name, spec.Containers)
	return corev1.Container{}
}

func mustGet[T any](t testing.TB, m map[string]*T, name string) *T {
	t.Helper()
	v, ok := m[name]
	if !ok {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		t.Fatalf("no %T named %s; have %v", v, name, keys)
	}
	return v
}

func toYAML(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(bytes.TrimSpace(b))
}
