package helm

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/helm/chartrender"
)

var update = flag.Bool("update", false, "rewrite the golden files of helm/testdata")

// TestGatewayDrainGolden: what the chart gives Envoy to stop by, its
// container's command, arguments, preStop hook and the pod's grace period,
// and the drain script the hook runs, equal testdata/gateway-drain.golden.yaml
// (go test -run TestGatewayDrainGolden -update rewrites it for review).
// Envoy cannot run here, so this is where a change to how it drains shows.
func TestGatewayDrainGolden(t *testing.T) {
	t.Parallel()
	r := render(t, valueSets["defaults"])
	d := chartrender.MustGet(t, r.Deployments, gatewayName)
	envoy := container(t, d.Spec.Template.Spec, "envoy")
	cm := chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap")
	got, err := yaml.Marshal(map[string]any{
		"terminationGracePeriodSeconds": d.Spec.Template.Spec.TerminationGracePeriodSeconds,
		"command":                       envoy.Command,
		"args":                          envoy.Args,
		"lifecycle":                     envoy.Lifecycle,
		"drain.sh":                      cm.Data["drain.sh"],
	})
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "gateway-drain.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -run TestGatewayDrainGolden -update writes it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("the gateway's drain changed; review and rerun with -update:\n--- got\n%s\n--- want\n%s", got, want)
	}
}

// TestGatewayDrainFollowsValues: the preStop waits gateway.drain.seconds
// plus tailSeconds, Envoy drains for gateway.drain.seconds, and a grace
// period that does not cover both is refused.
func TestGatewayDrainFollowsValues(t *testing.T) {
	t.Parallel()
	r := render(t, withQueryAuth(map[string]any{"gateway": map[string]any{
		"drain": map[string]any{"seconds": 40, "tailSeconds": 10}, "terminationGracePeriodSeconds": 55,
	}}))
	d := chartrender.MustGet(t, r.Deployments, gatewayName)
	envoy := container(t, d.Spec.Template.Spec, "envoy")
	script := chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap").Data["drain.sh"]
	if args(envoy)["--drain-time-s"] != "40" || !strings.HasSuffix(strings.TrimSpace(script), "\nsleep 50") || *d.Spec.Template.Spec.TerminationGracePeriodSeconds != 55 {
		t.Errorf("args %v, grace %d, script:\n%s", envoy.Args, *d.Spec.Template.Spec.TerminationGracePeriodSeconds, script)
	}
	if pre := envoy.Lifecycle.PreStop; pre == nil || pre.Exec == nil || strings.Join(pre.Exec.Command, " ") != "/bin/bash /etc/envoy/drain.sh" {
		t.Errorf("preStop %+v", envoy.Lifecycle)
	}
	if _, err := chartrender.Chart(chartDir, withQueryAuth(map[string]any{"gateway": map[string]any{
		"drain": map[string]any{"seconds": 40, "tailSeconds": 10}, "terminationGracePeriodSeconds": 54,
	}})); err == nil || !strings.Contains(err.Error(), "gateway.terminationGracePeriodSeconds must be at least") {
		t.Errorf("a grace period shorter than the drain: %v", err)
	}
}
