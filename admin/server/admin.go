package server

import (
	"context"
	"strconv"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// read serves a List/Get: STALE from the local FSM; LINEARIZABLE after the
// ReadIndex barrier on the leader, a follower forwarding the whole call.
func read[Resp any](s *Server, ctx context.Context, method string, c adminv1.Consistency,
	local func() (Resp, error),
	remote func(context.Context, *grpc.ClientConn) (Resp, error),
) (Resp, error) {
	var zero Resp
	switch c {
	case adminv1.Consistency_CONSISTENCY_UNSPECIFIED, adminv1.Consistency_CONSISTENCY_STALE:
		r, err := local()
		return r, toStatus(err)
	case adminv1.Consistency_CONSISTENCY_LINEARIZABLE:
	default:
		return zero, status.Errorf(codes.InvalidArgument, "consistency: unknown value %d", c)
	}
	r, err := leaderCall(s, ctx, method, func(ctx context.Context) (Resp, error) {
		if err := s.node.ReadBarrier(ctx, s.leader.Since); err != nil {
			return zero, err
		}
		return local()
	}, remote)
	return r, toStatus(err)
}

func notFound(what, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", what, id)
}

// annotate shows the leader's live renewals in lease listings.
func (s *Server) annotate(ls []*adminv1.Lease) []*adminv1.Lease {
	if !s.lessor.Primary() {
		return ls
	}
	out := make([]*adminv1.Lease, len(ls))
	for i, l := range ls {
		out[i] = s.lessor.Annotate(l)
	}
	return out
}

func (s *Server) GetClusterStatus(ctx context.Context, _ *adminv1.GetClusterStatusRequest) (*adminv1.GetClusterStatusResponse, error) {
	st := s.node.Stats()
	l, _ := s.node.Leadership()
	resp := &adminv1.GetClusterStatusResponse{
		NodeId:            s.node.ID(),
		State:             st.State,
		LeaderId:          l.LeaderID,
		LeaderAddress:     s.grpcAddr(l.LeaderID),
		Term:              st.Term,
		CommitIndex:       st.CommitIndex,
		AppliedIndex:      st.AppliedIndex,
		LastSnapshotIndex: s.node.LastSnapshotIndex(),
		Version:           s.cfg.Version,
	}
	members, err := s.node.Members()
	if err != nil {
		return nil, toStatus(err)
	}
	for _, m := range members {
		suffrage := adminv1.MemberSuffrage_MEMBER_SUFFRAGE_NONVOTER
		if m.Voter {
			suffrage = adminv1.MemberSuffrage_MEMBER_SUFFRAGE_VOTER
		}
		resp.Members = append(resp.Members, &adminv1.Member{
			Id: m.ID, RaftAddress: m.Addr, GrpcAddress: s.grpcAddr(m.ID), Suffrage: suffrage, Leader: m.IsLeader,
		})
	}
	c := s.fsm.Counts()
	resp.NamespaceCount, resp.ProxyCount, resp.LeaseCount = int64(c.Namespaces), int64(c.Proxies), int64(c.Leases)
	return resp, nil
}

func (s *Server) ListNamespaces(ctx context.Context, req *adminv1.ListNamespacesRequest) (*adminv1.ListNamespacesResponse, error) {
	p, err := pageOf("ListNamespaces", "", req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return read(s, ctx, "ListNamespaces", req.GetConsistency(), func() (*adminv1.ListNamespacesResponse, error) {
		ns, more, idx := s.fsm.NamespacesPage(p.tok.After, p.size)
		resp := &adminv1.ListNamespacesResponse{Index: idx}
		resp.Namespaces, resp.NextPageToken = paged(p, ns, more, (*adminv1.Namespace).GetName)
		return resp, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ListNamespacesResponse, error) {
		return adminv1.NewAdminClient(cc).ListNamespaces(ctx, req)
	})
}

func (s *Server) GetNamespace(ctx context.Context, req *adminv1.GetNamespaceRequest) (*adminv1.GetNamespaceResponse, error) {
	if err := mesh.ValidateNamespaceName(req.GetNamespace()); err != nil {
		return nil, toStatus(err)
	}
	return read(s, ctx, "GetNamespace", req.GetConsistency(), func() (*adminv1.GetNamespaceResponse, error) {
		ns, route, idx := s.fsm.Namespace(req.GetNamespace())
		if ns == nil {
			return nil, notFound("namespace", req.GetNamespace())
		}
		return &adminv1.GetNamespaceResponse{Namespace: ns, Route: route, Index: idx, Replicas: s.fsm.NamespaceReplicas(req.GetNamespace())}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetNamespaceResponse, error) {
		return adminv1.NewAdminClient(cc).GetNamespace(ctx, req)
	})
}

func (s *Server) ListProxies(ctx context.Context, req *adminv1.ListProxiesRequest) (*adminv1.ListProxiesResponse, error) {
	p, err := pageOf("ListProxies", "", req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return read(s, ctx, "ListProxies", req.GetConsistency(), func() (*adminv1.ListProxiesResponse, error) {
		ps, more, idx := s.fsm.ProxiesPage(p.tok.After, p.size)
		resp := &adminv1.ListProxiesResponse{Index: idx}
		resp.Proxies, resp.NextPageToken = paged(p, ps, more, func(p *adminv1.ProxyInfo) string {
			return p.GetProxy().GetRegistration().GetProxyId()
		})
		return resp, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ListProxiesResponse, error) {
		return adminv1.NewAdminClient(cc).ListProxies(ctx, req)
	})
}

func (s *Server) GetProxy(ctx context.Context, req *adminv1.GetProxyRequest) (*adminv1.GetProxyResponse, error) {
	if err := mesh.ValidateProxyID(req.GetProxyId()); err != nil {
		return nil, toStatus(err)
	}
	return read(s, ctx, "GetProxy", req.GetConsistency(), func() (*adminv1.GetProxyResponse, error) {
		p, idx := s.fsm.Proxy(req.GetProxyId())
		if p == nil {
			return nil, notFound("proxy", req.GetProxyId())
		}
		return &adminv1.GetProxyResponse{Proxy: p, Index: idx}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetProxyResponse, error) {
		return adminv1.NewAdminClient(cc).GetProxy(ctx, req)
	})
}

func (s *Server) ListLeases(ctx context.Context, req *adminv1.ListLeasesRequest) (*adminv1.ListLeasesResponse, error) {
	if ns := req.GetNamespace(); ns != "" {
		if err := mesh.ValidateNamespaceName(ns); err != nil {
			return nil, toStatus(err)
		}
	}
	if p := req.GetProxyId(); p != "" {
		if err := mesh.ValidateProxyID(p); err != nil {
			return nil, toStatus(err)
		}
	}
	p, err := pageOf("ListLeases", req.GetNamespace()+"\x00"+req.GetProxyId(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return read(s, ctx, "ListLeases", req.GetConsistency(), func() (*adminv1.ListLeasesResponse, error) {
		ls, more, idx := s.fsm.LeasesPage(p.tok.After, p.size, req.GetNamespace(), req.GetProxyId())
		resp := &adminv1.ListLeasesResponse{Index: idx}
		resp.Leases, resp.NextPageToken = paged(p, s.annotate(ls), more, (*adminv1.Lease).GetMailboxId)
		return resp, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ListLeasesResponse, error) {
		return adminv1.NewAdminClient(cc).ListLeases(ctx, req)
	})
}

func (s *Server) GetLease(ctx context.Context, req *adminv1.GetLeaseRequest) (*adminv1.GetLeaseResponse, error) {
	if _, err := mesh.ParseMailboxID(req.GetMailboxId()); err != nil {
		return nil, toStatus(err)
	}
	return read(s, ctx, "GetLease", req.GetConsistency(), func() (*adminv1.GetLeaseResponse, error) {
		l, idx := s.fsm.Lease(req.GetMailboxId())
		if l == nil {
			return nil, notFound("lease of mailbox", req.GetMailboxId())
		}
		return &adminv1.GetLeaseResponse{Lease: s.annotate([]*adminv1.Lease{l})[0], Index: idx}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetLeaseResponse, error) {
		return adminv1.NewAdminClient(cc).GetLease(ctx, req)
	})
}

func (s *Server) ListRoutes(ctx context.Context, req *adminv1.ListRoutesRequest) (*adminv1.ListRoutesResponse, error) {
	p, err := pageOf("ListRoutes", "", req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return read(s, ctx, "ListRoutes", req.GetConsistency(), func() (*adminv1.ListRoutesResponse, error) {
		rs, nrs, more, idx := s.fsm.RoutesPage(fsm.RoutesCursor{InNamespaces: p.tok.Namespaces, After: p.tok.After}, p.size)
		resp := &adminv1.ListRoutesResponse{Routes: rs, NamespaceRoutes: nrs, Index: idx}
		// The two lists are one sequence, the routes first, under one budget.
		n, used := fit(rs, 0)
		m := 0
		if n == len(rs) {
			m, _ = fit(nrs, used)
		}
		resp.Routes, resp.NamespaceRoutes = rs[:n], nrs[:m]
		switch {
		case m > 0 && (m < len(nrs) || more):
			resp.NextPageToken = p.next(nrs[m-1].GetNamespace(), true)
		case m == 0 && n > 0 && (n < len(rs) || len(nrs) > 0 || more):
			resp.NextPageToken = p.next(rs[n-1].GetMailboxId(), false)
		}
		return resp, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ListRoutesResponse, error) {
		return adminv1.NewAdminClient(cc).ListRoutes(ctx, req)
	})
}

func (s *Server) GetRoute(ctx context.Context, req *adminv1.GetRouteRequest) (*adminv1.GetRouteResponse, error) {
	if _, err := mesh.ParseMailboxID(req.GetMailboxId()); err != nil {
		return nil, toStatus(err)
	}
	return read(s, ctx, "GetRoute", req.GetConsistency(), func() (*adminv1.GetRouteResponse, error) {
		r, idx := s.fsm.Route(req.GetMailboxId())
		if r == nil {
			return nil, notFound("route of mailbox", req.GetMailboxId())
		}
		return &adminv1.GetRouteResponse{Route: r, Index: idx}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetRouteResponse, error) {
		return adminv1.NewAdminClient(cc).GetRoute(ctx, req)
	})
}

// liveSession is sess with the leader's live expiry, read off one of its
// annotated leases (a session without leases shows its Raft expiry).
func liveSession(sess *adminv1.Session, leases []*adminv1.Lease) *adminv1.Session {
	if len(leases) == 0 {
		return sess
	}
	out := proto.CloneOf(sess)
	out.ExpiresAt = leases[0].GetExpiresAt()
	return out
}

func (s *Server) ListSessions(ctx context.Context, req *adminv1.ListSessionsRequest) (*adminv1.ListSessionsResponse, error) {
	if p := req.GetProxyId(); p != "" {
		if err := mesh.ValidateProxyID(p); err != nil {
			return nil, toStatus(err)
		}
	}
	p, err := pageOf("ListSessions", req.GetProxyId(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	var after uint64
	if p.tok.After != "" {
		if after, err = strconv.ParseUint(p.tok.After, 10, 64); err != nil {
			return nil, status.Error(codes.InvalidArgument, "page_token: malformed; pass a next_page_token as it came, or none for the first page")
		}
	}
	return read(s, ctx, "ListSessions", req.GetConsistency(), func() (*adminv1.ListSessionsResponse, error) {
		sessions, more, idx := s.fsm.SessionsPage(after, p.size, req.GetProxyId())
		for i, sess := range sessions {
			// The first lease is enough: they all carry their session's expiry.
			leases, _ := s.fsm.SessionLeases(sess.GetId())
			sessions[i] = liveSession(sess, s.annotate(leases[:min(1, len(leases))]))
		}
		resp := &adminv1.ListSessionsResponse{Index: idx}
		resp.Sessions, resp.NextPageToken = paged(p, sessions, more, func(sess *adminv1.Session) string {
			return strconv.FormatUint(sess.GetId(), 10)
		})
		return resp, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ListSessionsResponse, error) {
		return adminv1.NewAdminClient(cc).ListSessions(ctx, req)
	})
}

func (s *Server) GetSession(ctx context.Context, req *adminv1.GetSessionRequest) (*adminv1.GetSessionResponse, error) {
	if req.GetSessionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "session_id is required")
	}
	return read(s, ctx, "GetSession", req.GetConsistency(), func() (*adminv1.GetSessionResponse, error) {
		sess, idx := s.fsm.Session(req.GetSessionId())
		if sess == nil {
			return nil, notFound("session", strconv.FormatUint(req.GetSessionId(), 10))
		}
		leases, _ := s.fsm.SessionLeases(sess.GetId())
		leases = s.annotate(leases)
		return &adminv1.GetSessionResponse{Session: liveSession(sess, leases), Leases: leases, Index: idx}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetSessionResponse, error) {
		return adminv1.NewAdminClient(cc).GetSession(ctx, req)
	})
}

func (s *Server) AddVoter(ctx context.Context, req *adminv1.AddVoterRequest) (*adminv1.AddVoterResponse, error) {
	if err := mesh.ValidateID("id", req.GetId()); err != nil {
		return nil, toStatus(err)
	}
	if err := fsm.ValidateAddress("raft_address", req.GetRaftAddress()); err != nil {
		return nil, toStatus(err)
	}
	if req.GetGrpcAddress() != "" {
		if err := fsm.ValidateAddress("grpc_address", req.GetGrpcAddress()); err != nil {
			return nil, toStatus(err)
		}
	}
	resp, err := leaderCall(s, ctx, "AddVoter", func(ctx context.Context) (*adminv1.AddVoterResponse, error) {
		if err := s.admitAddVoter(ctx, req); err != nil {
			return nil, err
		}
		// The address is committed before the member joins, so no node can
		// see it lead without knowing where to forward to.
		if a := req.GetGrpcAddress(); a != "" {
			if _, err := s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_PutMembers{PutMembers: &adminv1.PutMembersCommand{
				Members: []*adminv1.MemberAddress{{Id: req.GetId(), GrpcAddress: a}},
			}}}); err != nil {
				return nil, err
			}
		}
		idx, err := s.node.AddVoter(ctx, req.GetId(), req.GetRaftAddress())
		if err != nil {
			return nil, err
		}
		return &adminv1.AddVoterResponse{Index: idx}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.AddVoterResponse, error) {
		return adminv1.NewAdminClient(cc).AddVoter(ctx, req)
	})
	return resp, toStatus(err)
}

func (s *Server) RemoveServer(ctx context.Context, req *adminv1.RemoveServerRequest) (*adminv1.RemoveServerResponse, error) {
	if err := mesh.ValidateID("id", req.GetId()); err != nil {
		return nil, toStatus(err)
	}
	resp, err := leaderCall(s, ctx, "RemoveServer", func(ctx context.Context) (*adminv1.RemoveServerResponse, error) {
		if err := s.admitRemoveServer(ctx, req.GetId(), req.GetForce()); err != nil {
			return nil, err
		}
		// The row goes first: a leader removing itself cannot commit after
		// it stepped down. If RemoveServer then fails, the others find the
		// member by their --peers until the client retries.
		if _, err := s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_RemoveMember{
			RemoveMember: &adminv1.RemoveMemberCommand{Id: req.GetId()},
		}}); err != nil {
			return nil, err
		}
		idx, err := s.node.RemoveServer(ctx, req.GetId())
		if err != nil {
			return nil, err
		}
		return &adminv1.RemoveServerResponse{Index: idx}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.RemoveServerResponse, error) {
		return adminv1.NewAdminClient(cc).RemoveServer(ctx, req)
	})
	return resp, toStatus(err)
}
