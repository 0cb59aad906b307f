package client

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// seenNode answers heartbeats and records who called.
type seenNode struct {
	adminv1.UnimplementedControlPlaneServer
	mu      sync.Mutex
	callers []identity.Identity
}

func (n *seenNode) MailboxHeartbeat(ctx context.Context, _ *adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
	id, err := identity.FromContext(ctx)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.callers = append(n.callers, id)
	return &adminv1.MailboxHeartbeatResponse{Renewed: true}, nil
}

func (n *seenNode) seen() []identity.Identity {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]identity.Identity(nil), n.callers...)
}

// startTLSNode serves ControlPlane over mutual TLS as src.
func startTLSNode(t *testing.T, src *pki.Source) (*seenNode, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &seenNode{}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(src.ServerConfig(pki.Any))))
	adminv1.RegisterControlPlaneServer(s, n)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return n, lis.Addr().String()
}

// With TLS the client presents its identity and talks only to admin nodes.
func TestClientDialsAdminNodesOverMutualTLS(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	proxy := p.Source(identity.Proxy, "p1")
	cases := []struct {
		name   string
		server *pki.Source
		client *pki.Source
		ok     bool
	}{
		{"an admin node", p.Source(identity.Admin, "a1"), proxy, true},
		{"a server that is not an admin node", p.Source(identity.Gateway, "gw"), proxy, false},
		{"an admin node of another CA", pkitest.New(t).Source(identity.Admin, "a1"), proxy, false},
		{"a client without TLS", p.Source(identity.Admin, "a1"), nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, addr := startTLSNode(t, tc.server)
			c, err := New(Config{Endpoints: []string{addr}, Rounds: 1, TLS: tc.client})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = Do(ctx, c, Idempotent, heartbeat)
			seen := n.seen()
			if !tc.ok {
				if err == nil || len(seen) != 0 {
					t.Fatalf("call = %v, server saw %v; want refused before the server ran it", err, seen)
				}
				return
			}
			if err != nil || len(seen) != 1 || seen[0] != pkitest.ID(identity.Proxy, "p1") {
				t.Fatalf("call = %v, server saw %v; want one call from proxy/p1", err, seen)
			}
		})
	}
}
