package ctl

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/mesh/identity"
)

// decode reads JSON keeping numbers as json.Number, so a 64-bit integer
// written as a string shows as a string.
func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v map[string]any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%v:\n%s", err, s)
	}
	return v
}

// -o json and yaml name fields as the HTTP API does (snake_case) and write
// 64-bit integers as numbers; --format is the same flag; wide adds columns.
func TestOutputFormats(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	run := func(args ...string) string {
		t.Helper()
		out, err := prismctl(t, append(slices.Clone(op), args...)...)
		if err != nil {
			t.Fatalf("prismctl %v: %v\n%s", args, err, out)
		}
		return out
	}
	run("namespace", "create", "audit-logs", "--topic", "audit.events", "--lease-ttl", "20s", "--skip-topic-check")

	asJSON := run("namespace", "list", "-o", "json", "--consistent")
	if alias := run("namespace", "list", "--format", "json", "--consistent"); alias != asJSON {
		t.Errorf("--format json:\n%s\nwant what -o json wrote:\n%s", alias, asJSON)
	}
	asYAML, err := yaml.YAMLToJSON([]byte(run("namespace", "list", "-o", "yaml", "--consistent")))
	if err != nil {
		t.Fatal(err)
	}
	status := decode(t, run("cluster", "status", "-o", "json"))
	for _, tc := range []struct {
		name string
		obj  map[string]any
	}{
		{"json", decode(t, asJSON)},
		{"yaml", decode(t, string(asYAML))},
	} {
		ns := tc.obj["namespaces"].([]any)[0].(map[string]any)
		if _, ok := ns["created_index"].(json.Number); !ok {
			t.Errorf("%s: created_index %#v, want a number", tc.name, ns["created_index"])
		}
		if _, ok := tc.obj["index"].(json.Number); !ok {
			t.Errorf("%s: index %#v, want a number", tc.name, tc.obj["index"])
		}
		if _, ok := ns["createdAt"]; ok || ns["created_at"] == nil {
			t.Errorf("%s: want created_at, not createdAt: %v", tc.name, ns)
		}
		cfg := ns["config"].(map[string]any)
		if cfg["validation_mode"] != "VALIDATION_MODE_STRICT" || cfg["lease"].(map[string]any)["ttl"] != "20s" {
			t.Errorf("%s: config %v", tc.name, cfg)
		}
	}
	for _, k := range []string{"commit_index", "applied_index", "term", "namespace_count"} {
		if _, ok := status[k].(json.Number); !ok {
			t.Errorf("cluster status -o json: %s %#v, want a number", k, status[k])
		}
	}
	if status["version"] != testServerVersion {
		t.Errorf("cluster status -o json: version %v, want %s", status["version"], testServerVersion)
	}

	table, wide := run("namespace", "list"), run("namespace", "list", "-o", "wide")
	for _, col := range []string{"VALIDATION", "LEASE TTL", "INCOMING"} {
		if strings.Contains(table, col) || !strings.Contains(wide, col) {
			t.Errorf("column %s: want it in -o wide only\ntable:\n%s\nwide:\n%s", col, table, wide)
		}
	}
	if !strings.Contains(wide, "strict") || !strings.Contains(wide, "20s") {
		t.Errorf("-o wide:\n%s", wide)
	}
	for _, args := range [][]string{{"proxy", "list"}, {"lease", "list"}, {"session", "list"}, {"route", "list"}, {"member", "list"}} {
		table, wide := run(args...), run(append(args, "-o", "wide")...)
		if h, w := firstLine(table), firstLine(wide); !strings.HasPrefix(w, strings.TrimSpace(h)) || len(w) <= len(h) {
			t.Errorf("%v: -o wide header %q does not extend %q", args, w, h)
		}
	}
}

func firstLine(s string) string {
	line, _, _ := bytes.Cut([]byte(s), []byte("\n"))
	return string(line)
}
