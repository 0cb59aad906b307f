package agent

import (
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

// retryWait is how long to wait before retrying call after it failed with
// err: the backoff's next step, or, when the admin shed the call
// (RESOURCE_EXHAUSTED with google.rpc.RetryInfo, admin/server/admission.go),
// at least the delay it asked for plus up to a fifth of it again at random.
// A fixed shorter backoff would send the shed work straight back to a
// leader that said it cannot take it yet, and the jitter keeps the
// sidecars it shed together from returning together.
func (m *metrics) retryWait(call string, err error, bo *wait.Backoff) time.Duration {
	d := bo.Step()
	hint, ok := retryHint(err)
	if !ok {
		return d
	}
	m.shed.WithLabelValues(call).Inc()
	return max(d, hint+rand.N(hint/5+1))
}

// retryHint is the retry delay of a RESOURCE_EXHAUSTED status carrying
// RetryInfo; false for any other error.
func retryHint(err error) (time.Duration, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return 0, false
	}
	st := se.GRPCStatus()
	if st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}
