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
// keep up it refuses new work before a renewal is lost
// (docs/architecture.md#sessions, overload), and it decides by the queues it
// measures, not by a rate guessed in advance.
//
// Renewals (MailboxHeartbeat, KeepAliveSession) have their own budget, the
// renewal gate (renewalgate.go): at most MaxRenewalsInFlight past it at
// once, the rest waiting with their receipts open, so they count from
// their arrival however long they wait (admin/lease, arrival.go). They are
// never refused for load. New work (an acquire, an open, a registration, a
// namespace, an operator's write) is refused RESOURCE_EXHAUSTED with a
// retry hint (errdetails.RetryInfo, which grpc-go clients read with
// status.Details) while MaxInFlightWrites proposals are in flight, while a
// renewal has waited at the gate longer than ShedAfterRenewalWait, and for
// RetryAfter after one reached the lessor that late. The writes in
// essentialWrites are counted but never refused.
type Admission struct {
	// MaxInFlightWrites bounds the Raft writes the leader has proposed
	// and not yet seen applied (default 1000).
	MaxInFlightWrites int
	// MaxRenewalsInFlight bounds the renewals past the gate at once, in
	// the leadership check or the lessor (default 64).
	MaxRenewalsInFlight int
	// MaxRenewalsPerSecond, if positive, is the most renewals the leader
	// lets past the gate a second (default 0: no bound; the CPU is). A
	// bound below what the machine can do keeps CPU for Raft's heartbeats
	// and the leadership rounds when renewals alone would take all of it
	// (a leader starved of them is deposed, and then every renewal fails):
	// past it renewals wait, counted from their arrival, and new work is
	// shed.
	MaxRenewalsPerSecond float64
	// ShedAfterRenewalWait: new writes are shed while a renewal has waited
	// longer than this at the gate, and for RetryAfter after one reached
	// the lessor this late; past it the gate also serves the most urgent
	// renewals first, not the oldest (default 1s).
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
	if a.MaxRenewalsInFlight <= 0 {
		a.MaxRenewalsInFlight = 64
	}
	if a.ShedAfterRenewalWait <= 0 {
		a.ShedAfterRenewalWait = time.Second
	}
	if a.RetryAfter <= 0 {
		a.RetryAfter = time.Second
	}
	return a
}

// admission is the leader's count of writes in flight, its renewal gate
// and how long new writes are shed for.
type admission struct {
	inFlight atomic.Int64
	renewals *renewalGate
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
	now := s.cfg.Clock.Now()
	var why string
	switch waited, waiting := s.admission.renewals.oldestWait(now); {
	case n > int64(a.MaxInFlightWrites):
		why = fmt.Sprintf("%d writes in flight on the leader (limit %d)", n-1, a.MaxInFlightWrites)
	case waited > a.ShedAfterRenewalWait:
		why = fmt.Sprintf("%d renewals waiting on the leader, the oldest for %s", waiting, waited.Round(time.Millisecond))
	case now.UnixNano() < s.admission.shedUntil.Load():
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
// lessor: its turn at the renewal gate, then the quorum's confirmation that
// this node still leads, taken after the arrival. The returned leave ends
// the turn; call it once the lessor has answered. A renewal that waited
// long says the leader is behind: new writes are shed for a while so
// renewals get the leader's time.
func (s *Server) renewalWait(ctx context.Context, rc *lease.Receipt) (leave func(), err error) {
	if h := s.hooks.renewalReceived.Load(); h != nil {
		(*h)(rc)
	}
	leave, err = s.admission.renewals.enter(ctx, rc)
	if err != nil {
		return nil, err
	}
	if err := s.leader.Lease(ctx); err != nil {
		leave()
		s.metrics.leaderUnconfirmed.Inc()
		return nil, fmt.Errorf("%w: %v", raftnode.ErrNotLeader, err)
	}
	now := s.cfg.Clock.Now()
	waited := now.Sub(rc.At())
	s.metrics.renewalWait.Observe(waited.Seconds())
	if waited > s.cfg.Admission.ShedAfterRenewalWait {
		s.admission.shedUntil.Store(now.Add(s.cfg.Admission.RetryAfter).UnixNano())
	}
	return leave, nil
}
