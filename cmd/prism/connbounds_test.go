package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/internal/connlimit/conntest"
)

// The gateway's listeners bound their connections by its --conn-* flags
// (docs/security.md#connection-bounds): both close a connection that sends
// nothing within the handshake bound, the HTTP one an idle kept-alive
// connection and the gRPC one an HTTP/2 connection without a stream within
// the idle bound; gRPC sends a ping flood away and keeps a client that
// pings within the policy or holds a quiet stream.
func TestGatewayConnectionBounds(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP", "")
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "")
	b := connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}
	gw, err := startGateway(slog.New(slog.NewTextHandler(io.Discard, nil)), gatewayFlags{
		admin: "127.0.0.1:1", nodeID: "gw", httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0", timeout: time.Second,
		noQueryAuth: true, conn: connFlags{b},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.stop() })
	httpAddr := strings.TrimPrefix(gw.url, "http://")
	cases := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"http: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, httpAddr, b.Handshake) }},
		{"http: idle after a request", func(t *testing.T) { conntest.HTTP1IdleClosed(t, httpAddr, nil, "/healthz", b.Idle) }},
		{"grpc: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, gw.grpcAddr, b.Handshake) }},
		{"grpc: no stream", func(t *testing.T) { conntest.IdleClosed(t, gw.grpcAddr, nil, b.Idle) }},
		{"grpc: ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, gw.grpcAddr, nil) }},
		{"grpc: pings within the policy", func(t *testing.T) { conntest.PingsAnswered(t, gw.grpcAddr, nil, 2*b.PingEvery, 4) }},
		{"grpc: a quiet stream", func(t *testing.T) {
			cc, err := grpc.NewClient(gw.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), conntest.Keepalive())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			conntest.StreamHeld(t, cc, 2*b.Idle)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.check(t)
		})
	}
}
