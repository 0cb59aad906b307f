package node

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/conntest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// bounds are short enough for the tests to outwait.
var bounds = connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}

type boundsCase struct {
	name  string
	check func(t *testing.T)
}

func runBounds(t *testing.T, cases []boundsCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.check(t)
		})
	}
}

// Every listener of a TLS runner bounds its connections
// (docs/security.md#connection-bounds): the control API and the query port
// close a connection without a TLS handshake within the handshake bound
// and a mutual-TLS HTTP/2 connection without a stream within the idle
// bound, and both send a ping flood away; the sidecar calling every
// heartbeat and a client holding a quiet stream stay connected; the
// plaintext probe port closes silent connections and h2c ones without a
// stream, and sends a ping flood away.
func TestTLSRunnerConnectionBounds(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	rc := runnerConfig(t)
	rc.Conn = bounds
	n, err := Start(Config{Runner: rc, Logger: quiet(), TLS: p.Source(identity.Proxy, "p1"),
		ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	sidecar := p.Source(identity.Proxy, "p1").ClientConfig(pki.Exactly(pkitest.ID(identity.Proxy, "p1")))
	gateway := p.Source(identity.Gateway, "gw").ClientConfig(pki.RoleIs(identity.Proxy))
	dialTLS := func(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)), conntest.Keepalive())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	runBounds(t, []boundsCase{
		{"control: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, n.ControlAddr(), bounds.Handshake) }},
		{"control: no stream", func(t *testing.T) { conntest.IdleClosed(t, n.ControlAddr(), sidecar, bounds.Idle) }},
		{"control: ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, n.ControlAddr(), sidecar) }},
		{"control: pings within the policy", func(t *testing.T) {
			conntest.PingsAnswered(t, n.ControlAddr(), sidecar, 2*bounds.PingEvery, 4)
		}},
		{"control: the sidecar calling every heartbeat", func(t *testing.T) {
			cc := dialTLS(t, n.ControlAddr(), sidecar)
			client := runnerv1.NewRunnerControlClient(cc)
			conntest.CallsHeld(t, cc, 3*bounds.Idle, bounds.Idle/3, func(ctx context.Context) error {
				_, err := client.GetStats(ctx, &runnerv1.GetStatsRequest{})
				return err
			})
		}},
		{"query: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, n.QueryAddr(), bounds.Handshake) }},
		{"query: no stream", func(t *testing.T) { conntest.IdleClosed(t, n.QueryAddr(), gateway, bounds.Idle) }},
		{"query: idle after a request", func(t *testing.T) {
			conntest.HTTP1IdleClosed(t, n.QueryAddr(), gateway, "/healthz", bounds.Idle)
		}},
		{"query: ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, n.QueryAddr(), gateway) }},
		{"query: pings within the policy", func(t *testing.T) {
			conntest.PingsAnswered(t, n.QueryAddr(), gateway, 2*bounds.PingEvery, 4)
		}},
		{"query: a quiet stream", func(t *testing.T) { conntest.StreamHeld(t, dialTLS(t, n.QueryAddr(), gateway), 2*bounds.Idle) }},
		{"http: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, n.HTTPAddr(), bounds.Handshake) }},
		{"http: no stream", func(t *testing.T) { conntest.IdleClosed(t, n.HTTPAddr(), nil, bounds.Idle) }},
		{"http: ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, n.HTTPAddr(), nil) }},
		{"http: pings within the policy", func(t *testing.T) { conntest.PingsAnswered(t, n.HTTPAddr(), nil, 2*bounds.PingEvery, 4) }},
	})
}

// A plaintext runner (--insecure) bounds its query port as the probe port:
// h2c without a stream is closed, a ping flood sent away, and a client
// holding a quiet stream stays.
func TestPlaintextQueryPortConnectionBounds(t *testing.T) {
	t.Parallel()
	rc := runnerConfig(t)
	rc.Conn = bounds
	n, err := Start(Config{Runner: rc, Logger: quiet(), ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	runBounds(t, []boundsCase{
		{"nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, n.QueryAddr(), bounds.Handshake) }},
		{"no stream", func(t *testing.T) { conntest.IdleClosed(t, n.QueryAddr(), nil, bounds.Idle) }},
		{"ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, n.QueryAddr(), nil) }},
		{"a quiet stream", func(t *testing.T) {
			cc := dial(t, n.QueryAddr(), insecure.NewCredentials())
			conntest.StreamHeld(t, cc, 2*bounds.Idle)
		}},
	})
}
