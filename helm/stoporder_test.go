package helm

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/sidecar/inject"
	"github.com/prism-mesh/prism/testkit/testbin"
)

// TestRunnerPreStopDrains: the runner container's preStop hook is prism
// sidecar drain-wait, a command the real prism binary parses, aimed at the
// loopback port the injected sidecar serves its HTTP on, with the drain
// timeout set; and the pod's grace period covers that drain plus the
// runner's and the sidecar's own stops (docs/architecture.md#kubernetes-stop-order).
func TestRunnerPreStopDrains(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		vals         map[string]any
		drain, grace int
	}{
		{"defaults", valueSets["defaults"], 180, 210},
		{"set", withQueryAuth(map[string]any{"runner": map[string]any{"drainTimeoutSeconds": 600, "terminationGracePeriodSeconds": 615}}), 600, 615},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			spec := chartrender.MustGet(t, r.StatefulSets, runnerName).Spec.Template.Spec
			runner := container(t, spec, "runner")
			if runner.Lifecycle == nil || runner.Lifecycle.PreStop == nil || runner.Lifecycle.PreStop.Exec == nil {
				t.Fatalf("runner has no preStop exec hook: %+v", runner.Lifecycle)
			}
			cmd := runner.Lifecycle.PreStop.Exec.Command
			if len(cmd) < 3 || cmd[0] != "/usr/local/bin/prism" || cmd[1] != "sidecar" || cmd[2] != "drain-wait" {
				t.Fatalf("preStop %q, want /usr/local/bin/prism sidecar drain-wait (the image's prism)", cmd)
			}
			if out, err := exec.Command(bin, append(append([]string{}, cmd[1:]...), "--help")...).CombinedOutput(); err != nil {
				t.Fatalf("prism %s: %v\n%s", strings.Join(cmd[1:], " "), err, out)
			}
			flags := args(corev1.Container{Args: cmd[3:]})
			host, port, err := net.SplitHostPort(flags["--addr"])
			if err != nil || !sets.New("127.0.0.1", "localhost").Has(host) {
				t.Fatalf("--addr=%q, want the sidecar on loopback: %v", flags["--addr"], err)
			}
			// The port the injected sidecar listens on, read from the pod
			// the injector makes of this one.
			pod := &corev1.Pod{Spec: *spec.DeepCopy()}
			pod.Name = runnerName + "-0"
			injector := container(t, chartrender.MustGet(t, r.Deployments, injectorName).Spec.Template.Spec, "injector")
			if err := inject.Mutate(pod, injectorOptions(t, injector)); err != nil {
				t.Fatal(err)
			}
			sidecar := pod.Spec.InitContainers[len(pod.Spec.InitContainers)-1]
			var listen string
			for _, e := range sidecar.Env {
				if e.Name == inject.EnvHTTPAddr {
					listen = e.Value
				}
			}
			if _, want, err := net.SplitHostPort(listen); err != nil || port != want {
				t.Fatalf("--addr port %s, the sidecar's %s=%q: want the same port", port, inject.EnvHTTPAddr, listen)
			}
			timeout, err := time.ParseDuration(flags["--timeout"])
			if err != nil || timeout != time.Duration(tc.drain)*time.Second {
				t.Fatalf("--timeout=%q, want %ds", flags["--timeout"], tc.drain)
			}
			if g := spec.TerminationGracePeriodSeconds; g == nil || *g != int64(tc.grace) || time.Duration(*g)*time.Second < timeout+15*time.Second {
				t.Fatalf("terminationGracePeriodSeconds %v, want %d, at least the drain + 15 s", g, tc.grace)
			}
		})
	}
}

// TestGraceCoversDrain: a grace period shorter than the drain plus the
// stops after it is refused, naming both values.
func TestGraceCoversDrain(t *testing.T) {
	t.Parallel()
	ch := loadChart(t)
	vals := renderValues(t, ch, withQueryAuth(map[string]any{"runner": map[string]any{"drainTimeoutSeconds": 300, "terminationGracePeriodSeconds": 314}}))
	_, err := engine.Render(ch, vals)
	if err == nil || !strings.Contains(err.Error(), "runner.terminationGracePeriodSeconds must be at least runner.drainTimeoutSeconds + 15") {
		t.Fatalf("grace 314 s for a 300 s drain: %v, want refused", err)
	}
}
