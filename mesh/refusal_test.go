package mesh

import (
	"errors"
	"testing"

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
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NAMESPACE_NOT_FOUND, codes.FailedPrecondition},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE, codes.FailedPrecondition},
		{adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER, codes.FailedPrecondition},
	}
	for _, tc := range cases {
		t.Run(tc.reason.String(), func(t *testing.T) {
			t.Parallel()
			r := &adminv1.LeaseRefusal{Reason: tc.reason, Message: "m", Current: &adminv1.Lease{MailboxId: "a@p", RunnerId: "r1", Epoch: 3}, LeaderId: "n2"}
			if got := RefusalCode(r); got != tc.code {
				t.Fatalf("RefusalCode = %v, want %v", got, tc.code)
			}
			err := RefusalError(r)
			if status.Code(err) != tc.code || status.Convert(err).Message() != tc.reason.String()+": m" {
				t.Fatalf("status %v, want code %v and message %q", status.Convert(err), tc.code, tc.reason.String()+": m")
			}
			got, ok := RefusalFrom(err)
			if !ok || !proto.Equal(got, r) {
				t.Fatalf("detail %v, want %v", got, r)
			}
		})
	}
}

func TestRefusalFromWithoutRefusal(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"plain error":        errors.New("plain"),
		"status, no details": status.Error(codes.FailedPrecondition, "x"),
		"nil":                nil,
		"status, other detail": func() error {
			st, _ := status.New(codes.Unavailable, "x").WithDetails(&adminv1.Lease{MailboxId: "a@p"})
			return st.Err()
		}(),
	} {
		if r, ok := RefusalFrom(err); ok {
			t.Errorf("%s: found refusal %v", name, r)
		}
	}
}
