// Package chart proves the Helm chart by running it: it renders helm/prism with Helm's own Go packages, as
// helm/'s tests do, and starts every Prism container of the rendered workloads as a real `prism` process with
// exactly its rendered arguments and environment, each pod in a network namespace of its own with its volumes
// mounted where the container expects them (internal/podproc), then checks that what listens is what the
// chart points at: probes, Service target ports and the gateway listener the admins announce over xDS.
package chart

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../../helm/prism"
	releaseName = "prism"
	namespace   = "mesh"
)

// rendered is the objects of one render the test runs: workloads, what their pods mount and the Services.
type rendered struct {
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	webhooks     map[string]*admissionregistrationv1.MutatingWebhookConfiguration
}

// render renders the chart as `helm install` would, into namespace, with the values files merged in order.
func render(t testing.TB, valueFiles ...string) *rendered {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	overrides := map[string]any{}
	for _, f := range valueFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		overrides = chartutil.MergeTables(v, overrides)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}
	vals, err := chartutil.ToRenderValues(ch, overrides, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := &rendered{
		statefulSets: map[string]*appsv1.StatefulSet{}, deployments: map[string]*appsv1.Deployment{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, webhooks: map[string]*admissionregistrationv1.MutatingWebhookConfiguration{},
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			r.add(t, name, []byte(doc))
		}
	}
	return r
}

func (r *rendered) add(t testing.TB, file string, doc []byte) {
	t.Helper()
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var obj any
	switch head.APIVersion + "/" + head.Kind {
	case "apps/v1/StatefulSet":
		obj = put(r.statefulSets, head.Metadata.Name)
	case "apps/v1/Deployment":
		obj = put(r.deployments, head.Metadata.Name)
	case "v1/Service":
		obj = put(r.services, head.Metadata.Name)
	case "v1/ConfigMap":
		obj = put(r.configMaps, head.Metadata.Name)
	case "v1/Secret":
		obj = put(r.secrets, head.Metadata.Name)
	case "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration":
		obj = put(r.webhooks, head.Metadata.Name)
	default:
		return // helm/'s tests decode every kind; these are the ones that run
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		t.Fatalf("%s: %s %s: %v", file, head.Kind, head.Metadata.Name, err)
	}
}

func put[T any](m map[string]*T, name string) *T {
	v := new(T)
	m[name] = v
	return v
}

func mustGet[T any](t testing.TB, m map[string]*T, name string) *T {
	t.Helper()
	v, ok := m[name]
	if !ok {
		t.Fatalf("no %T %s rendered", v, name)
	}
	return v
}

// value is the chart value at path (a.b.c) of the values files merged over the chart's values.yaml.
func value(t testing.TB, path string, valueFiles ...string) any {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals := chartutil.Values(ch.Values)
	for _, f := range valueFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		vals = chartutil.CoalesceTables(v, vals)
	}
	x, err := vals.PathValue(path)
	if err != nil {
		t.Fatalf("value %s: %v", path, err)
	}
	return x
}

func str(v any) string { return fmt.Sprint(v) }
