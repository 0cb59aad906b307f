package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Endpoints is a ControlPlane client over every admin node. Any node answers
// any call (followers forward writes to the leader), so a unary call tries
// the node that answered last, and on a transport failure, a timeout or a
// NOT_LEADER refusal moves on: to the leader the refusal names when that is
// one of the endpoints, else to the next one, until each has been tried once.
// Retrying with backoff across calls is the caller's business.
type Endpoints struct {
	addrs   []string
	conns   []*grpc.ClientConn
	clients []adminv1.ControlPlaneClient
	attempt time.Duration
	log     *slog.Logger

	mu        sync.Mutex
	preferred int
	watchNext int
}

var _ adminv1.ControlPlaneClient = (*Endpoints)(nil)

// DialEndpoints makes clients for addrs (host:port). attempt bounds one try
// on one node, so a blackholed node costs at most that much per call.
func DialEndpoints(addrs []string, attempt time.Duration, log *slog.Logger, opts ...grpc.DialOption) (*Endpoints, error) {
	if len(addrs) == 0 {
		return nil, errors.New("admin endpoints: at least one is required")
	}
	if log == nil {
		log = slog.Default()
	}
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The watch stream is silent between changes, so only pings can
		// tell a dead admin node (no RST) from a quiet one. Servers refuse
		// pings more often than every 5 minutes by default.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 6 * time.Minute, Timeout: 20 * time.Second}),
	}, opts...)
	e := &Endpoints{addrs: slices.Clone(addrs), attempt: attempt, log: log}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, opts...)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("admin endpoint %q: %w", a, err)
		}
		e.conns = append(e.conns, cc)
		e.clients = append(e.clients, adminv1.NewControlPlaneClient(cc))
	}
	return e, nil
}

// Close closes every connection.
func (e *Endpoints) Close() error {
	var errs []error
	for _, cc := range e.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// retryable reports whether another node may succeed where this one failed.
func retryable(err error) bool {
	if r, ok := mesh.RefusalFrom(err); ok {
		return r.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Unknown, codes.Canceled:
		return true
	}
	return false
}

func (e *Endpoints) indexOf(addr string) int { return slices.Index(e.addrs, addr) }

func call[Resp any](ctx context.Context, e *Endpoints, method string, fn func(context.Context, adminv1.ControlPlaneClient) (Resp, error)) (Resp, error) {
	e.mu.Lock()
	i := e.preferred
	e.mu.Unlock()
	tried := make([]bool, len(e.clients))
	var errs []error
	for {
		tried[i] = true
		actx, cancel := context.WithTimeout(ctx, e.attempt)
		resp, err := fn(actx, e.clients[i])
		cancel()
		if err == nil {
			e.mu.Lock()
			e.preferred = i
			e.mu.Unlock()
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", e.addrs[i], err))
		if ctx.Err() != nil || !retryable(err) {
			var zero Resp
			return zero, fmt.Errorf("%s: %w", method, errors.Join(errs...))
		}
		next := -1
		if r, ok := mesh.RefusalFrom(err); ok && r.GetLeaderAddress() != "" {
			if j := e.indexOf(r.GetLeaderAddress()); j >= 0 && !tried[j] {
				next = j
			} else if j < 0 {
				e.log.Debug("leader hint is not a configured admin endpoint", "leader_address", r.GetLeaderAddress())
			}
		}
		for k := 1; next < 0 && k < len(e.clients); k++ {
			if j := (i + k) % len(e.clients); !tried[j] {
				next = j
			}
		}
		if next < 0 {
			var zero Resp
			return zero, fmt.Errorf("%s: every admin endpoint failed: %w", method, errors.Join(errs...))
		}
		i = next
	}
}

// RegisterProxy implements adminv1.ControlPlaneClient.
func (e *Endpoints) RegisterProxy(ctx context.Context, in *adminv1.RegisterProxyRequest, opts ...grpc.CallOption) (*adminv1.RegisterProxyResponse, error) {
	return call(ctx, e, "RegisterProxy", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.RegisterProxyResponse, error) {
		return c.RegisterProxy(ctx, in, opts...)
	})
}

// ProxyHeartbeat implements adminv1.ControlPlaneClient.
func (e *Endpoints) ProxyHeartbeat(ctx context.Context, in *adminv1.ProxyHeartbeatRequest, opts ...grpc.CallOption) (*adminv1.ProxyHeartbeatResponse, error) {
	return call(ctx, e, "ProxyHeartbeat", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.ProxyHeartbeatResponse, error) {
		return c.ProxyHeartbeat(ctx, in, opts...)
	})
}

// CreateNamespace implements adminv1.ControlPlaneClient.
func (e *Endpoints) CreateNamespace(ctx context.Context, in *adminv1.CreateNamespaceRequest, opts ...grpc.CallOption) (*adminv1.CreateNamespaceResponse, error) {
	return call(ctx, e, "CreateNamespace", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.CreateNamespaceResponse, error) {
		return c.CreateNamespace(ctx, in, opts...)
	})
}

// DeleteNamespace implements adminv1.ControlPlaneClient.
func (e *Endpoints) DeleteNamespace(ctx context.Context, in *adminv1.DeleteNamespaceRequest, opts ...grpc.CallOption) (*adminv1.DeleteNamespaceResponse, error) {
	return call(ctx, e, "DeleteNamespace", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.DeleteNamespaceResponse, error) {
		return c.DeleteNamespace(ctx, in, opts...)
	})
}

// AcquireLease implements adminv1.ControlPlaneClient.
func (e *Endpoints) AcquireLease(ctx context.Context, in *adminv1.AcquireLeaseRequest, opts ...grpc.CallOption) (*adminv1.AcquireLeaseResponse, error) {
	return call(ctx, e, "AcquireLease", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.AcquireLeaseResponse, error) {
		return c.AcquireLease(ctx, in, opts...)
	})
}

// MailboxHeartbeat implements adminv1.ControlPlaneClient.
func (e *Endpoints) MailboxHeartbeat(ctx context.Context, in *adminv1.MailboxHeartbeatRequest, opts ...grpc.CallOption) (*adminv1.MailboxHeartbeatResponse, error) {
	return call(ctx, e, "MailboxHeartbeat", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.MailboxHeartbeatResponse, error) {
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
	return call(ctx, e, "ReleaseLease", func(ctx context.Context, c adminv1.ControlPlaneClient) (*adminv1.ReleaseLeaseResponse, error) {
		return c.ReleaseLease(ctx, in, opts...)
	})
}

// WatchAssignments opens the stream on the next endpoint in turn, so that a
// caller reconnecting after a failure goes round every node.
func (e *Endpoints) WatchAssignments(ctx context.Context, in *adminv1.WatchAssignmentsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[adminv1.WatchAssignmentsResponse], error) {
	e.mu.Lock()
	i := e.watchNext
	e.watchNext = (i + 1) % len(e.clients)
	e.mu.Unlock()
	s, err := e.clients[i].WatchAssignments(ctx, in, opts...)
	if err != nil {
		return nil, fmt.Errorf("WatchAssignments on %s: %w", e.addrs[i], err)
	}
	return s, nil
}
