// Package lease is the leader's lease clock: it decides when a mailbox lease
// is renewed and when it is due to expire. It holds no authority of its own;
// grants, releases and expiries are FSM commands committed through Raft.
//
// # Heartbeats are leader-local renewals, not Raft writes
//
// The target is 10,000 leases heartbeating every second on a 3-node cluster
// with low heartbeat latency, while acquires stay under 5 ms at p99. As Raft
// writes, heartbeats would be 10,000 log entries per second, each replicated
// to a quorum and fsynced, and every acquire would queue behind them in the
// same log: heartbeat latency would be an fsync plus a network round trip and
// acquire p99 would track heartbeat load. As in etcd's lessor (and Consul's
// sessions), a renewal here is an in-memory update on the leader: O(log n),
// no disk, no network. Raft carries only what must be agreed on: grants,
// releases and expiries (and proxy heartbeats, which are few). Renewals reach
// the replicated state in periodic, batched checkpoints (Checkpoints), which
// keep followers' lease listings and runner stats recent; correctness never
// depends on them.
//
// # Why that is safe across leader changes
//
// Only the primary (the Raft leader's lessor) renews or expires. When a node
// becomes leader, Promote sets every lease to expire at now + ttl +
// ExtendOnPromote (the election timeout), whatever the old leader knew: the
// new leader has heard no heartbeats yet and must not expire anyone for that.
// A lease leaves the FSM only by an expire command the primary requests after
// expires + grace has passed without a renewal, so nobody else can be granted
// the mailbox before then.
//
// The sidecar stops serving at ttl after it sent its last acknowledged
// heartbeat (time s). The leader that acknowledged it renewed at r >= s, so on
// that leader the lease lasts until r + ttl + grace > s + ttl. If a new leader
// was promoted at p, the lease lasts until p + ttl + ExtendOnPromote + grace,
// which is later than s + ttl unless s > p + ExtendOnPromote + grace, i.e.
// unless a deposed leader kept acknowledging heartbeats for longer than an
// election timeout after its successor took over. raft's own view that this
// node leads cannot rule that out: a leader paused past the election timeout
// still believes it leads when it resumes. So the server renews only under a
// quorum's confirmation of its term from a round that started less than
// LeaderLease (ExtendOnPromote / 2) before the request was dequeued
// (admin/leadership): the successor was elected after that round started,
// so s < p + ExtendOnPromote/2, whatever the pause. The other half of the
// election timeout and grace absorb clock-rate drift (with drift at most rho
// the condition is Lease*(1+rho) + 2*rho*ttl <= (ExtendOnPromote +
// grace)*(1-rho)). So the holder always stops first, and epochs make any
// overlap visible.
//
// # Expiry produces requests only
//
// Expired returns the leases that are due, rate-limited (ExpiryRate per
// second) so a leader that finds thousands of dead leases at once does not
// flood the log. The caller commits them as one ExpireLeasesCommand naming
// each lease's epoch; the FSM ignores any that were re-granted meanwhile. A
// request that is not committed (lost leadership, timeout) is offered again
// after ExpiryRetry.
//
// # Wiring
//
// Every node passes its Lessor to fsm.New as the lease observer, so the
// mirror is exact on every node whatever Raft replays or restores. Promote
// runs when the node becomes leader and has applied all earlier entries
// (after a barrier), with ExtendOnPromote set to the raft election timeout;
// Demote runs as soon as it stops being leader, and heartbeats are answered
// only under a leadership confirmation (admin/leadership). The leader loop calls Expired
// (e.g. every 100 ms), Checkpoints (e.g. every few seconds, in batches) and
// StaleProxies, and commits what they return.
package lease

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"
)

// Config configures a Lessor.
type Config struct {
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// ExtendOnPromote is added to every lease's ttl on Promote: the
	// election timeout, during which no heartbeat could reach a leader.
	ExtendOnPromote time.Duration
	// ExpiryRate limits expire requests per second (default 1000, etcd's
	// revoke rate); ExpiryBurst is the bucket size (default ExpiryRate).
	ExpiryRate  float64
	ExpiryBurst int
	// ExpiryRetry is how long a requested expire may stay uncommitted
	// before it is requested again (default 3 s).
	ExpiryRetry time.Duration
	Logger      *slog.Logger
}

// Lessor mirrors the FSM's lease table (as its fsm.LeaseObserver, on every
// node) and, while primary, tracks renewals and expiry.
type Lessor struct {
	cfg     Config
	log     *slog.Logger
	limiter *rate.Limiter

	mu         sync.Mutex
	primary    bool
	promotedAt time.Time
	leases     map[string]*entry
	// solo holds the leases of no session, the only ones queued: Promote
	// walks them, not the sessions' leases, which may be far more.
	solo map[string]*entry
	// queue orders the lifetimes of solo by their next action time (lifetime.go);
	// only while primary.
	queue lifetimeQueue
	// dirty holds leases renewed since their last checkpoint.
	dirty map[string]struct{}
	// sessions mirrors the FSM's sessions (session.go); sessionQueue
	// orders their lifetimes by next action time, only while primary. A
	// session's leases are in leases but never in queue: they live as long
	// as it.
	sessions     map[uint64]*sessionEntry
	sessionQueue lifetimeQueue
	// arrivals are the open receipts' times by lease or session
	// (arrival.go): renewals received and not yet done with.
	arrivals map[arrivalKey][]time.Time
}

type entry struct {
	// lease is the FSM's row (immutable): holder, epoch, ttl, grace.
	lease *adminv1.Lease
	stats *adminv1.LeaseStats
	lifetime
}

func newEntry(ls *adminv1.Lease) *entry {
	return &entry{lease: ls, stats: ls.GetStats(), lifetime: lifetime{
		key: arrivalKey{mailbox: ls.GetMailboxId()}, ttl: ls.GetTtl().AsDuration(), grace: ls.GetGrace().AsDuration(),
		expires: ls.GetExpiresAt().AsTime(), last: ls.GetLastHeartbeatAt().AsTime(), idx: -1,
	}}
}

var _ fsm.LeaseObserver = (*Lessor)(nil)

// New returns a non-primary lessor with no leases.
func New(cfg Config) *Lessor {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ExpiryRate <= 0 {
		cfg.ExpiryRate = 1000
	}
	if cfg.ExpiryBurst <= 0 {
		cfg.ExpiryBurst = int(cfg.ExpiryRate)
	}
	if cfg.ExpiryRetry <= 0 {
		cfg.ExpiryRetry = 3 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Lessor{
		cfg:     cfg,
		log:     log,
		limiter: rate.NewLimiter(rate.Limit(cfg.ExpiryRate), cfg.ExpiryBurst),
		leases:  map[string]*entry{},
		solo:    map[string]*entry{},
		dirty:   map[string]struct{}{},

		sessions: map[uint64]*sessionEntry{},
		arrivals: map[arrivalKey][]time.Time{},
	}
}

// LeaseGranted implements fsm.LeaseObserver. The grant's expires_at was
// stamped by the leader that proposed it, so a primary starts from there.
func (l *Lessor) LeaseGranted(ls *adminv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop(ls.GetMailboxId())
	e := newEntry(ls)
	l.leases[ls.GetMailboxId()] = e
	if ls.GetSessionId() == 0 {
		l.solo[ls.GetMailboxId()] = e
	}
	l.attach(e)
	if l.primary && ls.GetSessionId() == 0 {
		l.queue.track(&e.lifetime)
	}
}

// LeaseRemoved implements fsm.LeaseObserver.
func (l *Lessor) LeaseRemoved(mailboxID string, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.leases[mailboxID]; ok && e.lease.GetEpoch() == epoch {
		l.drop(mailboxID)
	}
}

// LeasesRestored implements fsm.LeaseObserver. A primary treats restored
// leases as it does on promotion: full ttl plus the extension.
func (l *Lessor) LeasesRestored(leases []*adminv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leases = make(map[string]*entry, len(leases))
	l.solo = map[string]*entry{}
	l.dirty = map[string]struct{}{}
	for _, ls := range leases {
		e := newEntry(ls)
		l.leases[ls.GetMailboxId()] = e
		if ls.GetSessionId() == 0 {
			l.solo[ls.GetMailboxId()] = e
		}
	}
	l.reattach()
	if l.primary {
		l.refresh()
	}
}

func (l *Lessor) drop(mailboxID string) {
	e, ok := l.leases[mailboxID]
	if !ok {
		return
	}
	l.queue.remove(&e.lifetime)
	l.detach(e)
	delete(l.leases, mailboxID)
	delete(l.solo, mailboxID)
	delete(l.dirty, mailboxID)
}

// refresh gives every lease of no session and every session a full ttl
// plus the promotion extension (lifetimeQueue.refill).
func (l *Lessor) refresh() {
	now := l.cfg.Clock.Now()
	l.queue.refill(lifetimes(l.solo), now, l.cfg.ExtendOnPromote)
	l.sessionQueue.refill(lifetimes(l.sessions), now, l.cfg.ExtendOnPromote)
}

// Promote makes this lessor primary; call it when the node becomes leader,
// before it answers heartbeats.
func (l *Lessor) Promote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.primary = true
	l.promotedAt = l.cfg.Clock.Now()
	l.refresh()
	l.log.Info("lessor promoted", "leases", len(l.leases), "extend", l.cfg.ExtendOnPromote)
}

// Demote stops renewals and expiry; call it when the node stops being
// leader. Lease mirroring continues.
func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.primary = false
	l.queue.clear()
	clear(l.dirty)
	l.sessionQueue.clear()
}

// Primary reports whether the lessor renews and expires.
func (l *Lessor) Primary() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.primary
}

// Len is the number of leases mirrored.
func (l *Lessor) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.leases)
}

func refusal(reason adminv1.LeaseRefusalReason, msg string, cur *adminv1.Lease) *adminv1.MailboxHeartbeatResponse {
	r := &adminv1.LeaseRefusal{Reason: reason, Message: msg}
	if cur != nil {
		r.Current = proto.CloneOf(cur)
	}
	return &adminv1.MailboxHeartbeatResponse{Refusal: r}
}

// Renew handles a mailbox heartbeat received as rc: expires = arrival + ttl
// if the caller holds the lease and it was not past expires + grace when the
// heartbeat arrived (arrival.go); otherwise a typed refusal. Input
// validation is the server's job; Renew only judges the lease.
func (l *Lessor) Renew(rc *Receipt, req *adminv1.MailboxHeartbeatRequest) *adminv1.MailboxHeartbeatResponse {
	at := rc.At()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary {
		return refusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, "this node does not renew leases; send heartbeats to the leader", nil)
	}
	e, ok := l.leases[req.GetMailboxId()]
	if !ok {
		return refusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE, "mailbox "+req.GetMailboxId()+" has no lease; acquire it", nil)
	}
	if r := fsm.HolderRefusal(e.lease, req.GetRunnerId(), req.GetEpoch()); r != nil {
		return &adminv1.MailboxHeartbeatResponse{Refusal: r}
	}
	if sid := e.lease.GetSessionId(); sid != 0 {
		return refusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION,
			fmt.Sprintf("lease of %s belongs to session %d: renew the session (KeepAliveSession), not the lease", req.GetMailboxId(), sid), e.lease)
	}
	if !l.renew(&l.queue, &e.lifetime, at) {
		return refusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED,
			"lease of "+req.GetMailboxId()+" expired at "+e.expires.UTC().Format(time.RFC3339Nano)+" (+grace); stop serving and acquire again", e.lease)
	}
	if req.GetStats() != nil {
		e.stats = req.GetStats()
	}
	l.dirty[req.GetMailboxId()] = struct{}{}
	return &adminv1.MailboxHeartbeatResponse{
		Renewed:   true,
		ExpiresAt: timestamppb.New(e.expires),
		Ttl:       durationpb.New(e.ttl),
		Epoch:     e.lease.GetEpoch(),
	}
}

// Expired returns the leases of no session that are due (lifetime.go: past
// expires + grace, rate-limited, none a heartbeat arrived in time for and
// is still being processed), oldest deadline first. Each is offered again
// after ExpiryRetry unless the FSM removes it (or it is renewed, which a
// holder cannot do once it is due) before then.
func (l *Lessor) Expired() []*adminv1.LeaseRef {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary {
		return nil
	}
	var out []*adminv1.LeaseRef
	for _, c := range l.due(&l.queue, now) {
		out = append(out, &adminv1.LeaseRef{MailboxId: c.key.mailbox, Epoch: l.leases[c.key.mailbox].lease.GetEpoch()})
	}
	return out
}

// Checkpoints returns up to max leases renewed since their last checkpoint,
// sorted by mailbox id, and forgets them. The caller commits them as a
// CheckpointLeasesCommand; a lost checkpoint only delays what followers see.
func (l *Lessor) Checkpoints(max int) []*adminv1.LeaseCheckpoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary || max <= 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(l.dirty))
	ids = ids[:min(max, len(ids))]
	out := make([]*adminv1.LeaseCheckpoint, 0, len(ids))
	for _, id := range ids {
		delete(l.dirty, id)
		e := l.leases[id]
		out = append(out, &adminv1.LeaseCheckpoint{
			MailboxId:       id,
			Epoch:           e.lease.GetEpoch(),
			ExpiresAt:       timestamppb.New(e.expires),
			LastHeartbeatAt: timestamppb.New(e.last),
			Stats:           e.stats,
		})
	}
	return out
}

// Annotate returns a copy of ls with the primary's live expiry, last
// heartbeat and stats when it tracks that grant; otherwise ls itself. Reads
// on the leader use it so listings show renewals not yet checkpointed.
func (l *Lessor) Annotate(ls *adminv1.Lease) *adminv1.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.leases[ls.GetMailboxId()]
	if !l.primary || !ok || e.lease.GetEpoch() != ls.GetEpoch() {
		return ls
	}
	out := proto.CloneOf(ls)
	if s, ok := l.sessions[ls.GetSessionId()]; ok {
		out.ExpiresAt = timestamppb.New(s.expires)
		out.LastHeartbeatAt = timestamppb.New(s.last)
		return out
	}
	out.ExpiresAt = timestamppb.New(e.expires)
	out.LastHeartbeatAt = timestamppb.New(e.last)
	if e.stats != nil {
		out.Stats = proto.CloneOf(e.stats)
	}
	return out
}

// StaleProxies returns the live proxies not seen for staleAfter, for a
// MarkProxiesStaleCommand. Like leases, proxies get a full staleAfter from
// promotion: while there was no leader they could not heartbeat.
func (l *Lessor) StaleProxies(proxies []*adminv1.Proxy, staleAfter time.Duration) []*adminv1.ProxyRef {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	primary, promotedAt := l.primary, l.promotedAt
	l.mu.Unlock()
	if !primary {
		return nil
	}
	var out []*adminv1.ProxyRef
	for _, p := range proxies {
		if p.GetStatus() != adminv1.ProxyStatus_PROXY_STATUS_LIVE {
			continue
		}
		seen := p.GetLastSeen().AsTime()
		if promotedAt.After(seen) {
			seen = promotedAt
		}
		if now.Sub(seen) > staleAfter {
			out = append(out, &adminv1.ProxyRef{ProxyId: p.GetRegistration().GetProxyId(), LastSeen: p.GetLastSeen()})
		}
	}
	return out
}
