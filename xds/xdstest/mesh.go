package xdstest

import (
	"fmt"
	"slices"

	"github.com/prism-mesh/prism/xds/ir"
)

// Mesh is a state with the given number of runners (runner-00, ...) on
// loopback ports that nobody dials, and mailboxes ns-00000@proxy-07, ...
// spread over them round-robin.
func Mesh(version uint64, runners, mailboxes int, notFound string) *ir.IR {
	x := &ir.IR{Version: version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, NotFound: []string{notFound}}
	for i := range runners {
		x.Runners = append(x.Runners, ir.Runner{ID: RunnerID(i), Address: fmt.Sprintf("127.0.0.1:%d", 20000+i), Healthy: true})
	}
	for i := range mailboxes {
		ns := fmt.Sprintf("ns-%05d", i)
		x.Mailboxes = append(x.Mailboxes, ir.Mailbox{ID: ns + "@proxy-07", Namespace: ns, RunnerID: RunnerID(i % runners), Epoch: 1})
	}
	return x
}

// RunnerID names Mesh's i-th runner.
func RunnerID(i int) string { return fmt.Sprintf("runner-%02d", i) }

// MoveLease returns a copy of x at version with mailbox i leased to runner
// under a new epoch (the version).
func MoveLease(x *ir.IR, version uint64, i int, runner string) *ir.IR {
	c := *x
	c.Version = version
	c.Runners = slices.Clone(x.Runners)
	c.Mailboxes = slices.Clone(x.Mailboxes)
	c.Mailboxes[i].RunnerID = runner
	c.Mailboxes[i].Epoch = version
	return &c
}
