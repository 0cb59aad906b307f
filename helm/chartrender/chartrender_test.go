package chartrender

import (
	"strings"
	"testing"
)

// TestDecodeRefuses: what the API server would refuse, or the chart should never make, is an error naming it.
func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	const svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  namespace: " + Namespace + "\n"
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"unknown field", svc + "spec:\n  clusterip: None\n", "does not decode strictly"},
		{"field of the wrong case", svc + "spec:\n  clusterIp: None\n", "does not decode strictly"},
		{"duplicate field", svc + "spec:\n  type: ClusterIP\n  type: NodePort\n", `key "type" already set`},
		{"unexpected kind", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns\n", "unexpected object v1/Namespace ns"},
		{"rendered twice", svc + "---\n" + svc, "v1/Service s rendered twice"},
		{"other namespace", strings.Replace(svc, Namespace, "default", 1), `Service s in namespace "default"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode(map[string]string{"prism/templates/x.yaml": tc.doc})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestDecodeFiles(t *testing.T) {
	t.Parallel()
	r, err := Decode(map[string]string{
		"prism/templates/NOTES.txt":    "notes",
		"prism/templates/_helpers.tpl": "{{/* no objects */}}",
		"prism/templates/a.yaml": "# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: " +
			Namespace + "\ndata:\n  k: v\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Notes != "notes" || MustGet(t, r.ConfigMaps, "c").Data["k"] != "v" {
		t.Errorf("notes %q, config maps %v", r.Notes, r.ConfigMaps)
	}
}
