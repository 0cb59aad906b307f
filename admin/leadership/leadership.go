// Package leadership tells the Raft leader whether it may still answer from
// its own memory: renew a lease, or serve a read without a log round.
//
// hashicorp/raft reports State() == Leader until its own leader-lease check
// next runs. A leader paused (SIGSTOP, a GC or VM stall, a throttled
// container) for longer than the election timeout is deposed while it cannot
// notice, and on resuming it answers the requests that queued during the
// pause from stale state before it steps down. raft's VerifyLeader does not
// close that window either: it counts replies to heartbeats that may have
// been sent before the pause. This package asks the question itself.
//
// # A round
//
// A round reads the leader's term T, notes its start r on the monotonic
// clock, then asks every other voter for its current term over the admin
// gRPC channel (see Config.Ask). A voter computes its answer when the call
// arrives, so after r. A quorum of voters, this node included, answering T
// or less proves that no leader of a later term was elected before r:
// electing one needs a quorum of votes, any two quorums share a voter, a
// voter's term only grows and it takes the new term when it votes, so the
// shared voter voted after it answered, after r.
//
// # Why answering within Lease of a round is safe
//
// Let a renewal request be sent at s (the sidecar's clock; it stops serving
// at s + ttl) and checked here at t, read after the request was dequeued, so
// s <= t. It is answered only if a successful round of the current term
// started at r with t - r < Lease. A successor is elected at e > r and
// promotes at p >= e, giving every lease expires = p + ttl + X (X is the
// lessor's ExtendOnPromote, the election timeout); it can grant the mailbox
// to someone else no earlier than p + ttl + X + grace. Then
//
//	s <= t < r + Lease < e + Lease <= p + Lease,
//
// so the holder stops at s + ttl < p + ttl + Lease, before the successor's
// earliest re-grant as long as Lease <= X + grace. Nothing here depends on how
// long a pause was: the monotonic clock keeps counting through it, so a node
// resumed after a pause longer than Lease finds its last round too old and
// runs a new one, which a deposed leader cannot win. What the clocks may do
// is run at different rates; with drift at most rho between any two nodes
// the condition becomes Lease*(1+rho) + 2*rho*ttl <= (X + grace)*(1-rho). The
// admin node uses Lease = X/2, which leaves the whole grace and half the
// election timeout for drift (admin/server wires it; docs/architecture.md
// states the lease rules).
//
// A pause after the check, before the answer leaves, changes nothing above:
// the holder counts from s, not from when the answer arrives.
//
// Reads that must be linearizable use Since with the time they took the
// commit index: a round that started after it (the ReadIndex rule), with no
// clock assumption at all.
package leadership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// ErrNotLeader means this node does not lead, or could not prove it still
// did; the caller should answer as a follower would (try the leader).
var ErrNotLeader = errors.New("leadership not confirmed")

// Config wires a Checker to its node. Leading, Voters and Ask are required.
type Config struct {
	// Leading reports this node's raft term and whether it is the leader.
	Leading func() (term uint64, leader bool)
	// Voters returns the ids of the other voting members and the quorum
	// size of the whole voter set (this node included).
	Voters func() (peers []string, quorum int, err error)
	// Ask returns peer's current raft term as the peer saw it when the call
	// arrived (never a cached answer from before the call).
	Ask func(ctx context.Context, peer string) (uint64, error)
	// Lease is how long after a round's start its confirmation may be used
	// to answer from leader-local state (see the package doc for the bound).
	Lease time.Duration
	// RoundTimeout bounds one round (default Lease).
	RoundTimeout time.Duration
	// Clock defaults to the real clock.
	Clock  clock.PassiveClock
	Logger *slog.Logger
}

// Checker runs confirmation rounds, one at a time, shared by every caller
// waiting when it starts.
type Checker struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// last is the latest successful round; inflight the running one.
	last     *round
	inflight *round
}

type round struct {
	term  uint64
	start time.Time
	done  chan struct{}
	err   error
}

// New returns a Checker. It runs rounds only when asked: a caller finding
// the last confirmation older than half the lease starts the next one in the
// background, so under steady load callers answer from memory.
func New(cfg Config) (*Checker, error) {
	if cfg.Leading == nil || cfg.Voters == nil || cfg.Ask == nil {
		return nil, errors.New("leadership: Leading, Voters and Ask are required")
	}
	if cfg.Lease <= 0 {
		return nil, fmt.Errorf("leadership: lease must be positive, got %s", cfg.Lease)
	}
	if cfg.RoundTimeout <= 0 {
		cfg.RoundTimeout = cfg.Lease
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Checker{cfg: cfg, log: log}, nil
}

// Lease returns nil if this node may answer from leader-local state now: it
// leads, and a quorum confirmed its term in a round that started less than
// Lease ago, running one if the last is too old. Call it after the request
// has been dequeued.
func (c *Checker) Lease(ctx context.Context) error {
	now := c.cfg.Clock.Now()
	return c.await(ctx, now.Add(-c.cfg.Lease), now.Add(-c.cfg.Lease/2))
}

// Since returns nil once a round of the current term that started at or
// after t has succeeded, running one if needed; ErrNotLeader if this node
// does not lead or such a round failed.
func (c *Checker) Since(ctx context.Context, t time.Time) error {
	return c.await(ctx, t, time.Time{})
}

// await is Since(t); when it answers from a round that started before
// refresh and none runs, it starts the next one without waiting for it, so
// callers rarely wait for a round.
func (c *Checker) await(ctx context.Context, t, refresh time.Time) error {
	for {
		term, leader := c.cfg.Leading()
		if !leader {
			return ErrNotLeader
		}
		c.mu.Lock()
		if l := c.last; l != nil && l.term == term && !l.start.Before(t) {
			if c.inflight == nil && l.start.Before(refresh) {
				c.startLocked(term)
			}
			c.mu.Unlock()
			return nil
		}
		r := c.inflight
		if r == nil {
			r = c.startLocked(term)
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("confirm leadership: %w", ctx.Err())
		case <-r.done:
		}
		if r.err != nil && !r.start.Before(t) {
			return r.err
		}
	}
}

// startLocked starts a round of term; c.mu is held. The start is read after
// the term, and every Ask is made after the start.
func (c *Checker) startLocked(term uint64) *round {
	r := &round{term: term, start: c.cfg.Clock.Now(), done: make(chan struct{})}
	c.inflight = r
	go func() {
		r.err = c.confirm(r)
		c.mu.Lock()
		c.inflight = nil
		if r.err == nil && (c.last == nil || r.start.After(c.last.start)) {
			c.last = r
		}
		c.mu.Unlock()
		close(r.done)
	}()
	return r
}

type answer struct {
	peer string
	term uint64
	err  error
}

// confirm counts peers answering r.term until a quorum (with this node) is
// reached, a peer shows a later term, or every peer has answered.
func (c *Checker) confirm(r *round) error {
	peers, quorum, err := c.cfg.Voters()
	if err != nil {
		return fmt.Errorf("%w: read voters: %v", ErrNotLeader, err)
	}
	need := quorum - 1
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RoundTimeout)
	defer cancel()
	answers := make(chan answer, len(peers))
	for _, p := range peers {
		go func() {
			t, err := c.cfg.Ask(ctx, p)
			answers <- answer{peer: p, term: t, err: err}
		}()
	}
	var failed []error
	for got := 0; need > 0 && got < len(peers); got++ {
		a := <-answers
		switch {
		case a.err != nil:
			failed = append(failed, fmt.Errorf("%s: %w", a.peer, a.err))
		case a.term > r.term:
			return fmt.Errorf("%w: %s is in term %d, this node leads term %d", ErrNotLeader, a.peer, a.term, r.term)
		default:
			need--
		}
	}
	if need > 0 {
		return fmt.Errorf("%w: %d of %d voters confirmed term %d: %w", ErrNotLeader, quorum-need, quorum, r.term, errors.Join(failed...))
	}
	if term, leader := c.cfg.Leading(); !leader || term != r.term {
		return fmt.Errorf("%w: left term %d during the round", ErrNotLeader, r.term)
	}
	return nil
}
