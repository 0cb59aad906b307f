package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// forwardedKey marks a call a follower re-issued on the leader, so the
// leader never forwards it again (one hop).
const forwardedKey = "x-prism-forwarded-by"

// The admin gRPC server's message limits (NodeConfig.limits). A request may
// be up to gRPC's default 4 MiB; an answer may be as large as gRPC can frame.
// The List calls page (paging.go), within 2 MiB unless one item is larger
// (a proxy with 100k namespaces); Get calls answer one item, however large.
const (
	maxRequestBytes  = 4 << 20
	maxResponseBytes = math.MaxInt32
)

// forwardDialOptions are the options of a follower's connections to the
// leader. Their call limits are the server's, so a forwarded call succeeds
// exactly when the leader would answer it directly: with gRPC's default 4 MiB
// receive limit, a follower would refuse ResourceExhausted an answer the
// leader gives (a list of ~10k namespaces is larger). TrackSent lets a forward learn whether a failed call ever left
// this node (retryableForward).
func forwardDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		client.TrackSent(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes), grpc.MaxCallSendMsgSize(maxRequestBytes)),
	}
}

func forwarded(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(forwardedKey)) > 0
}

// leaderCall runs local on the leader or re-issues the call on the leader
// with remote (untilLeader), waiting for a leader until the caller's
// deadline or ForwardWait. It retries only after failures that prove the
// call did not run: a write applied by a dying leader and then again by its
// successor would answer the client with the second outcome, which a
// linearizable history cannot explain.
func leaderCall[Resp any](s *Server, ctx context.Context, method string,
	local func(context.Context) (Resp, error),
	remote func(context.Context, *grpc.ClientConn) (Resp, error),
) (Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ForwardWait)
	defer cancel()
	var resp Resp
	err := s.untilLeader(ctx, ctx, method, func() (bool, error) {
		r, err := local(ctx)
		if errors.Is(err, raftnode.ErrNotLeader) {
			return false, err
		}
		resp = r
		return true, err
	}, func(out context.Context, cc *grpc.ClientConn) (bool, error) {
		start := time.Now()
		r, err := remote(out, cc)
		s.metrics.observeForward(method, err, time.Since(start))
		if retryableForward(err) {
			return false, err
		}
		resp = r
		return true, err
	})
	return resp, err
}

// untilLeader runs a call where it can be answered: local while this node
// leads, else remote on the leader over a forwarding connection, with out
// marking the call forwarded and naming the original caller, whom the
// leader authorizes again (this node's admin identity only vouches for who
// that caller is). Each attempt says whether its answer is final. While
// there is no usable leader (election, leadership moved, leader
// unreachable) or an attempt was not final, it waits for the next
// leadership change and tries again until wait ends, then answers
// Unavailable with the last failure. A call that was forwarded to this node
// is never forwarded again: the forwarding follower retries, and a second
// hop could loop.
func (s *Server) untilLeader(ctx, wait context.Context, method string,
	local func() (final bool, err error),
	remote func(out context.Context, cc *grpc.ClientConn) (final bool, err error),
) error {
	lastErr := errors.New("no leader known")
	for {
		l, changed := s.node.Leadership()
		switch {
		case l.IsLeader:
			final, err := local()
			if final {
				return err
			}
			lastErr = err
		case forwarded(ctx):
			return notLeaderError(l, s.grpcAddr(l.LeaderID))
		case l.LeaderID != "" && l.LeaderID != s.node.ID():
			addr := s.grpcAddr(l.LeaderID)
			if addr == "" {
				lastErr = fmt.Errorf("gRPC address of leader %s unknown", l.LeaderID)
				break
			}
			cc, err := s.pool.Get(addr)
			if err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			out := forwardCaller(ctx, metadata.AppendToOutgoingContext(ctx, forwardedKey, s.node.ID()))
			final, err := remote(out, cc)
			if final {
				return err
			}
			lastErr = fmt.Errorf("forward to %s at %s: %w", l.LeaderID, addr, err)
		}
		select {
		case <-wait.Done():
			if st, ok := status.FromError(lastErr); ok && st.Code() == codes.Unavailable {
				return lastErr
			}
			return status.Errorf(codes.Unavailable, "%s: no leader reachable: %v", method, lastErr)
		case <-changed:
		case <-time.After(25 * time.Millisecond):
			// A leader that died keeps its id until followers time out; poll
			// instead of waiting only for a change.
		}
	}
}

// retryableForward reports whether a forwarded call certainly did not run on
// the leader, so re-issuing it cannot apply it twice: the leader refused it
// as not leader (checked before proposing), or the request never left this
// node (client.NotSent: the forwarding connection records whether gRPC ever
// gave the call a stream, so a refused or failed dial is told by that fact,
// not by its error text). Any other failure (the leader died mid-call, a
// deadline) is ambiguous and goes back to the client, which knows whether it
// may retry.
func retryableForward(err error) bool {
	if r, ok := mesh.RefusalFrom(err); ok {
		return r.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER
	}
	return client.NotSent(err)
}

func notLeaderError(l raftnode.Leadership, addr string) error {
	return mesh.RefusalError(&adminv1.LeaseRefusal{
		Reason:        adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER,
		Message:       "not the leader",
		LeaderId:      l.LeaderID,
		LeaderAddress: addr,
	})
}

// toStatus maps errors from validation, the FSM and Raft to gRPC codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, fsm.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fsm.ErrProxyNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, fsm.ErrSessionNotOwned):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, fsm.ErrNamespaceExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, fsm.ErrNotRegisteredInstance):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, fsm.ErrUnknownCommand):
		return status.Error(codes.Internal, err.Error())
	case errors.Is(err, raftnode.ErrNotLeader), errors.Is(err, raftnode.ErrShutdown), errors.Is(err, raftnode.ErrLeadershipLost):
		return status.Error(codes.Unavailable, err.Error())
	case diskfree.IsNoSpace(err):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}
