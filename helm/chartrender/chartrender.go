// Package chartrender renders the Helm chart as `helm install` does, with Helm's own Go packages, and decodes
// every object strictly into its k8s.io/api type, so the chart's tests (helm/ and tests/chart) check the objects
// an API server would accept and no others.
package chartrender

import (
	"errors"
	"fmt"
	"os"
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

// Release and Namespace are the release every render installs.
const (
	Release   = "prism"
	Namespace = "mesh"
)

// KubeVersion is a cluster new enough for native sidecars, as Chart.yaml's kubeVersion demands.
var KubeVersion = chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}

// Objects is one render of the chart, every object decoded and filed by name.
type Objects struct {
	Notes        string
	StatefulSets map[string]*appsv1.StatefulSet
	Deployments  map[string]*appsv1.Deployment
	Jobs         map[string]*batchv1.Job
	Roles        map[string]*rbacv1.Role
	RoleBindings map[string]*rbacv1.RoleBinding
	Services     map[string]*corev1.Service
	ConfigMaps   map[string]*corev1.ConfigMap
	Secrets      map[string]*corev1.Secret
	Accounts     map[string]*corev1.ServiceAccount
	Pods         map[string]*corev1.Pod
	PDBs         map[string]*policyv1.PodDisruptionBudget
	Webhooks     map[string]*admissionregistrationv1.MutatingWebhookConfiguration
	Issuers      map[string]*Issuer
	Certificates map[string]*Certificate
	Policies     map[string]*networkingv1.NetworkPolicy
	Monitors     map[string]*ServiceMonitor
	Rules        map[string]*PrometheusRule
}

// ObjectMeta is the metadata the chart writes on the kinds below.
type ObjectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

// Issuer and Certificate are cert-manager's kinds, only the fields the chart writes, so strict decoding still
// catches a misspelled one.
type Issuer struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   ObjectMeta     `json:"metadata"`
	Spec       map[string]any `json:"spec"`
}

// Certificate is cert-manager's Certificate; see Issuer.
type Certificate struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   ObjectMeta `json:"metadata"`
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
			Encoding  string `json:"encoding"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// ServiceMonitor and PrometheusRule are the fields of the Prometheus operator's kinds the chart sets; strict
// decoding refuses any other.
type ServiceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   ObjectMeta `json:"metadata"`
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

// PrometheusRule is the Prometheus operator's PrometheusRule; see ServiceMonitor.
type PrometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   ObjectMeta     `json:"metadata"`
	Spec       map[string]any `json:"spec"`
}

// Values merges overrides into the chart's values as `helm install` does for a first install of Release into
// Namespace on a KubeVersion cluster.
func Values(ch *chart.Chart, overrides map[string]any) (chartutil.Values, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = KubeVersion
	vals, err := chartutil.ToRenderValues(ch, overrides, chartutil.ReleaseOptions{
		Name: Release, Namespace: Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	return vals, nil
}

// ReadValues merges values files as `helm install -f` does: a later file's values win.
func ReadValues(files ...string) (map[string]any, error) {
	overrides := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		overrides = chartutil.MergeTables(v, overrides)
	}
	return overrides, nil
}

// Chart renders the chart in dir with overrides (nil for the defaults) and decodes every object strictly.
func Chart(dir string, overrides map[string]any) (*Objects, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	vals, err := Values(ch, overrides)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return Decode(files)
}

// Decode decodes every object of rendered files (engine.Render's output) strictly, in file-name order.
func Decode(files map[string]string) (*Objects, error) {
	r := &Objects{
		StatefulSets: map[string]*appsv1.StatefulSet{}, Deployments: map[string]*appsv1.Deployment{},
		Jobs: map[string]*batchv1.Job{}, Roles: map[string]*rbacv1.Role{}, RoleBindings: map[string]*rbacv1.RoleBinding{},
		Services: map[string]*corev1.Service{}, ConfigMaps: map[string]*corev1.ConfigMap{},
		Secrets: map[string]*corev1.Secret{}, Accounts: map[string]*corev1.ServiceAccount{}, Pods: map[string]*corev1.Pod{},
		PDBs: map[string]*policyv1.PodDisruptionBudget{}, Webhooks: map[string]*admissionregistrationv1.MutatingWebhookConfiguration{},
		Issuers: map[string]*Issuer{}, Certificates: map[string]*Certificate{},
		Policies: map[string]*networkingv1.NetworkPolicy{},
		Monitors: map[string]*ServiceMonitor{}, Rules: map[string]*PrometheusRule{},
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
			r.Notes = content
			continue
		case strings.HasPrefix(filepath.Base(name), "_"):
			continue
		}
		for _, doc := range releaseutil.SplitManifests(content) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			if err := r.add(name, []byte(doc)); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
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

// add decodes one document into its type, refusing unknown or duplicate fields, and files it by name; a kind
// the chart is not expected to make, an object rendered twice or one outside Namespace is an error.
func (r *Objects) add(file string, doc []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return fmt.Errorf("%s: not YAML: %w\n%s", file, err, doc)
	}
	name := head.Metadata.Name
	var obj any
	var err error
	switch gvk := head.APIVersion + "/" + head.Kind; gvk {
	case "apps/v1/StatefulSet":
		obj, err = put(r.StatefulSets, name, gvk)
	case "apps/v1/Deployment":
		obj, err = put(r.Deployments, name, gvk)
	case "batch/v1/Job":
		obj, err = put(r.Jobs, name, gvk)
	case "rbac.authorization.k8s.io/v1/Role":
		obj, err = put(r.Roles, name, gvk)
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		obj, err = put(r.RoleBindings, name, gvk)
	case "v1/Service":
		obj, err = put(r.Services, name, gvk)
	case "v1/ConfigMap":
		obj, err = put(r.ConfigMaps, name, gvk)
	case "v1/Secret":
		obj, err = put(r.Secrets, name, gvk)
	case "v1/Pod":
		obj, err = put(r.Pods, name, gvk)
	case "v1/ServiceAccount":
		obj, err = put(r.Accounts, name, gvk)
	case "policy/v1/PodDisruptionBudget":
		obj, err = put(r.PDBs, name, gvk)
	case "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration":
		obj, err = put(r.Webhooks, name, gvk)
	case "cert-manager.io/v1/Issuer":
		obj, err = put(r.Issuers, name, gvk)
	case "cert-manager.io/v1/Certificate":
		obj, err = put(r.Certificates, name, gvk)
	case "networking.k8s.io/v1/NetworkPolicy":
		obj, err = put(r.Policies, name, gvk)
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj, err = put(r.Monitors, name, gvk)
	case "monitoring.coreos.com/v1/PrometheusRule":
		obj, err = put(r.Rules, name, gvk)
	default:
		return fmt.Errorf("%s: unexpected object %s %s", file, gvk, name)
	}
	if err != nil {
		return err
	}
	// The API server's own strict decoding: case-sensitive field names, no unknown and no duplicate fields.
	// encoding/json would take "readonly" for "readOnly" without a word.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", file, head.Kind, name, err)
	}
	strictErrs, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil {
		err = errors.Join(strictErrs...)
	}
	if err != nil {
		return fmt.Errorf("%s: %s %s does not decode strictly: %w\n%s", file, head.Kind, name, err, doc)
	}
	if head.Kind != "MutatingWebhookConfiguration" && head.Metadata.Namespace != Namespace {
		return fmt.Errorf("%s %s in namespace %q, want %q", head.Kind, name, head.Metadata.Namespace, Namespace)
	}
	return nil
}

// put allocates the object of type T under name, refusing a duplicate.
func put[T any](m map[string]*T, name, gvk string) (*T, error) {
	if _, dup := m[name]; dup {
		return nil, fmt.Errorf("%s %s rendered twice", gvk, name)
	}
	v := new(T)
	m[name] = v
	return v, nil
}

// PodTemplates are every workload's pod template (StatefulSets, Deployments and hook Jobs), by workload name,
// and the bare pods (helm test hooks).
func (r *Objects) PodTemplates() map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for n, p := range r.Pods {
		out[n] = corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	}
	for n, s := range r.StatefulSets {
		out[n] = s.Spec.Template
	}
	for n, d := range r.Deployments {
		out[n] = d.Spec.Template
	}
	for n, j := range r.Jobs {
		out[n] = j.Spec.Template
	}
	return out
}

// MustGet is the object named name of m, failing t, with the names m has, when there is none.
func MustGet[T any](t testing.TB, m map[string]*T, name string) *T {
	t.Helper()
	v, ok := m[name]
	if !ok {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Fatalf("no %T named %s; have %v", v, name, keys)
	}
	return v
}
