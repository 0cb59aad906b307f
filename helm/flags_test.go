package helm

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/sidecar/inject"
	"github.com/prism-mesh/prism/testkit/testbin"
)

// TestChartArgsParseWithPrism runs the real prism binary with every
// argument list the chart (and the injector, for the sidecar) gives it,
// plus --help: cobra parses all flags before it honours --help, so an
// unknown flag or a malformed typed value fails here instead of in a
// CrashLoopBackOff.
func TestChartArgsParseWithPrism(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]string{}
	for mode, vals := range map[string]map[string]any{
		"cert-manager": valueSets["custom kafka"], "secret": secretMode, "insecure": insecureMode, "generate": generateMode,
	} {
		r := render(t, vals)
		injector := container(t, chartrender.MustGet(t, r.Deployments, injectorName).Spec.Template.Spec, "injector")
		runnerPod := &corev1.Pod{Spec: *chartrender.MustGet(t, r.StatefulSets, runnerName).Spec.Template.Spec.DeepCopy()}
		runnerPod.Name = runnerName + "-0"
		if err := inject.Mutate(runnerPod, injectorOptions(t, injector)); err != nil {
			t.Fatal(err)
		}
		cases[mode+"/admin"] = kubeletArgs(container(t, chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec, "admin"))
		cases[mode+"/runner"] = kubeletArgs(container(t, runnerPod.Spec, "runner"))
		cases[mode+"/injector"] = kubeletArgs(injector)
		cases[mode+"/sidecar"] = kubeletArgs(runnerPod.Spec.InitContainers[len(runnerPod.Spec.InitContainers)-1])
		if job, ok := r.certsJob(); ok {
			cases[mode+"/certs"] = kubeletArgs(job.Spec.Template.Spec.Containers[0])
		}
	}
	if _, ok := cases["generate/certs"]; !ok {
		t.Fatal("tls.mode generate rendered no certs hook Job")
	}
	// Each way of checking query tokens gives prism admin other flags.
	for _, set := range []string{"query auth disabled", "query auth from a ConfigMap", "query auth with a CA and port"} {
		r := render(t, valueSets[set])
		cases[set+"/admin"] = kubeletArgs(container(t, chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec, "admin"))
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if len(args) == 0 {
				t.Fatal("no args")
			}
			if !hasSubcommand(t, bin, args[0]) {
				// prism sidecar lands with the lease agent; its flags must
				// then match inject.Mutate's: this test starts checking
				// them on its own.
				t.Skipf("prism has no %q subcommand yet", args[0])
			}
			out, err := exec.Command(bin, append(append([]string{}, args...), "--help")...).CombinedOutput()
			if err != nil {
				t.Fatalf("prism %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
}

// fieldRefStandIns are what the downward API would put into a pod's env.
var fieldRefStandIns = map[string]string{
	"metadata.name":      "prism-runner-0",
	"metadata.namespace": "prism",
	"status.podIP":       "127.0.0.1",
}

// kubeletArgs expands $(VAR) in c's args from its env the way the kubelet
// does, so typed flags are parsed with the values they get in a pod rather
// than the literal reference.
func kubeletArgs(c corev1.Container) []string {
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	expand := func(s string) string {
		return ref.ReplaceAllStringFunc(s, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = fieldRefStandIns[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value)
		}
	}
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = expand(a)
	}
	return out
}

func hasSubcommand(t *testing.T, bin, name string) bool {
	t.Helper()
	out, err := exec.Command(bin, "help", name).CombinedOutput()
	return err == nil && !strings.Contains(string(out), "Unknown help topic")
}

// TestNotesCommandParsesWithPrismctl keeps the prismctl line users copy
// from NOTES.txt in step with the real prismctl.
func TestNotesCommandParsesWithPrismctl(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prismctl")
	if err != nil {
		t.Fatal(err)
	}
	r := render(t, valueSets["defaults"])
	var line string
	for _, l := range strings.Split(r.Notes, "\n") {
		if f := strings.TrimSpace(l); strings.HasPrefix(f, "prismctl ") {
			line = f
		}
	}
	if line == "" {
		t.Fatalf("NOTES.txt has no prismctl command:\n%s", r.Notes)
	}
	args := append(strings.Fields(line)[1:], "--help")
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
}
