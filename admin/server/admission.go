package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/admin/raftnode"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Admission bounds the work the leader takes on, so that when it cannot
// keep up it refuses new work before a renewal is lost (issue 20): past a
// bound, a write that adds state (an acquire, an open, a registration, a
// namespace, an operator's write) is refused RESOURCE_EXHAUSTED with a
// retry hint (errdetails.RetryInfo, which grpc-go clients read with
// status.Details). Renewals (MailboxHeartbeat, KeepAliveSession) never pass
// through admission, and the writes in essentialWrites are counted but
// never refused. The renewals themselves count from their arrival however
// long they wait (admin/lease, arrival.go), so the shedding is about
// keeping their wait short, not about their safety.
type Admission struct {
	// MaxInFlightWrites bounds the Raft writes the leader has proposed
	// and not yet seen applied (default 1000).
	MaxInFlightWrites int
	// ShedAfterRenewalWait: a renewal that waited longer than this between
	// its arrival and the lessor (the leader is behind) sheds new writes
	// for RetryAfter (default 1s).
	ShedAfterRenewalWait time.Duration
	// RetryAfter is the retry hint; each refusal adds up to half of it
	// again at random so refused callers do not come back in step
	// (default 1s).
	RetryAfter time.Duration
}

func (a Admission) withDefaults() Admission {
	if a.MaxInFlightWrites <= 0 {
		a.MaxInFlightWrites = 1000
	}
	if a.ShedAfterRenewalWait <= 0 {
		a.ShedAfterRenewalWait = time.Second
	}
	if a.RetryAfter <= 0 {
		a.RetryAfter = time.Second
	}
	return a
}

// admission is the leader's count of writes in flight and how long new
// ones are shed for.
type admission struct {
	inFlight atomic.Int64
	// shedUntil is the leader clock's UnixNano until which new writes are
	// refused because a renewal waited too long.
	shedUntil atomic.Int64
}

// admit counts method's proposal in flight on the leader, or refuses it.
// The returned release ends the count.
func (s *Server) admit(method string) (release func(), err error) {
	n := s.admission.inFlight.Add(1)
	release = func() { s.admission.inFlight.Add(-1) }
	if essentialWrites[method] {
		return release, nil
	}
	a := s.cfg.Admission
	var why string
	switch {
	case n > int64(a.MaxInFlightWrites):
		why = fmt.Sprintf("%d writes in flight on the leader (limit %d)", n-1, a.MaxInFlightWrites)
	case s.cfg.Clock.Now().UnixNano() < s.admission.shedUntil.Load():
		why = fmt.Sprintf("renewals are waiting longer than %s on the leader", a.ShedAfterRenewalWait)
	default:
		return release, nil
	}
	release()
	s.metrics.shed.WithLabelValues(method).Inc()
	retry := a.RetryAfter + rand.N(a.RetryAfter/2+1)
	st, derr := status.New(codes.ResourceExhausted, fmt.Sprintf("%s shed: %s; retry after %s", method, why, retry)).
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	if derr != nil {
		return nil, status.Errorf(codes.ResourceExhausted, "%s shed: %s; retry after %s", method, why, retry)
	}
	return nil, st.Err()
}

// renewalWait is what a renewal waits for between its receipt and the
// lessor: the quorum's confirmation that this node still leads, taken after
// the arrival. A renewal that waited long says the leader is behind: new
// writes are shed for a while so renewals get the leader's time.
func (s *Server) renewalWait(ctx context.Context, rc *lease.Receipt) error {
	if h := s.hooks.renewalReceived.Load(); h != nil {
		(*h)(rc)
	}
	if err := s.leader.Lease(ctx); err != nil {
		s.metrics.leaderUnconfirmed.Inc()
		return fmt.Errorf("%w: %v", raftnode.ErrNotLeader, err)
	}
	now := s.cfg.Clock.Now()
	waited := now.Sub(rc.At())
	s.metrics.renewalWait.Observe(waited.Seconds())
	if waited > s.cfg.Admission.ShedAfterRenewalWait {
		s.admission.shedUntil.Store(now.Add(s.cfg.Admission.RetryAfter).UnixNano())
	}
	return nil
}
