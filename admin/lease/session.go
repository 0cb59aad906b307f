package lease

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// # Sessions
//
// A session (admin/fsm/session.go) is renewed and expired here exactly as a
// lease is, with one entry per session instead of one per mailbox: its
// leases are mirrored but never queued, so a keepalive costs O(log
// sessions) whatever the number of leases, and an expiry is one request
// naming the session, which the FSM turns into the removal of all its leases
// in one entry. The safety argument above carries over word for word with
// "heartbeat" read as "keepalive": the server answers a keepalive only under
// the same leadership confirmation, Promote gives every session ttl +
// ExtendOnPromote, and a session is requested for expiry only after expires
// + grace on the primary's clock. So a holder that stops serving at ttl
// after it sent its last acknowledged keepalive stops before any of the
// session's mailboxes can be granted to anyone else.
//
// A keepalive that arrives in time is never refused for load, and counts
// from its arrival however long it queued (arrival.go).
//
// A session's grace is the largest of its leases' graces (each lease has its
// namespace's, config.lease.grace, or the admin default), or the session's
// own (the default) while it holds none. Expiry ends every lease of a
// session in one entry, so one grace must serve them all, and the largest
// is the one that ends no lease before its own namespace's grace has
// passed: a namespace that asks for more slack against clock drift and
// pauses gets it, at the price of the session's other leases lasting that
// much longer after a holder went silent. A shorter grace of some namespace
// is honoured only when every lease of the session has it.

type sessionEntry struct {
	session       *adminv1.Session
	expires       time.Time
	lastKeepAlive time.Time
	// counted is the arrival of the latest keepalive renewed on this node
	// (see Renew).
	counted   time.Time
	requested time.Time
	// graces counts the session's leases by grace; maxGrace is the
	// largest (see Sessions above).
	graces   map[time.Duration]int
	maxGrace time.Duration
	slot
}

func newSessionEntry(s *adminv1.Session) *sessionEntry {
	return &sessionEntry{
		session: s, expires: s.GetExpiresAt().AsTime(), lastKeepAlive: s.GetOpenedAt().AsTime(),
		graces: map[time.Duration]int{}, slot: slot{idx: -1},
	}
}

// grace is how long after expires the session may be ended.
func (e *sessionEntry) grace() time.Duration {
	if len(e.graces) == 0 {
		return e.session.GetGrace().AsDuration()
	}
	return e.maxGrace
}

func (e *sessionEntry) deadline() time.Time { return e.expires.Add(e.grace()) }

// attach counts lease e's grace in its session, if it has one.
func (l *Lessor) attach(e *entry) {
	if s, ok := l.sessions[e.lease.GetSessionId()]; ok {
		s.graces[e.lease.GetGrace().AsDuration()]++
		l.graceChanged(s)
	}
}

// detach undoes attach.
func (l *Lessor) detach(e *entry) {
	s, ok := l.sessions[e.lease.GetSessionId()]
	if !ok {
		return
	}
	g := e.lease.GetGrace().AsDuration()
	if s.graces[g]--; s.graces[g] <= 0 {
		delete(s.graces, g)
	}
	l.graceChanged(s)
}

// reattach counts every mirrored lease's grace in its session again, after
// a restore replaced either table.
func (l *Lessor) reattach() {
	for _, s := range l.sessions {
		clear(s.graces)
	}
	for _, e := range l.leases {
		if s, ok := l.sessions[e.lease.GetSessionId()]; ok {
			s.graces[e.lease.GetGrace().AsDuration()]++
		}
	}
	for _, s := range l.sessions {
		l.graceChanged(s)
	}
}

// graceChanged recomputes s's largest grace and, while it is queued and no
// expiry is requested, moves it to its new deadline.
func (l *Lessor) graceChanged(s *sessionEntry) {
	s.maxGrace = 0
	for g := range s.graces {
		s.maxGrace = max(s.maxGrace, g)
	}
	if s.idx >= 0 && s.requested.IsZero() {
		s.next = s.deadline()
		heap.Fix(&l.sessionQueue, s.idx)
	}
}

var _ fsm.SessionObserver = (*Lessor)(nil)

// SessionOpened implements fsm.SessionObserver. The open's expires_at was
// stamped by the leader that proposed it, so a primary starts from there.
func (l *Lessor) SessionOpened(s *adminv1.Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropSession(s.GetId())
	e := newSessionEntry(s)
	l.sessions[s.GetId()] = e
	if l.primary {
		l.trackSession(e)
	}
}

// SessionClosed implements fsm.SessionObserver. The FSM has reported the
// removal of each of the session's leases before.
func (l *Lessor) SessionClosed(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropSession(id)
}

// SessionsRestored implements fsm.SessionObserver. A primary gives restored
// sessions a full ttl plus the extension, as on promotion.
func (l *Lessor) SessionsRestored(sessions []*adminv1.Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sessions = make(map[uint64]*sessionEntry, len(sessions))
	for _, s := range sessions {
		l.sessions[s.GetId()] = newSessionEntry(s)
	}
	l.reattach()
	if l.primary {
		l.refreshSessions(l.cfg.Clock.Now())
	}
}

func (l *Lessor) dropSession(id uint64) {
	e, ok := l.sessions[id]
	if !ok {
		return
	}
	if e.idx >= 0 {
		heap.Remove(&l.sessionQueue, e.idx)
	}
	delete(l.sessions, id)
}

func (l *Lessor) trackSession(e *sessionEntry) {
	e.requested = time.Time{}
	e.next = e.deadline()
	heap.Push(&l.sessionQueue, e)
}

func (l *Lessor) refreshSessions(now time.Time) {
	l.sessionQueue = l.sessionQueue[:0]
	for _, e := range l.sessions {
		e.expires = now.Add(e.session.GetTtl().AsDuration() + l.cfg.ExtendOnPromote)
		e.requested = time.Time{}
		e.next = e.deadline()
		e.idx = len(l.sessionQueue)
		l.sessionQueue = append(l.sessionQueue, e)
	}
	heap.Init(&l.sessionQueue)
}

// Sessions is the number of sessions mirrored.
func (l *Lessor) Sessions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sessions)
}

func keepAliveRefusal(reason adminv1.LeaseRefusalReason, msg string) *adminv1.KeepAliveSessionResponse {
	return &adminv1.KeepAliveSessionResponse{Refusal: &adminv1.LeaseRefusal{Reason: reason, Message: msg}}
}

// KeepAlive renews a session received as rc, and so every lease it holds:
// expires = arrival + ttl if it is open, belongs to the named proxy and was
// not past expires + grace when the keepalive arrived (arrival.go). A
// session of another proxy is an error wrapping fsm.ErrSessionNotOwned
// (PermissionDenied); the rest are typed refusals.
func (l *Lessor) KeepAlive(rc *Receipt, req *adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error) {
	at := rc.At()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary {
		return keepAliveRefusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, "this node does not renew sessions; send keepalives to the leader"), nil
	}
	e, ok := l.sessions[req.GetSessionId()]
	if !ok {
		return keepAliveRefusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION,
			fmt.Sprintf("proxy %s has no session %d (closed, expired or never opened); open a new one", req.GetProxyId(), req.GetSessionId())), nil
	}
	if e.session.GetProxyId() != req.GetProxyId() {
		return nil, fmt.Errorf("keepalive: session %d is not proxy %s's: %w", req.GetSessionId(), req.GetProxyId(), fsm.ErrSessionNotOwned)
	}
	// An expiry already requested may commit whatever arrives now; a
	// receipt that arrived in time held it off (arrival.go).
	if at.After(l.deadlineWith(arrivalKey{session: req.GetSessionId()}, e.deadline(), at, e.session.GetTtl().AsDuration()+e.grace())) || !e.requested.IsZero() {
		return keepAliveRefusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED,
			fmt.Sprintf("session %d expired at %s (+grace); stop serving its mailboxes and open a new one", req.GetSessionId(), e.expires.UTC().Format(time.RFC3339Nano))), nil
	}
	ttl := e.session.GetTtl().AsDuration()
	if !at.Before(e.counted) {
		e.expires, e.lastKeepAlive, e.counted = at.Add(ttl), at, at
	}
	e.requested = time.Time{}
	e.next = e.deadline()
	heap.Fix(&l.sessionQueue, e.idx)
	return &adminv1.KeepAliveSessionResponse{Renewed: true, ExpiresAt: timestamppb.New(e.expires), Ttl: durationpb.New(ttl)}, nil
}

// ExpiredSessions returns the sessions past expires + grace, oldest deadline
// first, under the same rate limit as Expired and with the same exception
// for keepalives that arrived in time and are still being processed. The caller commits them as
// one ExpireSessionsCommand; each is offered again after ExpiryRetry unless
// the FSM ends it before then.
func (l *Lessor) ExpiredSessions() []uint64 {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary {
		return nil
	}
	var out []uint64
	for len(l.sessionQueue) > 0 {
		e := l.sessionQueue[0]
		if !now.After(e.next) {
			break
		}
		if d := l.deadlineWith(arrivalKey{session: e.session.GetId()}, e.deadline(), time.Time{}, e.session.GetTtl().AsDuration()+e.grace()); !now.After(d) {
			e.next = d
			heap.Fix(&l.sessionQueue, 0)
			continue
		}
		if !l.limiter.AllowN(now, 1) {
			break
		}
		out = append(out, e.session.GetId())
		e.requested = now
		e.next = now.Add(l.cfg.ExpiryRetry)
		heap.Fix(&l.sessionQueue, 0)
	}
	return out
}

// sessionQueue is a min-heap on next, ties by session id.
type sessionQueue = deadlineQueue[*sessionEntry]

func (e *sessionEntry) tieBefore(o *sessionEntry) bool { return e.session.GetId() < o.session.GetId() }

// ValidateKeepAlive checks a keepalive request before KeepAlive.
func ValidateKeepAlive(req *adminv1.KeepAliveSessionRequest) error {
	if err := mesh.ValidateProxyID(req.GetProxyId()); err != nil {
		return err
	}
	if req.GetSessionId() == 0 {
		return fmt.Errorf("%w: session_id: zero", fsm.ErrInvalid)
	}
	return nil
}
