package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// memberProbeTimeout bounds how long the leader waits for a member's Term
// answer when judging whether it is healthy before a membership change. A
// stopped node refuses the connection at once; this is for one that hangs.
const memberProbeTimeout = time.Second

// Membership changes follow etcd's --strict-reconfig-check, which the admin
// always applies: a change is refused FAILED_PRECONDITION when the voters of
// the new configuration would not hold a quorum of healthy ones, since
// raft counts the new configuration for commitment as soon as it is
// appended and a cluster without a quorum commits nothing more (not even
// the change that would undo it). Healthy is the leader's view taken now:
// itself, and every voter that answers its Term call within
// memberProbeTimeout in no later term. Unlike etcd, which counts a member
// being added as not started (it is started after `member add`), a voter
// being added counts when it answers at its gRPC address as that node id: a
// Prism node is started with --join before `prismctl member add`, so adding
// a second node to a single node works as documented, while adding a node
// that does not exist (the way to take a quorum away) does not. force skips
// the check, for an operator repairing a cluster that already lost nodes.

// admitAddVoter checks adding req's voter. Adding a voter that already is
// one at the same address changes nothing and is always admitted.
func (s *Server) admitAddVoter(ctx context.Context, req *adminv1.AddVoterRequest) error {
	members, err := s.node.Members()
	if err != nil {
		return err
	}
	var others []string
	for _, m := range members {
		switch {
		case m.ID == req.GetId() && m.Voter && m.Addr == req.GetRaftAddress():
			return nil
		case m.ID == req.GetId() || !m.Voter:
		default:
			others = append(others, m.ID)
		}
	}
	if req.GetForce() {
		s.forced(ctx, "add voter", req.GetId())
		return nil
	}
	up, down := s.probeVoters(ctx, others)
	if s.answersAs(ctx, req.GetId(), req.GetGrpcAddress()) {
		up = append(up, req.GetId())
	} else {
		down = append(down, req.GetId())
	}
	if need := (len(others)+1)/2 + 1; len(up) < need {
		return s.refuseReconfig("add voter", req.GetId(), up, down, need,
			"start it with --join first: it counts once it answers at its gRPC address")
	}
	return nil
}

// admitRemoveServer checks removing voter id. A non-member or non-voter
// leaves the voters as they are and is always admitted.
func (s *Server) admitRemoveServer(ctx context.Context, id string, force bool) error {
	members, err := s.node.Members()
	if err != nil {
		return err
	}
	var rest []string
	found := false
	for _, m := range members {
		switch {
		case m.ID == id:
			found = m.Voter
		case m.Voter:
			rest = append(rest, m.ID)
		}
	}
	if !found {
		return nil
	}
	if force {
		s.forced(ctx, "remove server", id)
		return nil
	}
	up, down := s.probeVoters(ctx, rest)
	if need := len(rest)/2 + 1; len(up) < need {
		return s.refuseReconfig("remove server", id, up, down, need,
			"bring the unhealthy voters back (or remove those first)")
	}
	return nil
}

// probeVoters splits ids into the healthy and the rest: this node is
// healthy, every other one must answer Term now, in no later term than
// this node's.
func (s *Server) probeVoters(ctx context.Context, ids []string) (up, down []string) {
	ctx, cancel := context.WithTimeout(ctx, memberProbeTimeout)
	defer cancel()
	term, _ := s.node.LeaderTerm()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, id := range ids {
		if id == s.node.ID() {
			// Probes started for earlier ids append beside this one.
			mu.Lock()
			up = append(up, id)
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t, err := s.askTerm(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err == nil && t <= term {
				up = append(up, id)
			} else {
				down = append(down, id)
			}
		}()
	}
	wg.Wait()
	slices.Sort(up)
	slices.Sort(down)
	return up, down
}

// answersAs reports whether the admin node at addr answers Term now as
// node id.
func (s *Server) answersAs(ctx context.Context, id, addr string) bool {
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, memberProbeTimeout)
	defer cancel()
	cc, err := s.pool.Get(addr)
	if err != nil {
		return false
	}
	term, _ := s.node.LeaderTerm()
	resp, err := adminv1.NewPeerClient(cc).Term(ctx, &adminv1.TermRequest{LeaderId: s.node.ID(), Term: term})
	return err == nil && resp.GetNodeId() == id
}

func (s *Server) refuseReconfig(what, id string, up, down []string, need int, hint string) error {
	s.log.Warn("membership change refused: it would leave no quorum of healthy voters",
		"change", what, "peer", id, "healthy", up, "unhealthy", down, "need", need)
	return status.Errorf(codes.FailedPrecondition,
		"%s %s: the new configuration would have %d voters, %d healthy now (%s), and a quorum needs %d; not answering: %s; %s, or force it (prismctl member --force)",
		what, id, len(up)+len(down), len(up), names(up), need, names(down), hint)
}

func names(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

func (s *Server) forced(ctx context.Context, what, id string) {
	caller, _ := identity.Caller(ctx)
	s.log.Warn("membership change forced past the quorum check", "change", what, "peer", id, "principal", caller.String())
}
