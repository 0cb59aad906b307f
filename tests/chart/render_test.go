// Package chart proves the Helm chart by running it: it renders helm/prism with Helm's own Go packages, as
// helm/'s tests do, and starts every Prism container of the rendered workloads as a real `prism` process with
// exactly its rendered arguments and environment, each pod in a network namespace of its own with its volumes
// mounted where the container expects them (testkit/podproc), then checks that what listens is what the
// chart points at: probes, Service target ports and the gateway listener the admins announce over xDS; and
// that a query with a token is answered through the gateway pod.
package chart

import (
	"fmt"
	"os"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/helm/chartrender"
)

const (
	chartDir    = "../../helm/prism"
	releaseName = chartrender.Release
	namespace   = chartrender.Namespace
)

// render renders the chart as `helm install` would, into namespace, with the values files merged in order, every
// object decoded strictly.
func render(t testing.TB, valueFiles ...string) *chartrender.Objects {
	t.Helper()
	overrides, err := chartrender.ReadValues(valueFiles...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := chartrender.Chart(chartDir, overrides)
	if err != nil {
		t.Fatal(err)
	}
	return r
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
