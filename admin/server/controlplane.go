package server

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prism-mesh/prism/admin/audit"
	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// write commits cmd on the leader (forwarding if needed) and returns the
// FSM's typed response; the leader may shed it (admission.go). With readYourWrite, a forwarded write is answered
// only once this node has applied it too (for operator writes that are read
// back at once, like prismctl's; lease calls carry their result and skip the
// wait).
func write[Resp proto.Message](s *Server, ctx context.Context, method string, cmd *adminv1.Command, readYourWrite bool,
	remote func(context.Context, *grpc.ClientConn) (Resp, error),
) (Resp, error) {
	return writeAs(s, ctx, method, cmd, readYourWrite, func(res any, _ uint64) (Resp, error) {
		r, ok := res.(Resp)
		if !ok {
			var zero Resp
			return zero, status.Errorf(codes.Internal, "%s: fsm answered %T", method, res)
		}
		return r, nil
	}, remote)
}

// writeAs is write for a command whose FSM result is not the RPC's
// response: answer turns the result, committed at index, into one (or a
// refusal) on the leader.
func writeAs[Resp proto.Message](s *Server, ctx context.Context, method string, cmd *adminv1.Command, readYourWrite bool,
	answer func(res any, index uint64) (Resp, error),
	remote func(context.Context, *grpc.ClientConn) (Resp, error),
) (Resp, error) {
	var zero Resp
	if err := s.admitWrite(method); err != nil {
		return zero, err
	}
	// The leader checks cmd whole in propose, once it has stamped it. Any
	// other node checks what it can here, so a malformed request is refused
	// at once instead of forwarded or held until a leader appears. Should
	// leadership move meanwhile, the leader that proposes still checks.
	if l, _ := s.node.Leadership(); !l.IsLeader {
		if err := fsm.ValidateBody(cmd); err != nil {
			return zero, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	resp, err := leaderCall(s, ctx, method, func(ctx context.Context) (Resp, error) {
		release, err := s.admit(method)
		if err != nil {
			return zero, err
		}
		defer release()
		if h := s.hooks.writeAdmitted.Load(); h != nil {
			(*h)(method)
		}
		res, index, err := s.proposeAt(ctx, cmd)
		if err != nil {
			return zero, err
		}
		return answer(res, index)
	}, func(ctx context.Context, cc *grpc.ClientConn) (Resp, error) {
		r, err := remote(ctx, cc)
		if err == nil && readYourWrite {
			s.awaitApplied(ctx, r)
		}
		return r, err
	})
	return resp, toStatus(err)
}

// awaitApplied holds a forwarded write's answer until this node has applied
// the write too, so a client reading from the node it wrote through sees its
// own write even with STALE reads. Bounded by the call's deadline: the write
// has committed, so running out of time only costs read-your-writes.
func (s *Server) awaitApplied(ctx context.Context, resp any) {
	r, ok := resp.(interface{ GetIndex() uint64 })
	if !ok {
		return
	}
	for s.node.AppliedIndex() < r.GetIndex() {
		_, changed := s.fsm.Changed()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (s *Server) RegisterProxy(ctx context.Context, req *adminv1.RegisterProxyRequest) (*adminv1.RegisterProxyResponse, error) {
	if err := s.admitProxy(req.GetRegistration().GetProxyId()); err != nil {
		return nil, err
	}
	if err := s.admitAddress("registration.address", req.GetRegistration().GetAddress()); err != nil {
		return nil, err
	}
	return write(s, ctx, "RegisterProxy",
		&adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: req}}, true,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.RegisterProxyResponse, error) {
			return adminv1.NewControlPlaneClient(cc).RegisterProxy(ctx, req)
		})
}

// ProxyHeartbeat also hands the namespaces' lag to the leader's mover
// (noteHeartbeat).
func (s *Server) ProxyHeartbeat(ctx context.Context, req *adminv1.ProxyHeartbeatRequest) (*adminv1.ProxyHeartbeatResponse, error) {
	resp, err := write(s, ctx, "ProxyHeartbeat",
		&adminv1.Command{Body: &adminv1.Command_ProxyHeartbeat{ProxyHeartbeat: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ProxyHeartbeatResponse, error) {
			return adminv1.NewControlPlaneClient(cc).ProxyHeartbeat(ctx, req)
		})
	if err == nil {
		s.noteHeartbeat(req, resp)
	}
	return resp, err
}

// CreateNamespace records who created the namespace: over mutual TLS the
// principal is the caller's identity, whatever the request says; in
// plaintext it is the unverified field as sent.
func (s *Server) CreateNamespace(ctx context.Context, req *adminv1.CreateNamespaceRequest) (*adminv1.CreateNamespaceResponse, error) {
	if caller, ok := identity.Caller(ctx); ok {
		req.Principal = caller.String()
	}
	if err := s.admitNamespace(req.GetNamespace()); err != nil {
		return nil, err
	}
	if err := refuseSystemNamespace("create", req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := write(s, ctx, "CreateNamespace",
		&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: req}}, true,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CreateNamespaceResponse, error) {
			return adminv1.NewControlPlaneClient(cc).CreateNamespace(ctx, req)
		})
	if err == nil && resp.GetCreated() && !forwarded(ctx) {
		s.log.Info("namespace created", "namespace", req.GetNamespace(), "principal", req.GetPrincipal(), "index", resp.GetIndex())
	}
	return resp, err
}

// DeleteNamespace logs the caller's identity (over mutual TLS) as who
// deleted the namespace.
func (s *Server) DeleteNamespace(ctx context.Context, req *adminv1.DeleteNamespaceRequest) (*adminv1.DeleteNamespaceResponse, error) {
	if err := refuseSystemNamespace("delete", req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := write(s, ctx, "DeleteNamespace",
		&adminv1.Command{Body: &adminv1.Command_DeleteNamespace{DeleteNamespace: req}}, true,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.DeleteNamespaceResponse, error) {
			return adminv1.NewControlPlaneClient(cc).DeleteNamespace(ctx, req)
		})
	if err == nil && resp.GetDeleted() && !forwarded(ctx) {
		caller, _ := identity.Caller(ctx)
		s.log.Info("namespace deleted", "namespace", req.GetNamespace(), "principal", caller.String(), "index", resp.GetIndex())
	}
	return resp, err
}

// refuseSystemNamespace refuses a caller's create or delete of a namespace
// whose name starts with '$' (mesh.NamespaceRule): those are the admin's
// own, made by the admin itself ($admin, on the audit topic: EnsureAudit),
// so no caller can make one that reads, or hides, another topic under the
// admin's name.
func refuseSystemNamespace(verb, name string) error {
	if strings.HasPrefix(name, "$") {
		return status.Errorf(codes.PermissionDenied, "%s namespace %q: a name starting with '$' is the admin's own, which it creates itself (prism admin --audit-brokers makes %s)",
			verb, name, audit.Namespace)
	}
	return nil
}

// EnsureAudit creates the $admin namespace on topic, as the leader's own
// change (no caller), for the admin's audit trail (admin/audit). A $admin
// that exists on topic already is kept; one on another topic is an error.
func (s *Server) EnsureAudit(ctx context.Context, topic string) error {
	res, err := s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
		Namespace: audit.Namespace,
		Config:    &adminv1.NamespaceConfig{Topics: []string{topic}, ValidationMode: adminv1.ValidationMode_VALIDATION_MODE_STRICT},
	}}})
	if err != nil {
		return fmt.Errorf("create %s on %s: %w", audit.Namespace, topic, err)
	}
	if r, ok := res.(*adminv1.CreateNamespaceResponse); ok && r.GetCreated() {
		s.log.Info("namespace created", "namespace", audit.Namespace, "topic", topic, "index", r.GetIndex())
	}
	return nil
}

// admitHolder admits a request that makes a runner a holder (AcquireLease,
// OpenSession): quota is the refusal of its quota check, if any, and the
// runner's address must be one the admin may route to (networks.go).
func (s *Server) admitHolder(quota error, runnerAddress string) error {
	if quota != nil {
		return quota
	}
	return s.admitAddress("runner_address", runnerAddress)
}

func (s *Server) AcquireLease(ctx context.Context, req *adminv1.AcquireLeaseRequest) (*adminv1.AcquireLeaseResponse, error) {
	if err := s.admitHolder(s.admitLease(req.GetMailboxId()), req.GetRunnerAddress()); err != nil {
		return nil, err
	}
	resp, err := write(s, ctx, "AcquireLease",
		&adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.AcquireLeaseResponse, error) {
			return adminv1.NewControlPlaneClient(cc).AcquireLease(ctx, req)
		})
	if err == nil && resp.GetGranted() {
		s.log.Debug("lease granted", "mailbox_id", req.GetMailboxId(), "runner_id", req.GetRunnerId(), "epoch", resp.GetLease().GetEpoch())
	}
	return resp, err
}

func (s *Server) ReleaseLease(ctx context.Context, req *adminv1.ReleaseLeaseRequest) (*adminv1.ReleaseLeaseResponse, error) {
	return write(s, ctx, "ReleaseLease",
		&adminv1.Command{Body: &adminv1.Command_ReleaseLease{ReleaseLease: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ReleaseLeaseResponse, error) {
			return adminv1.NewControlPlaneClient(cc).ReleaseLease(ctx, req)
		})
}

// MailboxHeartbeat renews a lease of no session in the leader's lessor
// (renewal).
func (s *Server) MailboxHeartbeat(ctx context.Context, req *adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
	if err := lease.ValidateRenew(req); err != nil {
		return nil, toStatus(err)
	}
	return renewal(s, ctx, "MailboxHeartbeat",
		func() *lease.Receipt { return s.lessor.ReceiveHeartbeat(req.GetMailboxId()) },
		func(rc *lease.Receipt) (*adminv1.MailboxHeartbeatResponse, error) {
			return s.lessor.Renew(rc, req), nil
		},
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.MailboxHeartbeatResponse, error) {
			return adminv1.NewControlPlaneClient(cc).MailboxHeartbeat(ctx, req)
		})
}

// renewal answers a renewal, a lease's heartbeat or a session's keepalive,
// in the leader's lessor (docs/architecture.md#leader-change): receive takes
// its receipt, renew judges it. It is not a Raft write, so raft's view that
// this node leads is not enough: a leader resumed from a pause still
// believes it leads. The renewal is given only under a quorum confirmation
// younger than LeaderLease, taken after the request arrived (renewalWait;
// admin/leadership argues why no two holders can overlap), and only if raft
// still reports this node leader once the lessor has answered; otherwise
// the call goes to the leader (leaderCall). It counts from its arrival, the
// receipt taken first (admin/lease, arrival.go), and is never refused for
// load: admission.go sheds new work instead, since one lost keepalive can
// end a thousand leases.
func renewal[Resp interface{ GetRefusal() *adminv1.LeaseRefusal }](s *Server, ctx context.Context, method string,
	receive func() *lease.Receipt,
	renew func(*lease.Receipt) (Resp, error),
	remote func(context.Context, *grpc.ClientConn) (Resp, error),
) (Resp, error) {
	resp, err := leaderCall(s, ctx, method, func(ctx context.Context) (Resp, error) {
		var zero Resp
		if !s.node.IsRaftLeader() || !s.lessor.Primary() {
			return zero, raftnode.ErrNotLeader
		}
		rc := receive()
		defer rc.Close()
		leave, err := s.renewalWait(ctx, rc)
		if err != nil {
			return zero, err
		}
		defer leave()
		r, err := renew(rc)
		if err != nil {
			return zero, err
		}
		if r.GetRefusal().GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER || !s.node.IsRaftLeader() {
			return zero, raftnode.ErrNotLeader
		}
		return r, nil
	}, remote)
	return resp, toStatus(err)
}

// WatchAssignments sends the proxy's assignment set now and after every
// change to it. Each node serves it from its own FSM, so proxies can watch
// any node; the index in each message grows.
func (s *Server) WatchAssignments(req *adminv1.WatchAssignmentsRequest, stream grpc.ServerStreamingServer[adminv1.WatchAssignmentsResponse]) error {
	if err := mesh.ValidateProxyID(req.GetProxyId()); err != nil {
		return toStatus(err)
	}
	ctx := stream.Context()
	// The policy admitted a proxy; it may watch only its own assignments.
	if caller, ok := identity.Caller(ctx); ok {
		if err := identity.SameProxy(caller, req.GetProxyId()); err != nil {
			return err
		}
	}
	var last *adminv1.WatchAssignmentsResponse
	for {
		_, changed := s.fsm.Changed()
		cur, _ := s.fsm.Assignments(req.GetProxyId())
		if last == nil || !sameAssignments(last, cur) {
			if err := stream.Send(cur); err != nil {
				return fmt.Errorf("send assignments to %s: %w", req.GetProxyId(), err)
			}
			last = cur
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.draining:
			return status.Error(codes.Unavailable, "admin node shutting down; watch another node")
		case <-changed:
		}
	}
}

func sameAssignments(a, b *adminv1.WatchAssignmentsResponse) bool {
	x := proto.CloneOf(a)
	x.Index = b.GetIndex()
	return proto.Equal(x, b)
}
