package client

import (
	"os/exec"
	"strings"
	"testing"
)

// The sidecar links this package; it must stay free of the admin's storage
// and consensus.
func TestLinksNoRaftBadgerOrFSM(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/hashicorp/raft",
			"github.com/dgraph-io/badger",
			"github.com/prism-mesh/prism/admin/fsm",
			"github.com/prism-mesh/prism/admin/lease",
			"github.com/prism-mesh/prism/admin/raftnode",
		} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("admin/client links %s", dep)
			}
		}
	}
}
