package server

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/conntest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// Both admin listeners bound their connections (docs/security.md#connection-bounds):
// the gRPC one closes a connection without a TLS handshake within the
// handshake bound and a mutual-TLS HTTP/2 connection without a stream
// within the idle bound, sends a ping flood away and keeps a client that
// pings within the policy or holds a quiet stream; the HTTP one closes a
// silent connection and an idle kept-alive one.
func TestConnectionBounds(t *testing.T) {
	t.Parallel()
	b := connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}
	p := pkitest.New(t)
	n := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, HTTPAddr: "127.0.0.1:0", Conn: b})
	op := p.Source(identity.Operator, "op").ClientConfig(pki.RoleIs(identity.Admin))
	cases := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"grpc: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, n.GRPCAddr(), b.Handshake) }},
		{"grpc: no stream", func(t *testing.T) { conntest.IdleClosed(t, n.GRPCAddr(), op, b.Idle) }},
		{"grpc: ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, n.GRPCAddr(), op) }},
		{"grpc: pings within the policy", func(t *testing.T) { conntest.PingsAnswered(t, n.GRPCAddr(), op, 2*b.PingEvery, 4) }},
		{"grpc: a quiet stream", func(t *testing.T) {
			cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(op)), conntest.Keepalive())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			conntest.StreamHeld(t, cc, 2*b.Idle)
		}},
		{"http: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, n.HTTPAddr(), b.Handshake) }},
		{"http: idle after a request", func(t *testing.T) { conntest.HTTP1IdleClosed(t, n.HTTPAddr(), nil, "/healthz", b.Idle) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.check(t)
		})
	}
}
