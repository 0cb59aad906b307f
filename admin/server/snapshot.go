package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// snapshotChunk is the most FSM snapshot bytes one SaveSnapshot message
// carries, well under gRPC's default 4 MiB receive limit.
const snapshotChunk = 1 << 20

// SaveSnapshot streams a copy of the leader's FSM taken after the ReadIndex
// barrier, so it holds every write acknowledged before the call. A follower
// relays the leader's stream (one hop, like leaderCall), and while no leader
// is known it waits within the caller's deadline or ForwardWait; a relay is
// retried only before its first message, as nothing has reached the client.
func (s *Server) SaveSnapshot(req *adminv1.SaveSnapshotRequest, stream adminv1.Admin_SaveSnapshotServer) error {
	// The wait for a leader is bounded; the transfer is not, beyond the
	// client's own deadline.
	ctx := stream.Context()
	wait, cancel := context.WithTimeout(ctx, s.cfg.ForwardWait)
	defer cancel()
	lastErr := errors.New("no leader known")
	for {
		l, changed := s.node.Leadership()
		switch {
		case l.IsLeader:
			err := s.node.ReadBarrier(wait, s.leader.Since)
			if err == nil {
				return s.sendSnapshot(stream)
			}
			if !errors.Is(err, raftnode.ErrNotLeader) {
				return toStatus(err)
			}
			lastErr = err
		case forwarded(ctx):
			return notLeaderError(l, s.grpcAddr(l.LeaderID))
		case l.LeaderID != "" && l.LeaderID != s.node.ID():
			sent, err := s.relaySnapshot(ctx, stream, l.LeaderID, req)
			if sent || !retryableForward(err) && status.Code(err) != codes.Unavailable {
				return err
			}
			lastErr = err
		}
		select {
		case <-wait.Done():
			return status.Errorf(codes.Unavailable, "SaveSnapshot: no leader reachable: %v", lastErr)
		case <-changed:
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (s *Server) sendSnapshot(stream adminv1.Admin_SaveSnapshotServer) error {
	info, data, err := backup.Capture(s.fsm, s.node, s.cfg.Clock.Now())
	if err != nil {
		return status.Errorf(codes.Internal, "capture snapshot: %v", err)
	}
	if err := stream.Send(&adminv1.SaveSnapshotResponse{Part: &adminv1.SaveSnapshotResponse_Info{Info: info}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), snapshotChunk)
		if err := stream.Send(&adminv1.SaveSnapshotResponse{Part: &adminv1.SaveSnapshotResponse_Chunk{Chunk: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	s.log.Info("snapshot saved by a client", "index", info.GetIndex(), "term", info.GetTerm(), "bytes", info.GetSize())
	return nil
}

// relaySnapshot copies the leader's SaveSnapshot stream to the client. sent
// says whether anything reached the client.
func (s *Server) relaySnapshot(ctx context.Context, stream adminv1.Admin_SaveSnapshotServer, leader string, req *adminv1.SaveSnapshotRequest) (sent bool, err error) {
	addr := s.grpcAddr(leader)
	if addr == "" {
		return false, status.Errorf(codes.Unavailable, "gRPC address of leader %s unknown", leader)
	}
	cc, err := s.pool.Get(addr)
	if err != nil {
		return false, status.Error(codes.Internal, err.Error())
	}
	out := forwardCaller(ctx, metadata.AppendToOutgoingContext(ctx, forwardedKey, s.node.ID()))
	rs, err := adminv1.NewAdminClient(cc).SaveSnapshot(out, req)
	if err != nil {
		return false, fmt.Errorf("forward to %s at %s: %w", leader, addr, err)
	}
	for {
		m, err := rs.Recv()
		if errors.Is(err, io.EOF) {
			return sent, nil
		}
		if err != nil {
			return sent, err
		}
		if err := stream.Send(m); err != nil {
			return true, err
		}
		sent = true
	}
}
