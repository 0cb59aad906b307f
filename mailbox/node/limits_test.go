package node

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// TestControlAPIClosesIdleConnections: the control API sends away a
// connection idle for the runner's idle bound (the client goes IDLE and
// reconnects on its next call).
func TestControlAPIClosesIdleConnections(t *testing.T) {
	t.Parallel()
	rc := runnerConfig(t)
	rc.Conn.Idle = 200 * time.Millisecond
	n, err := Start(Config{Runner: rc, Logger: quiet(), ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	cc := dial(t, n.ControlAddr(), insecure.NewCredentials())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := runnerv1.NewRunnerControlClient(cc)
	if _, err := client.GetStats(ctx, &runnerv1.GetStatsRequest{}); err != nil {
		t.Fatal(err)
	}
	for st := cc.GetState(); st != connectivity.Idle; st = cc.GetState() {
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatalf("the idle connection stayed %v", st)
		}
	}
	if _, err := client.GetStats(ctx, &runnerv1.GetStatsRequest{}); err != nil {
		t.Fatalf("the next call after the idle close: %v", err)
	}
}
