// Package helm holds the tests of the Helm chart in helm/prism: it renders
// the chart with Helm's own Go packages and decodes every object strictly
// into k8s.io/api types (helm/chartrender), checks the invariants the mesh
// depends on, and runs the real injector on the rendered runner pod.
package helm

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/helm/chartrender"
)

const (
	chartDir    = "prism"
	releaseName = chartrender.Release
	namespace   = chartrender.Namespace
)

// rendered is one render of the chart, every object decoded; the tests here
// add their own questions about it as methods.
type rendered struct{ *chartrender.Objects }

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
	vals, err := chartrender.Values(ch, overrides)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// render renders the chart with overrides (nil for the defaults) and
// decodes every object strictly.
func render(t testing.TB, overrides map[string]any) *rendered {
	t.Helper()
	objs, err := chartrender.Chart(chartDir, overrides)
	if err != nil {
		t.Fatal(err)
	}
	return &rendered{objs}
}

func decodeAll(t testing.TB, files map[string]string) *rendered {
	t.Helper()
	objs, err := chartrender.Decode(files)
	if err != nil {
		t.Fatal(err)
	}
	return &rendered{objs}
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

func toYAML(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(bytes.TrimSpace(b))
}
