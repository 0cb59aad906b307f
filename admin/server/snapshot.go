package server

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
// relays the leader's stream (one hop, untilLeader like leaderCall), and
// while no leader is known it waits within the caller's deadline or
// ForwardWait; a relay is retried only before its first message, as nothing
// has reached the client. The wait for a leader is bounded; the transfer is
// not, beyond the client's own deadline.
func (s *Server) SaveSnapshot(req *adminv1.SaveSnapshotRequest, stream adminv1.Admin_SaveSnapshotServer) error {
	ctx := stream.Context()
	wait, cancel := context.WithTimeout(ctx, s.cfg.ForwardWait)
	defer cancel()
	return s.untilLeader(ctx, wait, "SaveSnapshot", func() (bool, error) {
		err := s.node.ReadBarrier(wait, s.leader.Since)
		switch {
		case err == nil:
			return true, s.sendSnapshot(stream)
		case errors.Is(err, raftnode.ErrNotLeader):
			return false, err
		}
		return true, toStatus(err)
	}, func(out context.Context, cc *grpc.ClientConn) (bool, error) {
		sent, err := relaySnapshot(out, cc, stream, req)
		return sent || !retryableForward(err) && status.Code(err) != codes.Unavailable, err
	})
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

// relaySnapshot copies the leader's SaveSnapshot stream, called on cc, to
// the client. sent says whether anything reached the client.
func relaySnapshot(out context.Context, cc *grpc.ClientConn, stream adminv1.Admin_SaveSnapshotServer, req *adminv1.SaveSnapshotRequest) (sent bool, err error) {
	rs, err := adminv1.NewAdminClient(cc).SaveSnapshot(out, req)
	if err != nil {
		return false, err
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
