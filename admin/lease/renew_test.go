package lease

import (
	"errors"
	"testing"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestRefusalErrorRoundTrip(t *testing.T) {
	t.Parallel()
	cases := []struct {
		reason adminv1.LeaseRefusalReason
		code   codes.Code
	}{
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, codes.Unavailable},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE, codes.NotFound},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER, codes.FailedPrecondition},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER, codes.FailedPrecondition},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED, codes.FailedPrecondition},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_STALE_EPOCH, codes.FailedPrecondition},
	}
	for _, tc := range cases {
		t.Run(tc.reason.String(), func(t *testing.T) {
			t.Parallel()
			r := &adminv1.LeaseRefusal{Reason: tc.reason, Message: "m", Current: &adminv1.Lease{MailboxId: "a@p", RunnerId: "r1", Epoch: 3}, LeaderId: "n2"}
			err := RefusalError(r)
			if status.Code(err) != tc.code {
				t.Fatalf("code %v, want %v", status.Code(err), tc.code)
			}
			got, ok := RefusalFrom(err)
			if !ok || !proto.Equal(got, r) {
				t.Fatalf("detail %v, want %v", got, r)
			}
		})
	}
	if _, ok := RefusalFrom(errors.New("plain")); ok {
		t.Fatal("refusal found in a plain error")
	}
}

func TestValidateRenew(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		req  *adminv1.MailboxHeartbeatRequest
		ok   bool
	}{
		{"valid", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r", Stats: &adminv1.LeaseStats{EventsStored: 1}}, true},
		{"no stats", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r"}, true},
		{"bad mailbox", &adminv1.MailboxHeartbeatRequest{MailboxId: "a", RunnerId: "r"}, false},
		{"no runner", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p"}, false},
		{"negative counter", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r", Stats: &adminv1.LeaseStats{StorageBytes: -1}}, false},
		{"unknown health", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r", Stats: &adminv1.LeaseStats{Health: 9}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateRenew(tc.req)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, fsm.ErrInvalid)) {
				t.Fatalf("ValidateRenew = %v", err)
			}
		})
	}
}
