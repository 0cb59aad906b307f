package server

import (
	"cmp"
	"context"
	"slices"
	"strconv"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The operator's side of moves by handoff (admin/fsm/move.go; the leader's
// mover drives them on): MoveNamespace, CancelMove, CordonProxy and
// ListMoves on Admin, and the proxy's own drain, DrainProxy, on
// ControlPlane. The writes are forwarded to the leader like every write;
// the FSM refuses a move command that the state does not allow without
// changing anything, and the leader turns that refusal into a status here.

// MoveNamespace starts an operator's move of a namespace to a proxy.
func (s *Server) MoveNamespace(ctx context.Context, req *adminv1.MoveNamespaceRequest) (*adminv1.MoveNamespaceResponse, error) {
	if err := mesh.ValidateNamespaceName(req.GetNamespace()); err != nil {
		return nil, toStatus(err)
	}
	if err := mesh.ValidateProxyID(req.GetToProxyId()); err != nil {
		return nil, toStatus(err)
	}
	cmd := &adminv1.Command{Body: &adminv1.Command_StartMove{StartMove: &adminv1.StartMoveCommand{
		Namespace: req.GetNamespace(), ToProxyId: req.GetToProxyId(), Reason: adminv1.MoveReason_MOVE_REASON_OPERATOR,
	}}}
	resp, err := writeAs(s, ctx, "MoveNamespace", cmd, true, func(res any, index uint64) (*adminv1.MoveNamespaceResponse, error) {
		n, err := s.moveAnswer("move", res, req.GetNamespace(), req.GetToProxyId())
		if err != nil {
			return nil, err
		}
		return &adminv1.MoveNamespaceResponse{Namespace: n, Index: index}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.MoveNamespaceResponse, error) {
		return adminv1.NewAdminClient(cc).MoveNamespace(ctx, req)
	})
	if err == nil {
		s.audit(ctx, "namespace move started", "namespace", req.GetNamespace(), "to", req.GetToProxyId(), "index", resp.GetIndex())
	}
	return resp, err
}

// CancelMove abandons the namespace's move in progress, whoever started it.
func (s *Server) CancelMove(ctx context.Context, req *adminv1.CancelMoveRequest) (*adminv1.CancelMoveResponse, error) {
	if err := mesh.ValidateNamespaceName(req.GetNamespace()); err != nil {
		return nil, toStatus(err)
	}
	cmd := &adminv1.Command{Body: &adminv1.Command_AbandonMove{AbandonMove: &adminv1.AbandonMoveCommand{
		Namespace: req.GetNamespace(), Reason: adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_CANCELLED,
	}}}
	resp, err := writeAs(s, ctx, "CancelMove", cmd, true, func(res any, index uint64) (*adminv1.CancelMoveResponse, error) {
		n, err := s.moveAnswer("cancel the move of", res, req.GetNamespace(), "")
		if err != nil {
			return nil, err
		}
		return &adminv1.CancelMoveResponse{Namespace: n, Index: index}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CancelMoveResponse, error) {
		return adminv1.NewAdminClient(cc).CancelMove(ctx, req)
	})
	if err == nil {
		s.audit(ctx, "namespace move cancelled", "namespace", req.GetNamespace(), "index", resp.GetIndex())
	}
	return resp, err
}

// moveAnswer is the namespace after an applied move command, or the
// refusal as a status: NOT_FOUND for a namespace or proxy that does not
// exist, FAILED_PRECONDITION with the FSM's reason for anything else.
func (s *Server) moveAnswer(what string, res any, namespace, proxy string) (*adminv1.Namespace, error) {
	r, ok := res.(*fsm.MoveResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "%s %s: fsm answered %T", what, namespace, res)
	}
	n, _, _ := s.fsm.Namespace(namespace)
	switch {
	case r.Applied:
		return n, nil
	case n == nil:
		return nil, notFound("namespace", namespace)
	case proxy != "":
		if p, _ := s.fsm.Proxy(proxy); p == nil {
			return nil, status.Errorf(codes.NotFound, "proxy %q not found (not registered)", proxy)
		}
	case n.GetIncomingProxyId() == "" && n.GetHandoffProxyId() != "":
		return nil, status.Errorf(codes.FailedPrecondition, "cannot %s %s: it has already switched to %s; %s hands it off until %s",
			what, namespace, n.GetAssignedProxyId(), n.GetHandoffProxyId(), n.GetHandoffUntil().AsTime().UTC().Format("15:04:05.000Z"))
	}
	return nil, status.Errorf(codes.FailedPrecondition, "cannot %s %s: %s", what, namespace, r.Refused)
}

// CordonProxy sets or clears an operator's cordon; setting what is set
// succeeds with changed=false, so a retry is harmless.
func (s *Server) CordonProxy(ctx context.Context, req *adminv1.CordonProxyRequest) (*adminv1.CordonProxyResponse, error) {
	if err := mesh.ValidateProxyID(req.GetProxyId()); err != nil {
		return nil, toStatus(err)
	}
	cmd := &adminv1.Command{Body: &adminv1.Command_CordonProxy{CordonProxy: &adminv1.CordonProxyCommand{
		ProxyId: req.GetProxyId(), Cordoned: req.GetCordoned(),
	}}}
	resp, err := writeAs(s, ctx, "CordonProxy", cmd, true, func(res any, index uint64) (*adminv1.CordonProxyResponse, error) {
		r, ok := res.(*fsm.MoveResult)
		if !ok {
			return nil, status.Errorf(codes.Internal, "cordon %s: fsm answered %T", req.GetProxyId(), res)
		}
		p, _ := s.fsm.Proxy(req.GetProxyId())
		return &adminv1.CordonProxyResponse{Proxy: p.GetProxy(), Changed: r.Applied, Index: index}, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CordonProxyResponse, error) {
		return adminv1.NewAdminClient(cc).CordonProxy(ctx, req)
	})
	if err == nil && resp.GetChanged() {
		s.audit(ctx, "proxy cordon set", "proxy_id", req.GetProxyId(), "cordoned", req.GetCordoned(), "index", resp.GetIndex())
	}
	return resp, err
}

// audit logs an operator's write with who made it, once: on the node the
// operator called, not again on the leader it forwarded to.
func (s *Server) audit(ctx context.Context, msg string, args ...any) {
	if forwarded(ctx) {
		return
	}
	caller, _ := identity.Caller(ctx)
	s.log.Info(msg, append(args, "principal", caller.String())...)
}

// ListMoves answers on the leader after the ReadIndex barrier: the lag
// reports the switch is judged on live in the leader's memory only.
func (s *Server) ListMoves(ctx context.Context, req *adminv1.ListMovesRequest) (*adminv1.ListMovesResponse, error) {
	p, err := pageOf("ListMoves", "", req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp, err := leaderCall(s, ctx, "ListMoves", func(ctx context.Context) (*adminv1.ListMovesResponse, error) {
		if err := s.node.ReadBarrier(ctx, s.leader.Since); err != nil {
			return nil, err
		}
		resp := s.listMoves()
		// Moves are few (the leader's limit and the handoff tails), so the
		// page is cut from all of them.
		i, _ := slices.BinarySearchFunc(resp.Moves, p.tok.After, func(m *adminv1.NamespaceMove, after string) int {
			return cmp.Compare(listedMoveKey(m), after)
		})
		if i < len(resp.Moves) && listedMoveKey(resp.Moves[i]) == p.tok.After {
			i++
		}
		moves := resp.Moves[i:]
		more := len(moves) > p.size
		resp.Moves, resp.NextPageToken = paged(p, moves[:min(len(moves), p.size)], more, listedMoveKey)
		return resp, nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.ListMovesResponse, error) {
		return adminv1.NewAdminClient(cc).ListMoves(ctx, req)
	})
	return resp, toStatus(err)
}

// listedMoveKey is a move's key, its order in ListMoves: by namespace, then
// state (catching up before handing off). Names hold no NUL, so the
// strings sort as the pairs do.
func listedMoveKey(m *adminv1.NamespaceMove) string {
	return m.GetNamespace() + "\x00" + strconv.Itoa(int(m.GetState()))
}

// listMoves is every move and handoff tail in the local FSM, with the
// destination's lag from a heartbeat after the move began.
func (s *Server) listMoves() *adminv1.ListMovesResponse {
	moves, index := s.fsm.Moves()
	pending, _ := s.fsm.PendingMoves()
	resp := &adminv1.ListMovesResponse{Pending: uint32(pending), Index: index}
	for _, m := range moves {
		n := m.Namespace
		mv := &adminv1.NamespaceMove{
			Namespace: n.GetName(), FromProxyId: m.From, ToProxyId: m.To,
			StartedAt: n.GetMoveStartedAt(), Reason: n.GetMoveReason(), MoveIndex: n.GetMoveIndex(),
			State: adminv1.MoveState_MOVE_STATE_CATCHING_UP,
		}
		if m.Role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF {
			mv.State, mv.SwitchedAt, mv.HandoffUntil = adminv1.MoveState_MOVE_STATE_HANDING_OFF, n.GetSwitchedAt(), n.GetHandoffUntil()
		}
		if r := s.lag.get(m.To, n.GetName()); r.available && r.index > n.GetMoveIndex() {
			mv.Lag, mv.LagKnown = r.lag, r.lagKnown
		}
		mv.Recovery = s.fsm.Health(m.To, n.GetName()).GetRecovery()
		resp.Moves = append(resp.Moves, mv)
	}
	return resp
}

// DrainProxy is the proxy's own drain (its pod is stopping). It is an
// essential write: a pod's stop should not wait behind the leader's load.
func (s *Server) DrainProxy(ctx context.Context, req *adminv1.DrainProxyRequest) (*adminv1.DrainProxyResponse, error) {
	resp, err := write(s, ctx, "DrainProxy",
		&adminv1.Command{Body: &adminv1.Command_DrainProxy{DrainProxy: req}}, false,
		func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.DrainProxyResponse, error) {
			return adminv1.NewControlPlaneClient(cc).DrainProxy(ctx, req)
		})
	if err == nil && resp.GetDrained() && !forwarded(ctx) {
		s.log.Info("proxy draining itself", "proxy_id", req.GetProxyId(), "instance", req.GetInstance(), "index", resp.GetIndex())
	}
	return resp, err
}
