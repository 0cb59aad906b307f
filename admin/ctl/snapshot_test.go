package ctl

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/mesh/identity"
)

// snapshot save writes a file that verifies, for an operator only: a
// reader's and a proxy's saves are refused and write nothing.
func TestSnapshotSave(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	dir := t.TempDir()
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	if out, err := prismctl(t, append(slices.Clone(op), "namespace", "create", "audit-logs", "--topic", "audit.events")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, who := range []identity.Role{identity.Reader, identity.Proxy} {
		out, err := prismctl(t, append(a.as(who, "x"), "snapshot", "save", filepath.Join(dir, "refused.snap"))...)
		if err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
			t.Fatalf("a %s's save: %v\n%s", who, err, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused saves left %d files", len(entries))
	}
	path := filepath.Join(dir, "prism.snap")
	out, err := prismctl(t, append(slices.Clone(op), "snapshot", "save", path)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "namespaces/proxies/leases/sessions  1/0/0/0") {
		t.Fatalf("output does not count the namespace:\n%s", out)
	}
	info, _, err := backup.ReadFile(path)
	if err != nil || info.GetNamespaceCount() != 1 || info.GetNodeId() != "solo" {
		t.Fatalf("saved file: %v, %v", info, err)
	}
}
