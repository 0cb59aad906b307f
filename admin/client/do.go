package client

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Repeatable says whether a call may run twice.
type Repeatable bool

const (
	// Idempotent calls leave the same state when run twice, and their
	// caller copes with the second run's answer: reads, registrations,
	// heartbeats, lease acquires by the same runner (a reconnect), releases
	// (the second finds the lease gone).
	Idempotent Repeatable = true
	// Once calls answer differently when they already ran (a create answers
	// "already existed", a delete "no such namespace"), so a failure after
	// which the call may have run goes back to the caller, who can look.
	Once Repeatable = false
)

// retried reports whether a call that failed with err on one node goes on
// to another. Everything not listed is the cluster's answer, the same from
// every node, and goes back at once: InvalidArgument, NotFound,
// AlreadyExists, FailedPrecondition (a lease refusal other than
// NOT_LEADER), Unimplemented, Internal and the rest.
func retried(err error, r Repeatable) bool {
	// The request never left this process: no node ran it.
	if NotSent(err) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable:
		// Every call. The admin answers Unavailable when it did not run the
		// call: no leader yet, not the leader (the NOT_LEADER refusal, which
		// names the leader), shutting down, or its forward to the leader
		// certainly not sent. gRPC also reports a connection lost mid-call
		// as Unavailable, which may have run; it is retried too, since a
		// lost connection is most often a dead node, and Once calls then
		// answer for themselves (AlreadyExists, NotFound, a refusal).
		return true
	case codes.DeadlineExceeded:
		// Idempotent calls only. Our Attempt ran out with the caller's
		// context still alive: the node is blackholed or paused (move on),
		// or slow and still applying the call (which must not run twice).
		return bool(r)
	case codes.Aborted, codes.Unknown, codes.Canceled:
		// Idempotent calls only. The node or the transport gave up on the
		// call (a handler that panicked or was cancelled by its server's
		// shutdown) at a point that may be after it ran; another node may
		// do better.
		return bool(r)
	case codes.ResourceExhausted:
		// Idempotent calls only, and only a node's own refusal (a follower
		// short of disk space refuses before it forwards). A refusal with
		// RetryInfo (the leader shedding work) or QuotaFailure (a quota) is
		// the cluster's: another node forwards to the same leader or holds
		// the same state, and rounds of retries would turn the caller's
		// retry hint into Unavailable at the end of its deadline.
		return bool(r) && !clusterExhausted(err)
	}
	return false
}

// clusterExhausted reports whether err is a RESOURCE_EXHAUSTED that carries
// the cluster's reason: google.rpc.RetryInfo or QuotaFailure.
func clusterExhausted(err error) bool {
	for _, d := range status.Convert(err).Details() {
		switch d.(type) {
		case *errdetails.RetryInfo, *errdetails.QuotaFailure:
			return true
		}
	}
	return false
}

// Do calls fn with a connection to one admin node after another until one
// answers with something other than a retried failure (see retried), the
// configured Rounds are spent, or ctx ends; between rounds it waits as
// Backoff says. Each try is bounded by Attempt. It starts with the node that
// answered last, follows a NOT_LEADER refusal's leader address when that is
// one of the endpoints, and otherwise tries each node once per round.
//
// A failure that is not retried comes back as the node gave it (code and
// details intact) with the method and node added to its text. Giving up
// yields Unavailable, naming every node and its last failure; the failures
// and, when ctx ended, ctx.Err() are wrapped.
func Do[Resp any](ctx context.Context, c *Client, r Repeatable, fn func(context.Context, *grpc.ClientConn) (Resp, error)) (Resp, error) {
	var zero Resp
	n := len(c.cfg.Endpoints)
	rec := &record{}
	ctx = context.WithValue(ctx, recordKey{}, rec)
	delay := c.cfg.Backoff.DelayFunc()
	last := make([]error, n)
	// unreachableSince is when the rounds in which no request was sent
	// began; zero while some node took one.
	var unreachableSince time.Time
	for round := 1; ; round++ {
		c.mu.Lock()
		i := c.preferred
		c.mu.Unlock()
		tried := make([]bool, n)
		roundStart, sent := c.cfg.Clock.Now(), false
		for i >= 0 {
			tried[i] = true
			addr, cc, err := c.conn(i)
			if err != nil {
				return zero, err
			}
			resp, err := try(ctx, c.cfg.Attempt, cc, fn)
			if err == nil {
				c.mu.Lock()
				c.preferred = i
				c.mu.Unlock()
				return resp, nil
			}
			if !retried(err, r) {
				return zero, fmt.Errorf("%s on %s: %w", rec.name(), addr, err)
			}
			last[i] = err
			sent = sent || !NotSent(err)
			if ctx.Err() != nil {
				return zero, c.unanswered(rec, last, ctx.Err())
			}
			i = c.next(i, tried, err)
		}
		if c.cfg.Rounds > 0 && round >= c.cfg.Rounds {
			return zero, c.unanswered(rec, last, nil)
		}
		wait := delay()
		if c.cfg.UnreachableAfter > 0 {
			switch {
			case sent:
				unreachableSince = time.Time{}
			case unreachableSince.IsZero():
				unreachableSince = roundStart
			}
			if !unreachableSince.IsZero() {
				left := c.cfg.UnreachableAfter - c.cfg.Clock.Since(unreachableSince)
				if left <= 0 {
					u := c.unanswered(rec, last, nil)
					u.unreachable = true
					return zero, u
				}
				// One last round when the time is up, not a backoff past it.
				wait = min(wait, left)
			}
		}
		t := c.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return zero, c.unanswered(rec, last, ctx.Err())
		case <-t.C():
		}
	}
}

// try is one call on one node, bounded by Attempt.
func try[Resp any](ctx context.Context, attempt time.Duration, cc *grpc.ClientConn, fn func(context.Context, *grpc.ClientConn) (Resp, error)) (Resp, error) {
	if attempt > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, attempt)
		defer cancel()
	}
	return fn(ctx, cc)
}

// next is the endpoint to try after i failed with err in this round, or -1
// when every endpoint has been tried.
func (c *Client) next(i int, tried []bool, err error) int {
	if r, ok := mesh.RefusalFrom(err); ok && r.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER && r.GetLeaderAddress() != "" {
		j := slices.Index(c.cfg.Endpoints, r.GetLeaderAddress())
		if j >= 0 && !tried[j] {
			return j
		}
		if j < 0 {
			c.cfg.Logger.Debug("leader hint is not a configured admin endpoint", "leader_address", r.GetLeaderAddress())
		}
	}
	for k := 1; k < len(tried); k++ {
		if j := (i + k) % len(tried); !tried[j] {
			return j
		}
	}
	return -1
}

// recordKey carries a Do's record to trackSent through the call's context.
type recordKey struct{}

// record is what trackSent saw of the calls one Do made: the method, for
// error text that says which call failed even when fn turned an answer into
// an error itself.
type record struct{ method atomic.Pointer[string] }

func (r *record) name() string {
	if m := r.method.Load(); m != nil {
		return path.Base(*m)
	}
	return "admin call"
}

// unansweredError is Do giving up: every node it tried failed in a way that
// sent it on to the next.
type unansweredError struct {
	msg  string
	errs []error
	// unreachable: no node accepted a connection for UnreachableAfter.
	unreachable bool
}

// Unreachable reports whether err is Do giving up because no endpoint
// accepted a connection for Config.UnreachableAfter: nothing listens at the
// addresses, or nothing this client can talk to.
func Unreachable(err error) bool {
	var u *unansweredError
	return errors.As(err, &u) && u.unreachable
}

func (c *Client) unanswered(rec *record, last []error, ctxErr error) *unansweredError {
	var parts []string
	var errs []error
	for i, err := range last {
		if err != nil {
			st := status.Convert(err)
			parts = append(parts, fmt.Sprintf("%s: %s: %s", c.cfg.Endpoints[i], st.Code(), st.Message()))
			errs = append(errs, err)
		}
	}
	if ctxErr != nil {
		errs = append(errs, ctxErr)
	}
	return &unansweredError{
		msg:  fmt.Sprintf("no admin node could answer %s: %s", rec.name(), strings.Join(parts, "; ")),
		errs: errs,
	}
}

func (e *unansweredError) Error() string   { return e.msg }
func (e *unansweredError) Unwrap() []error { return e.errs }

// GRPCStatus makes giving up Unavailable, whatever the nodes said last.
func (e *unansweredError) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.msg) }
