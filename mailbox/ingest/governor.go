package ingest

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// GovernorConfig sets how ingest gives way to queries.
type GovernorConfig struct {
	// Target is the query latency ingest gives way to: an answer slower than
	// it holds ingest back. Default 10ms.
	Target time.Duration
	// Linger is how long ingest stays held back after the last answer over
	// Target: queries come and go, and a hold that ended with every fast
	// answer would let ingest take the cores back between two of them.
	// Default 1s.
	Linger time.Duration
	// MaxHold is the floor: the longest one store write waits for queries
	// to be fast again. Under constant query pressure every claim still
	// writes a batch per MaxHold. Default 250ms.
	MaxHold time.Duration
	// Lanes is how many of ingest's decodes and store writes, over every
	// claim and mailbox, may run at once while queries are being answered
	// (an answer within the last Linger, fast or slow). Default one core
	// fewer than GOMAXPROCS, at least one: a query always finds a core that
	// ingest leaves free, instead of queueing behind ingest's goroutines for
	// Go's 10ms preemption slice, once per hand-off of the request.
	Lanes int
	// Clock measures Linger and MaxHold (default the real clock).
	Clock clock.WithTicker
}

// Governor puts queries before ingest on a runner whose cores both serve.
// The query servers report every answer's latency (Observe). While answers
// come (one within the last Linger), ingest's decodes and store writes take
// turns on Lanes cores, so the others are left to the queries: Go's
// scheduler has no priorities, and a handler woken behind goroutines that
// compute would wait for one to be preempted. While an answer was over the
// target within the last Linger, ingest is also held back: each claim
// waits before its next store write, until answers are fast again or MaxHold
// has passed, and decodes its batches on one core instead of every core. A
// held claim's writer queue stays full, so the claim fetches nothing more
// meanwhile, and nothing is marked for commit that was not written, so
// holding back changes when batches are made durable, never which offsets
// are committed. One Governor serves every mailbox of a runner: they share
// the cores. A nil *Governor never holds ingest back.
type Governor struct {
	cfg         GovernorConfig
	slowUntil   atomic.Int64 // clock time, in Unix nanoseconds, until which ingest is held back
	activeUntil atomic.Int64 // clock time, in Unix nanoseconds, until which ingest takes turns on the lanes
	lanes       chan struct{}
	holds       prometheus.Counter
	heldFor     prometheus.Counter
	laneWait    prometheus.Counter
}

// NewGovernor makes a Governor and registers its metrics on reg.
func NewGovernor(cfg GovernorConfig, reg prometheus.Registerer) *Governor {
	if cfg.Target <= 0 {
		cfg.Target = 10 * time.Millisecond
	}
	if cfg.Linger <= 0 {
		cfg.Linger = time.Second
	}
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = 250 * time.Millisecond
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = max(1, runtime.GOMAXPROCS(0)-1)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	g := &Governor{
		cfg:   cfg,
		lanes: make(chan struct{}, cfg.Lanes),
		laneWait: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_mailbox_ingest_lane_wait_seconds_total",
			Help: "Time ingest's decodes and store writes waited for their turn on the cores queries leave to ingest while they are answered, summed over claims.",
		}),
		holds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_mailbox_ingest_held_back_writes_total",
			Help: "Store writes that waited because queries were slower than the query latency target.",
		}),
		heldFor: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_mailbox_ingest_held_back_seconds_total",
			Help: "Time store writes spent waiting for queries to be faster than the query latency target, summed over claims.",
		}),
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "prism_mailbox_ingest_held_back",
		Help: "1 while ingest gives way to queries: an answer was slower than the query latency target within the linger.",
	}, func() float64 {
		if g.Held() {
			return 1
		}
		return 0
	})
	target := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "prism_mailbox_query_latency_target_seconds",
		Help: "The query latency ingest gives way to (--query-latency-target).",
	})
	target.Set(cfg.Target.Seconds())
	reg.MustRegister(g.holds, g.heldFor, g.laneWait, held, target)
	return g
}

// Observe takes the latency of one answer into account.
func (g *Governor) Observe(d time.Duration) {
	if g == nil {
		return
	}
	until := g.cfg.Clock.Now().Add(g.cfg.Linger).UnixNano()
	raise(&g.activeUntil, until)
	if d > g.cfg.Target {
		raise(&g.slowUntil, until)
	}
}

// raise sets v to until unless it is already later.
func raise(v *atomic.Int64, until int64) {
	for {
		cur := v.Load()
		if cur >= until || v.CompareAndSwap(cur, until) {
			return
		}
	}
}

// Held reports whether ingest is held back now.
func (g *Governor) Held() bool {
	return g != nil && g.cfg.Clock.Now().UnixNano() < g.slowUntil.Load()
}

// active reports whether ingest takes turns on the lanes now: queries were
// answered within the last Linger.
func (g *Governor) active() bool {
	return g != nil && g.cfg.Clock.Now().UnixNano() < g.activeUntil.Load()
}

// lane waits, while queries are being answered, for a turn on one of the
// Lanes cores ingest's decodes and store writes share, and returns what
// ends the turn; otherwise, or once ctx ends (a closing ingester drains
// without waiting), it returns at once, and ending is a no-op. It reports
// whether it took a turn. A turn is never held across anything but the
// work it admits, so every claim gets one in its order of asking.
func (g *Governor) lane(ctx context.Context) (end func(), took bool) {
	if !g.active() {
		return func() {}, false
	}
	select {
	case g.lanes <- struct{}{}:
		return g.leave, true
	default:
	}
	start := g.cfg.Clock.Now()
	defer func() { g.laneWait.Add(g.cfg.Clock.Since(start).Seconds()) }()
	select {
	case g.lanes <- struct{}{}:
		return g.leave, true
	case <-ctx.Done():
		return func() {}, false
	}
}

func (g *Governor) leave() { <-g.lanes }

// hold waits, before a store write, while ingest is held back, for at most
// MaxHold or until ctx ends (a closing ingester drains without waiting).
// It reports whether it waited.
func (g *Governor) hold(ctx context.Context) bool {
	if !g.Held() {
		return false
	}
	g.holds.Inc()
	start := g.cfg.Clock.Now()
	defer func() { g.heldFor.Add(g.cfg.Clock.Since(start).Seconds()) }()
	deadline := start.Add(g.cfg.MaxHold)
	for {
		now := g.cfg.Clock.Now()
		until := time.Unix(0, g.slowUntil.Load())
		if !now.Before(until) || !now.Before(deadline) {
			return true
		}
		if until.After(deadline) {
			until = deadline
		}
		t := g.cfg.Clock.NewTimer(until.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return true
		case <-t.C():
		}
	}
}
