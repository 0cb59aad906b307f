package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/internal/testproc"
	"github.com/prism-mesh/prism/mesh/identity"
)

// member add and remove carry --force to the leader: without it, adding a
// voter that does not answer to a single node is refused FailedPrecondition
// saying why; with it the quorum check is skipped.
func TestMemberForce(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := a.as(identity.Operator, "ops")
	ghost := testproc.FreeAddr(t)
	cases := []struct {
		args    []string
		refused bool
	}{
		{[]string{"member", "remove", "solo"}, true},
		{[]string{"member", "add", "ghost", ghost, ghost}, true},
		{[]string{"member", "add", "ghost", ghost, ghost, "--force"}, false},
	}
	for _, tc := range cases {
		out, err := prismctl(t, append(slices.Clone(op), tc.args...)...)
		refused := err != nil && strings.Contains(err.Error(), "FailedPrecondition") && strings.Contains(err.Error(), "a quorum needs")
		if refused != tc.refused {
			t.Fatalf("%v: refused %v, want %v: %v\n%s", tc.args, refused, tc.refused, err, out)
		}
	}
}
