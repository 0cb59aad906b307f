package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// A sidecar that cannot serve its probes fails at once, before it registers
// the proxy or touches a lease.
func TestRunFailsOnATakenHTTPAddress(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Run(ctx, Config{
		ProxyID: "p", AdvertiseAddr: "127.0.0.1:9090", RunnerAddr: "127.0.0.1:1", HTTPAddr: busy.Addr().String(),
		AdminEndpoints: []string{"127.0.0.1:1"}, HeartbeatInterval: time.Second, StopTimeout: time.Second,
		AttemptTimeout: time.Second, RetryMax: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err == nil || !strings.Contains(err.Error(), "sidecar http listen") {
		t.Fatalf("Run = %v, want the listen error", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for its context instead of failing")
	}
}
