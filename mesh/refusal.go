package mesh

import (
	"fmt"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RefusalCode is the gRPC code a lease RPC fails with when it carries a
// refusal as a status instead of in its response: NOT_LEADER is retryable
// elsewhere (UNAVAILABLE), a missing lease is NOT_FOUND, and every other
// refusal means the caller's view of the lease, or of the mailbox's
// placement, is wrong (FAILED_PRECONDITION).
func RefusalCode(r *adminv1.LeaseRefusal) codes.Code {
	switch r.GetReason() {
	case adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER:
		return codes.Unavailable
	case adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE:
		return codes.NotFound
	default:
		return codes.FailedPrecondition
	}
}

// RefusalError turns a refusal into a gRPC status error with the refusal
// attached as a detail, so clients that only look at errors still get the
// typed reason and the holder.
func RefusalError(r *adminv1.LeaseRefusal) error {
	st := status.New(RefusalCode(r), fmt.Sprintf("%s: %s", r.GetReason(), r.GetMessage()))
	if withDetails, err := st.WithDetails(r); err == nil {
		st = withDetails
	}
	return st.Err()
}

// RefusalFrom extracts a refusal from a gRPC error made by RefusalError.
func RefusalFrom(err error) (*adminv1.LeaseRefusal, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if r, ok := d.(*adminv1.LeaseRefusal); ok {
			return r, true
		}
	}
	return nil, false
}
