package lease

import (
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
// lease is, by the same lifetime rules (lifetime.go), with one lifetime per session
// instead of one per mailbox: its
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
	session *adminv1.Session
	// graces counts the session's leases by grace; the lifetime's grace is
	// the largest, or the session's own while it holds none (see Sessions
	// above).
	graces map[time.Duration]int
	lifetime
}

func newSessionEntry(s *adminv1.Session) *sessionEntry {
	return &sessionEntry{session: s, graces: map[time.Duration]int{}, lifetime: lifetime{
		key: arrivalKey{session: s.GetId()}, ttl: s.GetTtl().AsDuration(), grace: s.GetGrace().AsDuration(),
		expires: s.GetExpiresAt().AsTime(), last: s.GetOpenedAt().AsTime(), idx: -1,
	}}
}

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

// graceChanged recomputes s's grace and, while it is queued and no expiry
// is requested, moves it to its new deadline.
func (l *Lessor) graceChanged(s *sessionEntry) {
	s.grace = s.session.GetGrace().AsDuration()
	if len(s.graces) > 0 {
		s.grace = 0
		for g := range s.graces {
			s.grace = max(s.grace, g)
		}
	}
	l.sessionQueue.reschedule(&s.lifetime)
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
		l.sessionQueue.track(&e.lifetime)
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
		l.sessionQueue.refill(lifetimes(l.sessions), l.cfg.Clock.Now(), l.cfg.ExtendOnPromote)
	}
}

func (l *Lessor) dropSession(id uint64) {
	e, ok := l.sessions[id]
	if !ok {
		return
	}
	l.sessionQueue.remove(&e.lifetime)
	delete(l.sessions, id)
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
	if !l.renew(&l.sessionQueue, &e.lifetime, at) {
		return keepAliveRefusal(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED,
			fmt.Sprintf("session %d expired at %s (+grace); stop serving its mailboxes and open a new one", req.GetSessionId(), e.expires.UTC().Format(time.RFC3339Nano))), nil
	}
	return &adminv1.KeepAliveSessionResponse{Renewed: true, ExpiresAt: timestamppb.New(e.expires), Ttl: durationpb.New(e.ttl)}, nil
}

// ExpiredSessions returns the sessions that are due by the rule of Expired
// (lifetime.go), under the same rate limit, oldest deadline first. The caller
// commits them as one ExpireSessionsCommand; each is offered again after
// ExpiryRetry unless the FSM ends it before then.
func (l *Lessor) ExpiredSessions() []uint64 {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary {
		return nil
	}
	var out []uint64
	for _, c := range l.due(&l.sessionQueue, now) {
		out = append(out, c.key.session)
	}
	return out
}

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
