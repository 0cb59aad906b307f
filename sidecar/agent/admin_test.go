package agent

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/testproc"
)

// node is one admin node answering heartbeats by script.
type node struct {
	adminv1.UnimplementedControlPlaneServer
	addr   string
	calls  atomic.Int32
	answer func() (*adminv1.MailboxHeartbeatResponse, error)
}

func (n *node) MailboxHeartbeat(context.Context, *adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
	n.calls.Add(1)
	return n.answer()
}

func startNode(t *testing.T, answer func() (*adminv1.MailboxHeartbeatResponse, error)) *node {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{addr: lis.Addr().String(), answer: answer}
	s := grpc.NewServer()
	adminv1.RegisterControlPlaneServer(s, n)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return n
}

func TestEndpointsFailover(t *testing.T) {
	t.Parallel()
	ok := func() (*adminv1.MailboxHeartbeatResponse, error) {
		return &adminv1.MailboxHeartbeatResponse{Renewed: true}, nil
	}
	leader := startNode(t, ok)
	bystander := startNode(t, ok)
	follower := startNode(t, func() (*adminv1.MailboxHeartbeatResponse, error) {
		return nil, mesh.RefusalError(&adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, LeaderAddress: leader.addr})
	})
	refusing := startNode(t, func() (*adminv1.MailboxHeartbeatResponse, error) {
		return nil, mesh.RefusalError(&adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED})
	})
	dead := testproc.FreeAddr(t)
	req := &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r"}
	ctx := context.Background()

	t.Run("NOT_LEADER goes to the named leader, skipping others", func(t *testing.T) {
		e, err := DialEndpoints([]string{follower.addr, bystander.addr, leader.addr}, 5*time.Second, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		resp, err := e.MailboxHeartbeat(ctx, req)
		if err != nil || !resp.GetRenewed() {
			t.Fatalf("heartbeat: %v %v", resp, err)
		}
		if bystander.calls.Load() != 0 || leader.calls.Load() != 1 {
			t.Fatalf("calls: bystander %d, leader %d", bystander.calls.Load(), leader.calls.Load())
		}
		before := follower.calls.Load()
		if _, err := e.MailboxHeartbeat(ctx, req); err != nil {
			t.Fatal(err)
		}
		if follower.calls.Load() != before || leader.calls.Load() != 2 {
			t.Fatal("second call did not go straight to the node that answered")
		}
	})
	t.Run("an in-band NOT_LEADER goes to the named leader too", func(t *testing.T) {
		inBand := startNode(t, func() (*adminv1.MailboxHeartbeatResponse, error) {
			return &adminv1.MailboxHeartbeatResponse{Refusal: &adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, LeaderAddress: leader.addr}}, nil
		})
		e, err := DialEndpoints([]string{inBand.addr, bystander.addr, leader.addr}, 5*time.Second, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		before, bystanderBefore := leader.calls.Load(), bystander.calls.Load()
		resp, err := e.MailboxHeartbeat(ctx, req)
		if err != nil || !resp.GetRenewed() {
			t.Fatalf("heartbeat: %v %v", resp, err)
		}
		if inBand.calls.Load() != 1 || leader.calls.Load() != before+1 || bystander.calls.Load() != bystanderBefore {
			t.Fatalf("calls: in-band %d, leader %d→%d, bystander %d→%d", inBand.calls.Load(), before, leader.calls.Load(), bystanderBefore, bystander.calls.Load())
		}
	})
	t.Run("unreachable node is skipped", func(t *testing.T) {
		e, err := DialEndpoints([]string{dead, bystander.addr}, 5*time.Second, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if _, err := e.MailboxHeartbeat(ctx, req); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
	})
	t.Run("a real refusal is returned, not retried elsewhere", func(t *testing.T) {
		e, err := DialEndpoints([]string{refusing.addr, bystander.addr}, 5*time.Second, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		before := bystander.calls.Load()
		_, err = e.MailboxHeartbeat(ctx, req)
		if r, ok := mesh.RefusalFrom(err); !ok || r.GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED {
			t.Fatalf("err %v, want the EXPIRED refusal", err)
		}
		if status.Code(err) != codes.FailedPrecondition || bystander.calls.Load() != before {
			t.Fatalf("code %v, bystander calls %d→%d", status.Code(err), before, bystander.calls.Load())
		}
	})
	t.Run("all down is an error naming each", func(t *testing.T) {
		e, err := DialEndpoints([]string{dead, testproc.FreeAddr(t)}, 2*time.Second, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if _, err := e.MailboxHeartbeat(ctx, req); err == nil || status.Code(err) != codes.Unavailable {
			t.Fatalf("err %v, want Unavailable", err)
		}
	})
}
