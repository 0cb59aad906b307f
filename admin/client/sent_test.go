package client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/testproc"
)

func TestRetried(t *testing.T) {
	t.Parallel()
	notSent := func(code codes.Code) error { return &callError{sent: false, err: status.Error(code, "x")} }
	sent := func(code codes.Code) error { return &callError{sent: true, err: status.Error(code, "x")} }
	notLeader := mesh.RefusalError(&adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER})
	expired := mesh.RefusalError(&adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED})
	cases := []struct {
		name       string
		err        error
		idempotent bool
		once       bool
	}{
		{"not sent, timed out while connecting", notSent(codes.DeadlineExceeded), true, true},
		{"not sent, unavailable", notSent(codes.Unavailable), true, true},
		{"Unavailable", sent(codes.Unavailable), true, true},
		{"NOT_LEADER refusal", notLeader, true, true},
		{"sent, timed out", sent(codes.DeadlineExceeded), true, false},
		{"ResourceExhausted", status.Error(codes.ResourceExhausted, "x"), true, false},
		{"Aborted", status.Error(codes.Aborted, "x"), true, false},
		{"Unknown", status.Error(codes.Unknown, "x"), true, false},
		{"Canceled by the node", status.Error(codes.Canceled, "x"), true, false},
		{"EXPIRED refusal", expired, false, false},
		{"NotFound", status.Error(codes.NotFound, "x"), false, false},
		{"InvalidArgument", status.Error(codes.InvalidArgument, "x"), false, false},
		{"AlreadyExists", status.Error(codes.AlreadyExists, "x"), false, false},
		{"FailedPrecondition", status.Error(codes.FailedPrecondition, "x"), false, false},
		{"Internal", status.Error(codes.Internal, "x"), false, false},
		{"Unimplemented", status.Error(codes.Unimplemented, "x"), false, false},
		{"PermissionDenied", status.Error(codes.PermissionDenied, "x"), false, false},
	}
	for _, tc := range cases {
		if got := retried(tc.err, Idempotent); got != tc.idempotent {
			t.Errorf("%s, idempotent call: retried %v, want %v", tc.name, got, tc.idempotent)
		}
		if got := retried(tc.err, Once); got != tc.once {
			t.Errorf("%s, call that must not run twice: retried %v, want %v", tc.name, got, tc.once)
		}
	}
}

// NotSent holds only for calls that gRPC never put on a connection.
func TestNotSent(t *testing.T) {
	t.Parallel()
	answers := startNode(t, fails(codes.Unavailable))
	stopped := make(chan struct{})
	dropsMidCall := startNode(t, func(ctx context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
		close(stopped)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	// A listener that accepts and hangs up: TCP connects, HTTP/2 never does.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	cases := []struct {
		name    string
		addr    string
		notSent bool
		during  func(*grpc.ClientConn)
	}{
		{"nothing listens", testproc.FreeAddr(t), true, nil},
		{"connection refused at the handshake", lis.Addr().String(), true, nil},
		{"the node answered Unavailable", answers.addr, false, nil},
		{"the connection closed mid-call", dropsMidCall.addr, false, func(cc *grpc.ClientConn) {
			<-stopped
			cc.Close()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc, err := grpc.NewClient(tc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), TrackSent())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			if tc.during != nil {
				go tc.during(cc)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = heartbeat(ctx, cc)
			if err == nil {
				t.Fatal("call succeeded")
			}
			if got := NotSent(err); got != tc.notSent {
				t.Fatalf("NotSent(%v) = %v, want %v", err, got, tc.notSent)
			}
			if st, ok := status.FromError(err); !ok || st.Message() != status.Convert(errors.Unwrap(err)).Message() {
				t.Fatalf("status of %v changed by the marking", err)
			}
		})
	}
}
