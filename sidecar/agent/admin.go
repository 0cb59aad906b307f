package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Endpoints is a ControlPlane client over every admin node (admin/client):
// a unary call goes round the nodes once, following NOT_LEADER hints;
// retrying with backoff across calls is the agent's business. Every call the
// sidecar makes is safe to repeat (a renewal, a reconnecting acquire, a
// release that then finds the lease gone), so a timed-out try moves on too.
type Endpoints struct {
	c *client.Client
}

var _ adminv1.ControlPlaneClient = (*Endpoints)(nil)

// DialEndpoints makes clients for addrs (host:port). attempt bounds one try
// on one node, so a blackholed node costs at most that much per call. With
// src the connections run mutual TLS as the proxy's identity and accept
// only admin nodes; nil dials in plaintext.
func DialEndpoints(addrs []string, attempt time.Duration, log *slog.Logger, src *pki.Source, opts ...grpc.DialOption) (*Endpoints, error) {
	c, err := client.New(client.Config{Endpoints: addrs, Attempt: attempt, Rounds: 1, Logger: log, DialOptions: opts, TLS: src})
	if err != nil {
		return nil, err
	}
	return &Endpoints{c: c}, nil
}

// Close closes every connection.
func (e *Endpoints) Close() { e.c.Close() }

func call[Resp any](ctx context.Context, e *Endpoints, fn func(context.Context, adminv1.ControlPlaneClient) (Resp, error)) (Resp, error) {
	return client.Do(ctx, e.c, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (Resp, error) {
		return fn(ctx, adminv1.NewControlPlaneClient(cc))
	})
}

// RegisterProxy implements adminv1.ControlPlaneClient.
func (e *Endpoints) RegisterProxy(ctx context.Context, in *adminv1.RegisterProxyRequest, opts ...grpc.CallOption) (*adminv1.RegisterProxyResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.RegisterProxyResponse, error) {
		return c.RegisterProxy(ctx, in, opts...)
	})
}

// ProxyHeartbeat implements adminv1.ControlPlaneClient.
func (e *Endpoints) ProxyHeartbeat(ctx context.Context, in *adminv1.ProxyHeartbeatRequest, opts ...grpc.CallOption) (*adminv1.ProxyHeartbeatResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.ProxyHeartbeatResponse, error) {
		return c.ProxyHeartbeat(ctx, in, opts...)
	})
}

// CreateNamespace implements adminv1.ControlPlaneClient.
func (e *Endpoints) CreateNamespace(ctx context.Context, in *adminv1.CreateNamespaceRequest, opts ...grpc.CallOption) (*adminv1.CreateNamespaceResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.CreateNamespaceResponse, error) {
		return c.CreateNamespace(ctx, in, opts...)
	})
}

// DeleteNamespace implements adminv1.ControlPlaneClient.
func (e *Endpoints) DeleteNamespace(ctx context.Context, in *adminv1.DeleteNamespaceRequest, opts ...grpc.CallOption) (*adminv1.DeleteNamespaceResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.DeleteNamespaceResponse, error) {
		return c.DeleteNamespace(ctx, in, opts...)
	})
}

// AcquireLease implements adminv1.ControlPlaneClient.
func (e *Endpoints) AcquireLease(ctx context.Context, in *adminv1.AcquireLeaseRequest, opts ...grpc.CallOption) (*adminv1.AcquireLeaseResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.AcquireLeaseResponse, error) {
		return c.AcquireLease(ctx, in, opts...)
	})
}

// MailboxHeartbeat implements adminv1.ControlPlaneClient.
func (e *Endpoints) MailboxHeartbeat(ctx context.Context, in *adminv1.MailboxHeartbeatRequest, opts ...grpc.CallOption) (*adminv1.MailboxHeartbeatResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.MailboxHeartbeatResponse, error) {
		resp, err := c.MailboxHeartbeat(ctx, in, opts...)
		if err == nil && resp.GetRefusal().GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER {
			// An in-band NOT_LEADER is a reason to ask another node.
			return nil, mesh.RefusalError(resp.GetRefusal())
		}
		return resp, err
	})
}

// ReleaseLease implements adminv1.ControlPlaneClient.
func (e *Endpoints) ReleaseLease(ctx context.Context, in *adminv1.ReleaseLeaseRequest, opts ...grpc.CallOption) (*adminv1.ReleaseLeaseResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.ReleaseLeaseResponse, error) {
		return c.ReleaseLease(ctx, in, opts...)
	})
}

// DrainProxy implements adminv1.ControlPlaneClient. Draining again for the
// same instance is a success, so a try that timed out moves on too.
func (e *Endpoints) DrainProxy(ctx context.Context, in *adminv1.DrainProxyRequest, opts ...grpc.CallOption) (*adminv1.DrainProxyResponse, error) {
	return call(ctx, e, func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.DrainProxyResponse, error) {
		return c.DrainProxy(ctx, in, opts...)
	})
}

// WatchAssignments opens the stream on the next endpoint in turn, so that a
// caller reconnecting after a failure goes round every node.
func (e *Endpoints) WatchAssignments(ctx context.Context, in *adminv1.WatchAssignmentsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[adminv1.WatchAssignmentsResponse], error) {
	addr, cc, err := e.c.Rotate()
	if err != nil {
		return nil, err
	}
	s, err := adminv1.NewControlPlaneClient(cc).WatchAssignments(ctx, in, opts...)
	if err != nil {
		return nil, fmt.Errorf("WatchAssignments on %s: %w", addr, err)
	}
	return s, nil
}

var _ adminv1.SessionsClient = (*Endpoints)(nil)

func callSessions[Resp any](ctx context.Context, e *Endpoints, r client.Repeatable, fn func(context.Context, adminv1.SessionsClient) (Resp, error)) (Resp, error) {
	return client.Do(ctx, e.c, r, func(ctx context.Context, cc *grpc.ClientConn) (Resp, error) {
		return fn(ctx, adminv1.NewSessionsClient(cc))
	})
}

// OpenSession implements adminv1.SessionsClient. Not retried on another node
// after a timeout: a second open makes a second session, which only runs out.
func (e *Endpoints) OpenSession(ctx context.Context, in *adminv1.OpenSessionRequest, opts ...grpc.CallOption) (*adminv1.OpenSessionResponse, error) {
	return callSessions(ctx, e, client.Once, func(ctx context.Context, c adminv1.SessionsClient) (*adminv1.OpenSessionResponse, error) {
		return c.OpenSession(ctx, in, opts...)
	})
}

// KeepAliveSession implements adminv1.SessionsClient.
func (e *Endpoints) KeepAliveSession(ctx context.Context, in *adminv1.KeepAliveSessionRequest, opts ...grpc.CallOption) (*adminv1.KeepAliveSessionResponse, error) {
	return callSessions(ctx, e, client.Idempotent, func(ctx context.Context, c adminv1.SessionsClient) (*adminv1.KeepAliveSessionResponse, error) {
		resp, err := c.KeepAliveSession(ctx, in, opts...)
		if err == nil && resp.GetRefusal().GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER {
			return nil, mesh.RefusalError(resp.GetRefusal())
		}
		return resp, err
	})
}

// CloseSession implements adminv1.SessionsClient.
func (e *Endpoints) CloseSession(ctx context.Context, in *adminv1.CloseSessionRequest, opts ...grpc.CallOption) (*adminv1.CloseSessionResponse, error) {
	return callSessions(ctx, e, client.Idempotent, func(ctx context.Context, c adminv1.SessionsClient) (*adminv1.CloseSessionResponse, error) {
		return c.CloseSession(ctx, in, opts...)
	})
}

// AcquireLeases implements adminv1.SessionsClient.
func (e *Endpoints) AcquireLeases(ctx context.Context, in *adminv1.AcquireLeasesRequest, opts ...grpc.CallOption) (*adminv1.AcquireLeasesResponse, error) {
	return callSessions(ctx, e, client.Idempotent, func(ctx context.Context, c adminv1.SessionsClient) (*adminv1.AcquireLeasesResponse, error) {
		return c.AcquireLeases(ctx, in, opts...)
	})
}

// ReleaseLeases implements adminv1.SessionsClient.
func (e *Endpoints) ReleaseLeases(ctx context.Context, in *adminv1.ReleaseLeasesRequest, opts ...grpc.CallOption) (*adminv1.ReleaseLeasesResponse, error) {
	return callSessions(ctx, e, client.Idempotent, func(ctx context.Context, c adminv1.SessionsClient) (*adminv1.ReleaseLeasesResponse, error) {
		return c.ReleaseLeases(ctx, in, opts...)
	})
}
