// Package admincluster runs real `prism admin` processes on loopback, started
// by testkit/e2e: three voters with raft-wal on temp dirs, the real TCP
// transport, and a fault proxy on every directed raft link so a node can be
// cut off completely.
package admincluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testbin"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// startCluster starts size voters with a static peer list, raft links behind
// fault proxies, and snapshots small enough to be taken during a test.
func startCluster(t *testing.T, size int) *e2e.AdminCluster {
	t.Helper()
	return e2e.StartAdmins(t, e2e.AdminOptions{Size: size, RaftFaults: true, Args: []string{"--snapshot-threshold", "512", "--trailing-logs", "256"}})
}

// metricValue sums every series of name on n's /metrics (0 when it has none).
func metricValue(t *testing.T, n *e2e.AdminNode, name string) float64 {
	t.Helper()
	v, err := e2e.NewHTTP(0).Metric("http://"+n.HTTPAddr, name)
	if err != nil && !errors.Is(err, e2e.ErrNoSeries) {
		t.Fatal(err)
	}
	return v
}

// anyNode retries f on each running node in turn while it answers
// Unavailable or times out, like a real client of the cluster.
func anyNode[T any](ctx context.Context, c *e2e.AdminCluster, start int, f func(context.Context, *e2e.AdminNode) (T, error)) (T, error) {
	var (
		zero T
		err  error
	)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		n := c.Nodes[(start+attempt)%len(c.Nodes)]
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var resp T
		resp, err = f(actx, n)
		cancel()
		switch status.Code(err) {
		case codes.OK:
			return resp, nil
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		default:
			return zero, err
		}
		if attempt%len(c.Nodes) == len(c.Nodes)-1 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return zero, fmt.Errorf("no node answered: %w", err)
}

// memberAdd runs `prismctl member add` for joiner through via until the leader accepts it: it adds a voter
// only while the new configuration has a healthy quorum, counting the joiner once it answers at its gRPC
// address, so an operator retries a refusal until the joiner is up, as this does.
func memberAdd(ctx context.Context, t *testing.T, via, joiner *e2e.AdminNode) {
	t.Helper()
	ctl, err := testbin.Path("prismctl")
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "prismctl member add "+joiner.ID, func() (bool, string) {
		out, err := exec.CommandContext(ctx, ctl, append(e2e.CtlArgs(t, nil, identity.Operator, e2e.Operator), "--admin", via.GRPCAddr,
			"member", "add", joiner.ID, joiner.RaftAddr, joiner.GRPCAddr)...).CombinedOutput()
		return err == nil, string(out)
	})
}
