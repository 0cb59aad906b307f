package agent

import (
	"strings"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// State is where a mailbox's lease is, as the sidecar sees it.
type State string

const (
	// StateOpening: asking the runner to record the mailbox.
	StateOpening State = "opening"
	// StateAcquiring: the runner has the mailbox (not serving); no lease.
	StateAcquiring State = "acquiring"
	// StateActive: lease held, runner consuming and serving under Epoch.
	StateActive State = "active"
	// StateFenced: the lease may be lost; the runner was stopped and the
	// sidecar is acquiring again.
	StateFenced State = "fenced"
)

// LeaseView is one mailbox's lease as the sidecar holds it.
type LeaseView struct {
	MailboxID string
	Namespace string
	State     State
	// Epoch of the current (or, once fenced, the last) grant.
	Epoch uint64
	// LastAckSent is when the last acknowledged heartbeat (or the acquire)
	// was sent; FenceAt = LastAckSent + ttl.
	LastAckSent, FenceAt time.Time
	TTL                  time.Duration
	// SessionID is the session the lease belongs to; 0 for a lease held
	// on its own (LeaseModeMailbox).
	SessionID uint64
	// Role is what the assignment asks of the proxy (docs/architecture.md#moves): serving,
	// catching up as a move's destination, or handing off as its source.
	// Every role holds the lease and serves the mailbox alike; only the
	// drain (drain.go) tells them apart.
	Role adminv1.AssignmentRole
	// OpenFailures counts the runner's consecutive refusals to open the
	// mailbox (its store would not open: damaged, out of space), OpenError
	// the last one; both are cleared by an open that succeeds. From
	// OpenFailuresReported on, the proxy heartbeat reports the namespace
	// open_failed, and the admin places it elsewhere for a while.
	OpenFailures int
	OpenError    string
}

// OpenFailuresReported is how many consecutive open failures of a mailbox
// the sidecar waits for before it reports the namespace open_failed: one
// may be a passing error, a few in a row under backoff are the store's.
const OpenFailuresReported = 3

// maxOpenErrorLen is the admin's bound on a reported open failure.
const maxOpenErrorLen = 1024

// storeOpenFailed reports whether err is the runner's answer that the
// mailbox's store failed to open (mailbox/control answers Internal), as
// opposed to the runner being unreachable or busy, which the runner probe
// judges.
func storeOpenFailed(err error) bool {
	return status.Code(err) == codes.Internal
}

// truncate cuts s to at most n bytes, still valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
