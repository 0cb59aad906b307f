package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/testproc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// unavailableLeader answers every acquire as a leader that lost its
// leadership after appending: the call reached it and may have applied.
type unavailableLeader struct {
	adminv1.UnimplementedControlPlaneServer
}

func (unavailableLeader) AcquireLease(context.Context, *adminv1.AcquireLeaseRequest) (*adminv1.AcquireLeaseResponse, error) {
	return nil, toStatus(raftnode.ErrLeadershipLost)
}

// forwardTo makes one forward, as leaderCall does, over a connection that
// records whether the call was sent, and returns its error.
func forwardTo(t *testing.T, addr string) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), client.TrackSent())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = adminv1.NewControlPlaneClient(cc).AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r"})
	return err
}

// A follower may re-issue a forwarded write only when the leader certainly
// did not run it; otherwise a write could apply twice and the client would
// see the second outcome.
func TestRetryableForward(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	adminv1.RegisterControlPlaneServer(g, unavailableLeader{})
	go g.Serve(lis)
	t.Cleanup(g.Stop)

	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"leader refused: not leader", notLeaderError(raftnode.Leadership{LeaderID: "b"}, "127.0.0.1:1"), true},
		{"never connected", forwardTo(t, testproc.FreeAddr(t)), true},
		{"reached the leader, which answered Unavailable", forwardTo(t, lis.Addr().String()), false},
		// Text is not evidence: only the connection's own record is.
		{"dial-failure text without the record", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), false},
		{"connection lost mid-call", status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{"leadership lost after append", toStatus(raftnode.ErrLeadershipLost), false},
		{"deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
		{"answer", nil, false},
	}
	for _, tc := range cases {
		if got := retryableForward(tc.err); got != tc.want {
			t.Errorf("%s: retryable = %v (err %v), want %v", tc.name, got, tc.err, tc.want)
		}
	}
}
