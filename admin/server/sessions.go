package server

import (
	"context"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sessions serves prism.admin.v1.Sessions (docs/architecture.md#sessions)
// on the Server's FSM and lessor: writes go through Raft like AcquireLease,
// keepalives are leader-local like MailboxHeartbeat.
type sessions struct {
	adminv1.UnimplementedSessionsServer
	s *Server
}

// ownMailboxes admits a proxy identity acting for its own proxy id whose
// every listed mailbox is one of that proxy's: a proxy acquires or releases
// only "*@itself".
func ownMailboxes[Req interface {
	GetProxyId() string
	GetMailboxIds() []string
}]() identity.Rule {
	own := identity.OwnProxy(Req.GetProxyId)
	return func(caller identity.Identity, req any) error {
		if err := own(caller, req); err != nil {
			return err
		}
		r, _ := req.(Req)
		for _, m := range r.GetMailboxIds() {
			if mailboxProxy(m) != r.GetProxyId() {
				return identity.Deny(caller, "mailbox %q is not a mailbox of proxy %s", m, r.GetProxyId())
			}
		}
		return nil
	}
}

// ownedSession refuses a request naming a session this node knows to be
// another proxy's, before anything is proposed or renewed. The FSM (and the
// lessor) check again where it counts, on the leader's state.
func (s *Server) ownedSession(proxyID string, id uint64) error {
	if sess, _ := s.fsm.Session(id); sess != nil && sess.GetProxyId() != proxyID {
		return status.Errorf(codes.PermissionDenied, "session %d is not proxy %s's", id, proxyID)
	}
	return nil
}

func (x sessions) OpenSession(ctx context.Context, req *adminv1.OpenSessionRequest) (*adminv1.OpenSessionResponse, error) {
	s := x.s
	if err := s.admitHolder(s.admitSession(req.GetProxyId()), req.GetRunnerAddress()); err != nil {
		return nil, err
	}
	resp, err := write(s, ctx, "OpenSession",
		&adminv1.Command{Body: &adminv1.Command_OpenSession{OpenSession: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.OpenSessionResponse, error) {
			return adminv1.NewSessionsClient(cc).OpenSession(ctx, req)
		})
	if err == nil && resp.GetSession() != nil && !forwarded(ctx) {
		s.log.Info("session opened", "proxy_id", req.GetProxyId(), "session_id", resp.GetSession().GetId(), "ttl", resp.GetSession().GetTtl().AsDuration())
	}
	return resp, err
}

// KeepAliveSession renews a session, and so every lease it holds, in the
// leader's lessor, by the one renewal path of MailboxHeartbeat (renewal).
func (x sessions) KeepAliveSession(ctx context.Context, req *adminv1.KeepAliveSessionRequest) (resp *adminv1.KeepAliveSessionResponse, err error) {
	s := x.s
	if !forwarded(ctx) {
		defer func() { s.metrics.sessions.keepAlive(resp, err) }()
	}
	if err := lease.ValidateKeepAlive(req); err != nil {
		return nil, toStatus(err)
	}
	if err := s.ownedSession(req.GetProxyId(), req.GetSessionId()); err != nil {
		return nil, err
	}
	return renewal(s, ctx, "KeepAliveSession",
		func() *lease.Receipt { return s.lessor.ReceiveKeepAlive(req.GetSessionId()) },
		func(rc *lease.Receipt) (*adminv1.KeepAliveSessionResponse, error) { return s.lessor.KeepAlive(rc, req) },
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.KeepAliveSessionResponse, error) {
			return adminv1.NewSessionsClient(cc).KeepAliveSession(ctx, req)
		})
}

func (x sessions) CloseSession(ctx context.Context, req *adminv1.CloseSessionRequest) (*adminv1.CloseSessionResponse, error) {
	s := x.s
	if err := s.ownedSession(req.GetProxyId(), req.GetSessionId()); err != nil {
		return nil, err
	}
	resp, err := write(s, ctx, "CloseSession",
		&adminv1.Command{Body: &adminv1.Command_CloseSession{CloseSession: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CloseSessionResponse, error) {
			return adminv1.NewSessionsClient(cc).CloseSession(ctx, req)
		})
	if err == nil && resp.GetClosed() && !forwarded(ctx) {
		s.metrics.sessions.sessionEnded("closed", int(resp.GetLeasesReleased()))
		s.log.Info("session closed", "proxy_id", req.GetProxyId(), "session_id", req.GetSessionId(), "leases", resp.GetLeasesReleased())
	}
	return resp, err
}

func (x sessions) AcquireLeases(ctx context.Context, req *adminv1.AcquireLeasesRequest) (*adminv1.AcquireLeasesResponse, error) {
	s := x.s
	if err := s.ownedSession(req.GetProxyId(), req.GetSessionId()); err != nil {
		return nil, err
	}
	if err := s.admitLeases(req.GetProxyId(), req.GetMailboxIds()); err != nil {
		return nil, err
	}
	return write(s, ctx, "AcquireLeases",
		&adminv1.Command{Body: &adminv1.Command_AcquireLeases{AcquireLeases: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.AcquireLeasesResponse, error) {
			return adminv1.NewSessionsClient(cc).AcquireLeases(ctx, req)
		})
}

func (x sessions) ReleaseLeases(ctx context.Context, req *adminv1.ReleaseLeasesRequest) (*adminv1.ReleaseLeasesResponse, error) {
	s := x.s
	if err := s.ownedSession(req.GetProxyId(), req.GetSessionId()); err != nil {
		return nil, err
	}
	return write(s, ctx, "ReleaseLeases",
		&adminv1.Command{Body: &adminv1.Command_ReleaseLeases{ReleaseLeases: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ReleaseLeasesResponse, error) {
			return adminv1.NewSessionsClient(cc).ReleaseLeases(ctx, req)
		})
}

// expireSessions commits the sessions the lessor says are past expires +
// grace: each ends with all its leases in this one entry, so their routes
// change at one index and xDS sends one update.
func (s *Server) expireSessions(ctx context.Context) {
	ids := s.lessor.ExpiredSessions()
	if len(ids) == 0 {
		return
	}
	commitExpiry(s, ctx, "session", len(ids), &adminv1.Command{Body: &adminv1.Command_ExpireSessions{
		ExpireSessions: &adminv1.ExpireSessionsCommand{SessionIds: ids},
	}}, func(r *fsm.ExpireSessionsResult) {
		s.metrics.expirations.Add(float64(len(r.Leases)))
		ended := map[uint64]int{}
		for _, l := range r.Leases {
			ended[l.GetSessionId()]++
		}
		for _, sess := range r.Sessions {
			s.metrics.sessions.sessionEnded("expired", ended[sess.GetId()])
			s.log.Info("session expired", "session_id", sess.GetId(), "proxy_id", sess.GetProxyId(), "runner_id", sess.GetRunnerId(), "leases", ended[sess.GetId()])
		}
	})
}
