package mesh_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLightPackagesStayLight fails when the packages behind prism gateway and
// prism sidecar link the store, Raft, the FSM or the xDS translator again:
// they need the wire contract (this package), not the components that
// implement the other side of it.
func TestLightPackagesStayLight(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH; cannot list package dependencies")
	}
	forbidden := []string{
		"github.com/dgraph-io/badger",
		"github.com/hashicorp/raft",
		"github.com/prism-mesh/prism/admin/fsm",
		"github.com/prism-mesh/prism/admin/lease",
		"github.com/prism-mesh/prism/mailbox/store",
		"github.com/prism-mesh/prism/xds/translator",
	}
	for _, pkg := range []string{
		"github.com/prism-mesh/prism/gateway",
		"github.com/prism-mesh/prism/sidecar/agent",
		"github.com/prism-mesh/prism/sidecar/node",
		"github.com/prism-mesh/prism/admin/client",
		"github.com/prism-mesh/prism/mesh",
	} {
		t.Run(pkg, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command(goTool, "list", "-deps", pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", pkg, err)
			}
			deps := strings.Fields(string(out))
			if len(deps) == 0 || deps[len(deps)-1] != pkg {
				t.Fatalf("go list -deps %s listed %d packages, not ending in %s", pkg, len(deps), pkg)
			}
			for _, dep := range deps {
				for _, f := range forbidden {
					if dep == f || strings.HasPrefix(dep, f+"/") {
						t.Errorf("%s imports %s (through %s)", pkg, f, dep)
					}
				}
			}
		})
	}
}
