package agent

import (
	"sync"
	"time"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// validity is a granted lease as the hold loop (hold.go) follows it: the
// one thing that differs between a lease held on its own (mailboxLease,
// renewed by its own heartbeats) and a lease of a session (sessionLease,
// renewed by the session's keepalives). Both are valid until ttl after the
// send of the last renewal the admin acknowledged
// (docs/architecture.md#client-side-stop), and both judge the runner by
// probes of its stats (docs/architecture.md#dead-runner).
type validity interface {
	// renewable is what the lease's validity is: its own, or its session's.
	renewable() *renewable
	// probes are the probes of the runner the hold loop judges it by.
	probes() *probeBoard
	// renewDue starts the renewal the hold loop owes at now, if one is
	// due, and says when the next one is due (zero when none is the hold
	// loop's to start, or one is in flight) and a channel closed when that
	// changes.
	renewDue(now time.Time) (next time.Time, changed <-chan struct{})
	// serve says the runner serves under the lease from now; the func it
	// returns ends that, and once it returned no renewal extends the
	// runner's deadline for this lease any more.
	serve() (unserve func())
	// renewed follows every renewal while the runner serves, the lease
	// valid until until: the runner's deadline is extended (a lease on its
	// own), or left to the session's one extension of all its mailboxes.
	renewed(until time.Time)
}

// renewable is the validity of what the sidecar renews, a session or a lease
// held on its own: ttl after the send of the last renewal the admin
// acknowledged. renewed is closed and replaced at every acknowledged
// renewal, lost closed once when it is lost; the hold loops wait on both.
type renewable struct {
	// id is the session's; 0 for a lease held on its own.
	id uint64
	// every is how often it is renewed: at least twice before its ttl runs
	// out, whatever was configured.
	every time.Duration

	mu                     sync.Mutex
	ttl                    time.Duration
	lastAckSent, until     time.Time
	renewedCh, lostCh      chan struct{}
	lostReason, lostDetail string
}

func newRenewable(id uint64, sentAt time.Time, ttl, every time.Duration) *renewable {
	return &renewable{
		id: id, every: every, ttl: ttl, lastAckSent: sentAt, until: sentAt.Add(ttl),
		renewedCh: make(chan struct{}), lostCh: make(chan struct{}),
	}
}

// what names its renewals, for the logs.
func (g *renewable) what() string {
	if g.id != 0 {
		return "session keepalive"
	}
	return "heartbeat"
}

// window is a renewable's validity at one moment.
type window struct {
	ttl                time.Duration
	lastAckSent, until time.Time
	// renewed is closed at the next renewal, lost once it is lost.
	renewed, lost <-chan struct{}
}

func (g *renewable) window() window {
	g.mu.Lock()
	defer g.mu.Unlock()
	return window{ttl: g.ttl, lastAckSent: g.lastAckSent, until: g.until, renewed: g.renewedCh, lost: g.lostCh}
}

// renew records a renewal sent at sentAt that the admin acknowledged with
// ttl (0: its own). The deadline never moves back: an answer that
// overtook an earlier one counts from its own send.
func (g *renewable) renew(sentAt time.Time, ttl time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ttl > 0 {
		g.ttl = ttl
	}
	g.lastAckSent = sentAt
	if at := sentAt.Add(g.ttl); at.After(g.until) {
		g.until = at
	}
	close(g.renewedCh)
	g.renewedCh = make(chan struct{})
}

// lose marks it lost with why; false if it already was.
func (g *renewable) lose(reason, detail string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.lostCh:
		return false
	default:
	}
	g.lostReason, g.lostDetail = reason, detail
	close(g.lostCh)
	return true
}

// lostWhy is why it was lost, once lost is closed.
func (g *renewable) lostWhy() (reason, detail string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lostReason, g.lostDetail
}

// probeResult is one stats probe of the runner, and the runner's silence
// with it counted (nil err: it answered).
type probeResult struct {
	sentAt  time.Time
	silence silence
	// mailboxes is the runner's status of each mailbox it has, by id; nil
	// when its answer tells nothing of them.
	mailboxes map[string]*runnerv1.MailboxStatus
	err       error
	// final: the runner is given up on, and nothing renews the lease after
	// this probe (a lease on its own sends no heartbeat for it).
	final bool
}

// probeBoard holds the latest probe of the runner for the hold loops that
// follow it.
type probeBoard struct {
	mu     sync.Mutex
	last   probeResult
	probed chan struct{} // closed and replaced by every probe
}

func newProbeBoard() *probeBoard { return &probeBoard{probed: make(chan struct{})} }

func (b *probeBoard) publish(r probeResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last = r
	close(b.probed)
	b.probed = make(chan struct{})
}

// latest is the latest probe and the channel closed by the next one.
func (b *probeBoard) latest() (probeResult, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last, b.probed
}
