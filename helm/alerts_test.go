package helm

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/sidecar/inject"
)

const (
	rulesFile     = chartDir + "/files/prometheus-rules.yaml"
	rulesTestFile = "testdata/prometheus-rules.test.yaml"
	dashboardFile = chartDir + "/files/grafana-dashboard.json"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(rf.Groups) == 0 {
		t.Fatalf("%s: no groups", rulesFile)
	}
	return rf
}

// Metrics a query may name that Prism's source does not declare, and why.
var outsideMetrics = map[string]string{
	"up": "Prometheus records it for every target",
}

// exportedMetrics is every metric name Prism's binaries declare: the Name of
// a prometheus.*Opts, the first argument of prometheus.NewDesc or of a
// helper that wraps one, and <prefix>_<suffix> for collectors built from a
// prefix (diskfree's Collector("prism_admin")). Only non-test Go files
// importing client_golang count; bench/ and tools/ are not deployed.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	var (
		literal  = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*|\w\(\s*)"([a-z_:][a-z0-9_:]*)"`)
		suffix   = regexp.MustCompile(`\w+\s*\+\s*"(_[a-z0-9_]+)"`)
		prefix   = regexp.MustCompile(`\.Collector\(\s*"([a-z_][a-z0-9_]*)"\s*\)`)
		names    = map[string]bool{}
		suffixes []string
		prefixes []string
	)
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch rel, _ := filepath.Rel(root, path); rel {
			case ".git", "bin", "bench", "tools", "tests", "helm":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(src), `"github.com/prometheus/client_golang/prometheus`) {
			return nil
		}
		for _, m := range literal.FindAllStringSubmatch(string(src), -1) {
			if strings.HasPrefix(m[1], "prism_") {
				names[m[1]] = true
			}
		}
		for _, m := range suffix.FindAllStringSubmatch(string(src), -1) {
			suffixes = append(suffixes, m[1])
		}
		for _, m := range prefix.FindAllStringSubmatch(string(src), -1) {
			prefixes = append(prefixes, m[1])
		}
		if strings.Contains(string(src), "collectors.NewProcessCollector(") {
			names["process_start_time_seconds"] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prefixes {
		for _, s := range suffixes {
			names[p+s] = true
		}
	}
	// The ones every rule below rests on: if these are not found, the scan
	// is broken, not the rules.
	for _, n := range []string{"prism_admin_raft_leader", "prism_admin_raft_state", "prism_admin_disk_free_bytes", "prism_mailbox_consumer_lag", "process_start_time_seconds"} {
		if !names[n] {
			t.Fatalf("the source scan does not find %s; fix exportedMetrics", n)
		}
	}
	return names
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	identifier = regexp.MustCompile(`\b(prism_[a-z0-9_]+|process_[a-z0-9_]+|go_[a-z0-9_]+|envoy_[a-z0-9_]+|up)\b`)
)

// queriedMetrics is the metric names a PromQL expression reads: its
// identifiers of Prism's, the Go client's and Envoy's families, and up,
// with label values (quoted) left out.
func queriedMetrics(expr string) []string {
	var out []string
	for _, m := range identifier.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// unknownMetrics is what expr reads that is neither exported nor in
// outsideMetrics; a histogram's _bucket, _sum and _count count as its name.
func unknownMetrics(expr string, exported map[string]bool) []string {
	names := queriedMetrics(expr)
	if len(names) == 0 {
		return []string{"(no metric at all)"}
	}
	var out []string
	for _, n := range names {
		base := n
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, s); ok && exported[b] {
				base = b
			}
		}
		if !exported[base] && outsideMetrics[base] == "" {
			out = append(out, n)
		}
	}
	return out
}

func checkMetricsExist(t *testing.T, where, expr string, exported map[string]bool) {
	t.Helper()
	if unknown := unknownMetrics(expr, exported); len(unknown) > 0 {
		t.Errorf("%s: %v not exported by any Prism binary: %s", where, unknown, expr)
	}
}

func TestAlertRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)
	n := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			n++
			checkMetricsExist(t, r.Alert, r.Expr, exported)
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
				t.Errorf("%s: severity %q", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}

// The test that fails when a rule names a metric nobody exports.
func TestExportedMetricsCheckCatchesUnknownNames(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)
	for _, expr := range []string{`prism_admin_raft_leaders == 0`, `rate(prism_mailbox_consumer_lags[5m])`, `sum(nothing_here)`, `up{job="prism_admin_nope"} + prism_nope`} {
		if len(unknownMetrics(expr, exported)) == 0 {
			t.Errorf("%q passes the check", expr)
		}
	}
	if u := unknownMetrics(`rate(prism_admin_raft_commit_seconds_bucket{job="prism_x"}[5m]) + up`, exported); len(u) != 0 {
		t.Errorf("a histogram's buckets and up are refused: %v", u)
	}
}

type ruleTests struct {
	RuleFiles          []string `json:"rule_files"`
	EvaluationInterval string   `json:"evaluation_interval"`
	Tests              []struct {
		Name        string `json:"name"`
		Interval    string `json:"interval"`
		InputSeries []struct {
			Series string `json:"series"`
			Values string `json:"values"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertHasPromtoolCases: each alert is expected to fire somewhere
// in the promtool tests, and to stay quiet somewhere: an evaluation
// expecting no alert, or a firing one whose input holds more series than
// alerts expected.
func TestEveryAlertHasPromtoolCases(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var rt ruleTests
	if err := yaml.UnmarshalStrict(b, &rt); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if want := []string{"../prism/files/prometheus-rules.yaml"}; !slices.Equal(rt.RuleFiles, want) {
		t.Fatalf("%s tests %v, want %v", rulesTestFile, rt.RuleFiles, want)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			switch {
			case len(a.ExpAlerts) == 0:
				quiet[a.Alertname] = true
			default:
				fires[a.Alertname] = true
				if len(tc.InputSeries) > len(a.ExpAlerts) {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] {
				t.Errorf("%s: no promtool case where it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no promtool case where it stays quiet", r.Alert)
			}
		}
	}
}

// promtool is what `make test` installs into bin/tools, or one on PATH.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := filepath.Abs(filepath.Join("..", "bin", "tools", "promtool")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	t.Skip("SKIPPED: promtool is neither in bin/tools nor on PATH, so the alert rules were not checked or unit-tested; `make test` installs it (go install github.com/prometheus/prometheus/cmd/promtool)")
	return ""
}

// TestAlertRulesPromtool checks the rules file as Prometheus loads it and
// runs its unit tests: every alert fires on the state it is for, with the
// labels and annotations it should carry, and stays quiet otherwise.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("dashboard needs a title and a uid: %q %q", dash.Title, dash.UID)
	}
	exported := exportedMetrics(t)
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			checkMetricsExist(t, "panel "+p.Title, tg.Expr, exported)
			for _, m := range queriedMetrics(tg.Expr) {
				queried[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	// A panel for every alert's metrics.
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, m := range queriedMetrics(r.Expr) {
				if m = strings.TrimSuffix(m, "_bucket"); !queried[m] && m != "process_start_time_seconds" {
					t.Errorf("%s reads %s, which no dashboard panel shows", r.Alert, m)
				}
			}
		}
	}
}

// TestMonitoringObjects: off by default; when on, a ServiceMonitor per
// component selecting a Service of that component with the port it
// scrapes (and only that Service), as the job the alerts name; the
// PrometheusRule is the rules file; the dashboard ConfigMap is the
// dashboard file, labelled for Grafana's sidecar.
func TestMonitoringObjects(t *testing.T) {
	t.Parallel()
	if r := render(t, valueSets["defaults"]); len(r.Monitors)+len(r.Rules) != 0 || r.ConfigMaps["prism-dashboard"] != nil {
		t.Fatalf("monitoring objects rendered by default: %d ServiceMonitors, %d PrometheusRules", len(r.Monitors), len(r.Rules))
	}
	on := withQueryAuth(map[string]any{"metrics": map[string]any{
		"serviceMonitor":   map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus"}},
		"prometheusRule":   map[string]any{"enabled": true, "labels": map[string]any{"role": "alert-rules"}},
		"grafanaDashboard": map[string]any{"enabled": true},
	}})
	r := render(t, on)

	wantJobs := map[string]struct{ component, port, path string }{
		"prism-admin":   {"admin", "http", "/metrics"},
		"prism-runner":  {"runner", "http", "/metrics"},
		"prism-sidecar": {"runner", "sidecar-http", "/metrics"},
		"prism-gateway": {"gateway", "stats", "/stats/prometheus"},
	}
	jobs := map[string]bool{}
	for name, sm := range r.Monitors {
		if sm.Metadata.Labels["release"] != "kube-prometheus" {
			t.Errorf("ServiceMonitor %s lacks metrics.serviceMonitor.labels", name)
		}
		if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) || len(sm.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor %s: namespaces %v, %d endpoints", name, sm.Spec.NamespaceSelector.MatchNames, len(sm.Spec.Endpoints))
		}
		ep := sm.Spec.Endpoints[0]
		var job string
		for _, rl := range ep.Relabelings {
			if rl.TargetLabel == "job" {
				job = rl.Replacement
			}
		}
		want, ok := wantJobs[job]
		if !ok {
			t.Errorf("ServiceMonitor %s scrapes as job %q", name, job)
			continue
		}
		jobs[job] = true
		if ep.Port != want.port || ep.Path != want.path {
			t.Errorf("%s: scrapes port %q path %q, want %q %q", job, ep.Port, ep.Path, want.port, want.path)
		}
		var selected []string
		for svcName, svc := range r.Services {
			if !labelsMatch(sm.Spec.Selector.MatchLabels, svc.Labels) {
				continue
			}
			selected = append(selected, svcName)
			if svc.Labels["app.kubernetes.io/component"] != want.component {
				t.Errorf("%s selects Service %s of component %q", job, svcName, svc.Labels["app.kubernetes.io/component"])
			}
			var found bool
			for _, p := range svc.Spec.Ports {
				found = found || p.Name == ep.Port
			}
			if !found {
				t.Errorf("%s: Service %s has no port %q", job, svcName, ep.Port)
			}
		}
		if len(selected) != 1 {
			t.Errorf("%s selects Services %v, want exactly one", job, selected)
		}
	}
	if len(jobs) != len(wantJobs) {
		t.Errorf("ServiceMonitor jobs %v, want %v", jobs, wantJobs)
	}
	// The quorum loss alert counts every admin node, so the admin job
	// scrapes the Service that publishes unready nodes.
	if svc := chartrender.MustGet(t, r.Services, adminPeers); !svc.Spec.PublishNotReadyAddresses || svc.Labels["prism.io/metrics"] != "true" {
		t.Errorf("admin nodes are scraped through %s, which must publish unready nodes", adminPeers)
	}
	// Envoys are scraped ready or not (one that never got its configuration
	// is the one to look at), on their container's stats listener port.
	stats := chartrender.MustGet(t, r.Services, gatewayName+"-stats")
	proxy := container(t, chartrender.MustGet(t, r.Deployments, gatewayName).Spec.Template.Spec, "envoy")
	if !stats.Spec.PublishNotReadyAddresses || len(stats.Spec.Ports) != 1 || stats.Spec.Ports[0].TargetPort.String() != "stats" ||
		stats.Spec.Ports[0].Port != containerPort(proxy, "stats") || containerPort(proxy, "stats") == 0 {
		t.Errorf("gateway stats Service %s: publishes unready %v, ports %v; want every Envoy's stats port %d", stats.Name, stats.Spec.PublishNotReadyAddresses, stats.Spec.Ports, containerPort(proxy, "stats"))
	}
	// The sidecar's Service port reaches the port the injector gives it.
	runnerSpec := r.injected(t, chartrender.MustGet(t, r.StatefulSets, runnerName).Spec.Template)
	sidecar := runnerSpec.InitContainers[len(runnerSpec.InitContainers)-1]
	var sidecarPort bool
	for _, p := range chartrender.MustGet(t, r.Services, runnerName).Spec.Ports {
		if p.Name != "sidecar-http" {
			continue
		}
		sidecarPort = true
		var ok bool
		for _, cp := range sidecar.Ports {
			ok = ok || (cp.Name == p.TargetPort.String() && cp.ContainerPort == p.Port && cp.ContainerPort == inject.SidecarHTTPPort)
		}
		if !ok {
			t.Errorf("runner Service port sidecar-http (%d -> %s) is not the injected sidecar's port %v", p.Port, p.TargetPort.String(), sidecar.Ports)
		}
	}
	if !sidecarPort {
		t.Errorf("runner Service %s has no sidecar-http port for the sidecar ServiceMonitor", runnerName)
	}

	if len(r.Rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(r.Rules))
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	for name, pr := range r.Rules {
		if !reflect.DeepEqual(pr.Spec, want) {
			t.Errorf("PrometheusRule %s's spec is not %s", name, rulesFile)
		}
		if pr.Metadata.Labels["role"] != "alert-rules" {
			t.Errorf("PrometheusRule %s lacks metrics.prometheusRule.labels", name)
		}
	}

	cm := chartrender.MustGet(t, r.ConfigMaps, "prism-dashboard")
	dash, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var inMap, inFile any
	if err := json.Unmarshal([]byte(cm.Data["prism.json"]), &inMap); err != nil {
		t.Fatalf("dashboard ConfigMap: %v", err)
	}
	if err := json.Unmarshal(dash, &inFile); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(inMap, inFile) {
		t.Errorf("dashboard ConfigMap's prism.json is not %s", dashboardFile)
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard=1 for Grafana's sidecar", cm.Labels)
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}
