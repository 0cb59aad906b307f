package control

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mailbox/runner"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// TestOpenWithRecoverFrom: the source an OpenMailbox names reaches the runner when the mailbox is activated (a
// later open may name it, as the placement does once it knows the move's source), a malformed one is refused,
// and the mailbox's recovery is in its status.
func TestOpenWithRecoverFrom(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	for _, bad := range []*runnerv1.RecoverySource{
		{MailboxId: "", Address: "q:1"},
		{MailboxId: "audit@p1", Address: "q:1"},
		{MailboxId: "audit@p0"},
	} {
		_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg, RecoverFrom: bad})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("recover_from %v: %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	src := &runnerv1.RecoverySource{MailboxId: "audit@p0", Address: "10.0.0.1:9000"}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg, RecoverFrom: src}); err != nil {
		t.Fatal(err)
	}
	h.recovery["audit@p1"] = runner.RecoveryStatus{State: runner.RecoveryCopying, Source: "audit@p0", Bytes: 10, Started: time.Unix(5, 0)}
	resp, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "audit@p1", Epoch: 3, ValidFor: vf})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.open["audit@p1"].Recover; got == nil || *got != (runner.RecoverySource{MailboxID: "audit@p0", Address: "10.0.0.1:9000"}) {
		t.Fatalf("runner opened with recovery source %+v", got)
	}
	rs := resp.GetStatus().GetRecovery()
	if rs.GetState() != runnerv1.RecoveryState_RECOVERY_STATE_COPYING || rs.GetSourceMailboxId() != "audit@p0" ||
		rs.GetBytesCopied() != 10 || rs.GetStartedAt().AsTime() != time.Unix(5, 0).UTC() || rs.GetHistoryComplete() {
		t.Fatalf("recovery status %v", rs)
	}
	// The source's runner restarted elsewhere: the placement names its new address, and the copy goes there.
	h.takeCalls()
	moved := &runnerv1.RecoverySource{MailboxId: "audit@p0", Address: "10.0.0.2:9000"}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg, RecoverFrom: moved}); err != nil {
		t.Fatal(err)
	}
	if c := h.takeCalls(); !slices.Contains(c, "update recovery audit@p1 10.0.0.2:9000") {
		t.Fatalf("calls %v: the runner was not given the source's new address", c)
	}
}

// TestOpenWithHistoryBefore: the earlier mailbox an OpenMailbox names reaches the runner when the mailbox is
// activated, a malformed one or the mailbox itself is refused, and the runner's incomplete history is in the
// mailbox's status with when it starts.
func TestOpenWithHistoryBefore(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	for _, bad := range []string{"audit@p1", "not an id", "audit@"} {
		_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg, HistoryBefore: bad})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("history_before %q: %v, want InvalidArgument", bad, err)
		}
	}
	if _, ok := h.open["audit@p1"]; ok {
		t.Fatal("a refused open opened the mailbox")
	}
	h.recovery["audit@p1"] = runner.RecoveryStatus{State: runner.RecoveryIncomplete, Source: "audit@p0", HistoryStartsAt: time.Unix(7, 0)}
	resp, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg, Epoch: 3, ValidFor: vf, HistoryBefore: "audit@p0"})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.open["audit@p1"]; got.HistoryBefore != "audit@p0" || got.Recover != nil {
		t.Fatalf("runner opened with history before %q, recovery source %+v", got.HistoryBefore, got.Recover)
	}
	rs := resp.GetStatus().GetRecovery()
	if rs.GetState() != runnerv1.RecoveryState_RECOVERY_STATE_INCOMPLETE || rs.GetSourceMailboxId() != "audit@p0" ||
		rs.GetHistoryComplete() || rs.GetHistoryStartsAt().AsTime() != time.Unix(7, 0).UTC() {
		t.Fatalf("recovery status %v", rs)
	}
}

// TestAllowRecovery: the set reaches the runner, replaces the last one, an empty one clears it, a close clears it;
// an unknown mailbox is NotFound and a malformed proxy id InvalidArgument, neither changing anything.
func TestAllowRecovery(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	allow := func(id string, proxies ...string) error {
		_, err := s.AllowRecovery(ctx, &runnerv1.AllowRecoveryRequest{MailboxId: id, ProxyIds: proxies})
		return err
	}
	if err := allow("audit@p1", "p2"); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown mailbox: %v, want NotFound", err)
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg, Epoch: 2, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if err := allow("audit@p1", "p2", "p3"); err != nil {
		t.Fatal(err)
	}
	if err := allow("audit@p1", "bad@proxy"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("malformed proxy id: %v, want InvalidArgument", err)
	}
	if got := h.allowed["audit@p1"]; !slices.Equal(got, []string{"p2", "p3"}) {
		t.Fatalf("allowed %v", got)
	}
	if err := allow("audit@p1", "p4"); err != nil {
		t.Fatal(err)
	}
	if got := h.allowed["audit@p1"]; !slices.Equal(got, []string{"p4"}) {
		t.Fatalf("allowed %v after a replace", got)
	}
	if err := allow("audit@p1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.allowed["audit@p1"]; ok {
		t.Fatal("an empty set did not clear it")
	}
	if err := allow("audit@p1", "p4"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: "audit@p1"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.allowed["audit@p1"]; ok {
		t.Fatal("a close left the set")
	}
}
