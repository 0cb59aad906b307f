package server

import (
	"context"
	"fmt"

	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/admin/raftnode"
)

// renewalWait is what a renewal waits for between its receipt and the
// lessor: the quorum's confirmation that this node still leads, taken after
// the arrival.
func (s *Server) renewalWait(ctx context.Context, rc *lease.Receipt) error {
	if h := s.hooks.renewalReceived.Load(); h != nil {
		(*h)(rc)
	}
	if err := s.leader.Lease(ctx); err != nil {
		s.metrics.leaderUnconfirmed.Inc()
		return fmt.Errorf("%w: %v", raftnode.ErrNotLeader, err)
	}
	return nil
}
