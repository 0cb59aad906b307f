package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// A node started with --bootstrap-expect N that is not among the first N of
// --peers and has an empty data dir joins the running cluster by itself,
// as Consul's retry_join or the Bitnami etcd chart's self member-add do: it
// asks any member (Peer.Join, forwarded to the leader) to add it. The
// leader adds it as a non-voter, so it takes the log (or a snapshot)
// without counting for a quorum; the node asks again once it applied what
// the leader had committed, and the leader makes it a voter when it is at
// most joinMaxLag entries behind, after the quorum check member add passes
// (reconfig.go). Until it is a voter the node is not ready.

// joinMaxLag is how far behind the leader's commit index a non-voter may be
// when it is made a voter: a few round trips of writes, so that it counts
// for a quorum only once it can acknowledge new entries at once.
const joinMaxLag = 1024

// Retry timing of a node asking to join: the cluster may not have a leader
// yet, or be another new node that is still joining itself. Asking again is
// safe (the leader looks at the configuration first), so one ask is cut
// short rather than wait on a member whose connection is still being set
// up while another could answer.
const (
	joinFirstRetry = 100 * time.Millisecond
	joinMaxRetry   = 5 * time.Second
	joinCallWait   = 3 * time.Second
)

// joinRule lets only admin/<id> ask for id to be made a member: a node
// asks for itself, never for another.
func joinRule(caller identity.Identity, req any) error {
	r, ok := req.(*adminv1.JoinRequest)
	if !ok {
		return identity.Deny(caller, "unexpected request %T", req)
	}
	if caller.Role != identity.Admin || caller.Name != r.GetId() {
		return identity.Deny(caller, "only admin/%s may ask for %q to join", r.GetId(), r.GetId())
	}
	return nil
}

// Join makes the calling node a member on the leader (peer.Join).
func (p peer) Join(ctx context.Context, req *adminv1.JoinRequest) (*adminv1.JoinResponse, error) {
	s := p.s
	if err := mesh.ValidateID("id", req.GetId()); err != nil {
		return nil, toStatus(err)
	}
	if err := fsm.ValidateAddress("raft_address", req.GetRaftAddress()); err != nil {
		return nil, toStatus(err)
	}
	if err := fsm.ValidateAddress("grpc_address", req.GetGrpcAddress()); err != nil {
		return nil, toStatus(err)
	}
	resp, err := leaderCall(s, ctx, "Join", func(ctx context.Context) (*adminv1.JoinResponse, error) {
		return s.join(ctx, req)
	}, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.JoinResponse, error) {
		return adminv1.NewPeerClient(cc).Join(ctx, req)
	})
	return resp, toStatus(err)
}

// join is Join on the leader.
func (s *Server) join(ctx context.Context, req *adminv1.JoinRequest) (*adminv1.JoinResponse, error) {
	members, err := s.node.Members()
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(members, func(m raftnode.Member) bool { return m.ID == req.GetId() })
	commit := s.node.CommitIndex()
	switch {
	case i >= 0 && members[i].Voter:
		// An answer lost on its way back: the node is a voter already.
		return &adminv1.JoinResponse{Voter: true, CommitIndex: commit}, nil
	case i >= 0:
		if req.GetAppliedIndex()+joinMaxLag < commit {
			return &adminv1.JoinResponse{CommitIndex: commit}, nil
		}
		add := &adminv1.AddVoterRequest{Id: req.GetId(), RaftAddress: req.GetRaftAddress(), GrpcAddress: req.GetGrpcAddress()}
		if err := s.admitAddVoter(ctx, add); err != nil {
			return nil, err
		}
		idx, err := s.node.AddVoter(ctx, req.GetId(), req.GetRaftAddress())
		if err != nil {
			return nil, err
		}
		s.log.Info("joining node made a voter", "peer", req.GetId(), "applied_index", req.GetAppliedIndex(), "commit_index", commit)
		return &adminv1.JoinResponse{Voter: true, CommitIndex: idx}, nil
	}
	// The address is committed before the member joins, as AddVoter does:
	// no node can see it lead without knowing where to forward to.
	if _, err := s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_PutMembers{PutMembers: &adminv1.PutMembersCommand{
		Members: []*adminv1.MemberAddress{{Id: req.GetId(), GrpcAddress: req.GetGrpcAddress()}},
	}}}); err != nil {
		return nil, err
	}
	idx, err := s.node.AddNonvoter(ctx, req.GetId(), req.GetRaftAddress())
	if err != nil {
		return nil, err
	}
	return &adminv1.JoinResponse{CommitIndex: idx}, nil
}

// notReady says why the node cannot serve yet, "" when it can: it must
// know a leader and be a voter, which a joining node is only at the end.
func (s *Server) notReady() string {
	l, _ := s.node.Leadership()
	if l.LeaderID == "" {
		return "no raft leader known"
	}
	if sf, err := s.node.Suffrage(); err != nil || sf != raftnode.Voter {
		return "not a voter yet: joining the cluster"
	}
	return ""
}

// Join asks the running cluster to make this node a voter, retrying with
// backoff until it is one or ctx ends. raftAddr is this node's raft address
// as the others dial it (its --peers entry). A node that started with raft
// state returns at once unless it is a non-voter, one whose join stopped
// halfway: one that is not a member was removed and must not add itself
// back.
func (n *Node) Join(ctx context.Context, raftAddr string) error {
	s, id := n.Server, n.Raft.ID()
	if sf, err := n.Raft.Suffrage(); err != nil || sf == raftnode.Voter || (!n.Raft.StartedEmpty() && sf != raftnode.Nonvoter) {
		return err
	}
	// The members --peers names, in the order of their ids.
	var others []string
	s.mu.Lock()
	ids := slices.Sorted(maps.Keys(s.addrs))
	for _, pid := range ids {
		if pid != id {
			others = append(others, s.addrs[pid])
		}
	}
	s.mu.Unlock()
	if len(others) == 0 {
		return errors.New("join: no other member's gRPC address known")
	}
	req := &adminv1.JoinRequest{Id: id, RaftAddress: raftAddr, GrpcAddress: s.grpcAddr(id)}
	log := s.log.With("raft_addr", raftAddr)
	log.Info("joining the cluster")
	var (
		wait   = joinFirstRetry
		target uint64
		next   int
		tries  int
	)
	for {
		if err := n.awaitApplied(ctx, target); err != nil {
			return err
		}
		addr := others[next%len(others)]
		req.AppliedIndex = n.Raft.AppliedIndex()
		resp, err := n.askJoin(ctx, addr, req)
		switch {
		case err == nil && resp.GetVoter():
			log.Info("joined the cluster as a voter", "via", addr, "applied_index", req.AppliedIndex)
			return nil
		case err == nil:
			wait, target = joinFirstRetry, resp.GetCommitIndex()
			log.Debug("a non-voter, catching up", "via", addr, "applied_index", req.AppliedIndex, "commit_index", target)
			continue
		case status.Code(err) == codes.PermissionDenied || status.Code(err) == codes.InvalidArgument:
			// Retrying the same request cannot help: wrong identity or flags.
			return fmt.Errorf("join via %s: %w", addr, err)
		}
		tries++
		level := log.Debug
		if tries%10 == 0 {
			level = log.Warn
		}
		level("join refused or unanswered, retrying", "via", addr, "tries", tries, "err", err)
		next++
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, joinMaxRetry)
	}
}

func (n *Node) askJoin(ctx context.Context, addr string, req *adminv1.JoinRequest) (*adminv1.JoinResponse, error) {
	cc, err := n.Server.pool.Get(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, joinCallWait)
	defer cancel()
	return adminv1.NewPeerClient(cc).Join(ctx, req)
}

// awaitApplied waits until this node applied index, or ctx ends.
func (n *Node) awaitApplied(ctx context.Context, index uint64) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n.Raft.AppliedIndex() < index {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
