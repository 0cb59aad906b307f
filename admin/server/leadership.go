package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/prism-mesh/prism/admin/leadership"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// peer serves prism.admin.v1.Peer, the leader's leadership rounds.
type peer struct {
	adminv1.UnimplementedPeerServer
	s *Server
}

// Term answers this node's raft term as of the call, never a cached one:
// the leader's proof depends on the answer being younger than the question.
func (p peer) Term(context.Context, *adminv1.TermRequest) (*adminv1.TermResponse, error) {
	return &adminv1.TermResponse{NodeId: p.s.node.ID(), Term: p.s.node.Term()}, nil
}

// newLeadership builds the checker that gates every answer the leader gives
// from its own memory (renewals, linearizable reads).
func (s *Server) newLeadership() (*leadership.Checker, error) {
	return leadership.New(leadership.Config{
		Leading: s.node.LeaderTerm,
		Voters:  s.node.Voters,
		Ask:     s.askTerm,
		Lease:   s.cfg.LeaderLease,
		Logger:  s.log,
	})
}

// askTerm asks member id for its term over the admin gRPC channel.
func (s *Server) askTerm(ctx context.Context, id string) (uint64, error) {
	addr := s.grpcAddr(id)
	if addr == "" {
		return 0, errors.New("no admin gRPC address known")
	}
	cc, err := s.pool.Get(addr)
	if err != nil {
		return 0, err
	}
	term, _ := s.node.LeaderTerm()
	resp, err := adminv1.NewPeerClient(cc).Term(ctx, &adminv1.TermRequest{LeaderId: s.node.ID(), Term: term})
	if err != nil {
		return 0, fmt.Errorf("ask %s for its term: %w", addr, err)
	}
	return resp.GetTerm(), nil
}
