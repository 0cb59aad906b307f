package node

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/testkit/conntest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// The sidecar's probe port bounds its connections
// (docs/security.md#connection-bounds): one that sends nothing is closed
// within the handshake bound, a kept-alive one idle after its request
// within the idle bound. The admin and runner it would dial are absent; the
// probes are served all the same.
func TestProbePortConnectionBounds(t *testing.T) {
	t.Parallel()
	b := connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			ProxyID: "p", AdvertiseAddr: "127.0.0.1:9090", RunnerAddr: "127.0.0.1:1", HTTPAddr: addr, Conn: b,
			AdminEndpoints: []string{"127.0.0.1:1"}, HeartbeatInterval: time.Second, StopTimeout: time.Second,
			AttemptTimeout: time.Second, RetryMax: time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("sidecar stopped: %v", err)
		}
	})
	testwait.For(t, 10*time.Second, "the probe port to answer", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return true, ""
	})
	t.Run("nothing sent", func(t *testing.T) { t.Parallel(); conntest.ClosedUnused(t, addr, b.Handshake) })
	t.Run("idle after a request", func(t *testing.T) { t.Parallel(); conntest.HTTP1IdleClosed(t, addr, nil, "/healthz", b.Idle) })
}
