package server

import (
	"testing"

	"github.com/prism-mesh/prism/admin/raftnode"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A follower may re-issue a forwarded write only when the leader certainly
// did not run it; otherwise a write could apply twice and the client would
// see the second outcome.
func TestRetryableForward(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"leader refused: not leader", notLeaderError(raftnode.Leadership{LeaderID: "b"}, "127.0.0.1:1"), true},
		{"never connected", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), true},
		{"connection lost mid-call", status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{"leadership lost after append", toStatus(raftnode.ErrLeadershipLost), false},
		{"deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
		{"answer", nil, false},
	}
	for _, tc := range cases {
		if got := retryableForward(tc.err); got != tc.want {
			t.Errorf("%s: retryable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
