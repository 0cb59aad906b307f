package fsm

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Sessions (docs/architecture.md#sessions) are etcd's lessor leases, or
// Consul's and Chubby's sessions: one sidecar holds one session, its mailbox
// leases are attached to it, and one renewal of the session renews them all.
// Here, as for leases, the FSM holds only what must be agreed on: which
// sessions are open, for which proxy and runner, and which leases belong to
// each. Renewals and expiry are the leader's lessor's (package lease), which
// ends a silent session with an ExpireSessionsCommand.
//
// Fencing stays per mailbox: every lease of a session has its own epoch,
// allocated as epoch.go says, so a bulk grant of n mailboxes in one entry
// gives n distinct epochs, all above every earlier grant and below every
// later one.

// MaxBulkLeases bounds the mailboxes of one AcquireLeases or ReleaseLeases:
// a proxy hosts at most its share of the placement's partitions' namespaces,
// and one entry of this many leases stays well under raft's message sizes.
const MaxBulkLeases = 10_000

// ErrSessionNotOwned: the request names a session of another proxy (gRPC
// PermissionDenied). A proxy may use only its own sessions.
var ErrSessionNotOwned = errors.New("session belongs to another proxy")

// SessionObserver is implemented by a LeaseObserver that also mirrors
// sessions (package lease's Lessor). The FSM calls it like LeaseObserver: in
// log order, after the change, never with the FSM's lock held. A session's
// end is reported after the removal of each of its leases.
type SessionObserver interface {
	SessionOpened(s *adminv1.Session)
	SessionClosed(id uint64)
	SessionsRestored(sessions []*adminv1.Session)
}

// ExpireSessionsResult lists what an ExpireSessionsCommand ended.
type ExpireSessionsResult struct {
	Sessions []*adminv1.Session
	Leases   []*adminv1.Lease
}

func validateSessionRef(proxyID string, id uint64) error {
	if err := mesh.ValidateProxyID(proxyID); err != nil {
		return err
	}
	if id == 0 {
		return invalid("session_id", "zero")
	}
	return nil
}

func validateOpenSession(cmd *adminv1.Command) error {
	o := cmd.GetOpenSession()
	if err := mesh.ValidateProxyID(o.GetProxyId()); err != nil {
		return err
	}
	return validateHolder(o.GetRunnerId(), o.GetRunnerAddress(), o.GetTtl())
}

// validateMailboxList checks a bulk call's mailboxes: one to MaxBulkLeases,
// each a mailbox of proxyID, none twice.
func validateMailboxList(proxyID string, ids []string) error {
	if len(ids) == 0 || len(ids) > MaxBulkLeases {
		return invalid("mailbox_ids", "%d given, want 1 to %d", len(ids), MaxBulkLeases)
	}
	seen := make(map[string]struct{}, len(ids))
	for i, mid := range ids {
		id, err := mesh.ParseMailboxID(mid)
		if err != nil {
			return fmt.Errorf("mailbox_ids[%d]: %w", i, err)
		}
		if id.Proxy != proxyID {
			return invalid(fmt.Sprintf("mailbox_ids[%d]", i), "%s is not a mailbox of proxy %s", mid, proxyID)
		}
		if _, dup := seen[mid]; dup {
			return invalid("mailbox_ids", "%s listed twice", mid)
		}
		seen[mid] = struct{}{}
	}
	return nil
}

func validateCloseSession(cmd *adminv1.Command) error {
	c := cmd.GetCloseSession()
	return validateSessionRef(c.GetProxyId(), c.GetSessionId())
}

func validateAcquireLeases(cmd *adminv1.Command) error {
	a := cmd.GetAcquireLeases()
	if err := validateSessionRef(a.GetProxyId(), a.GetSessionId()); err != nil {
		return err
	}
	return validateMailboxList(a.GetProxyId(), a.GetMailboxIds())
}

func validateReleaseLeases(cmd *adminv1.Command) error {
	r := cmd.GetReleaseLeases()
	if err := validateSessionRef(r.GetProxyId(), r.GetSessionId()); err != nil {
		return err
	}
	return validateMailboxList(r.GetProxyId(), r.GetMailboxIds())
}

func validateExpireSessions(cmd *adminv1.Command) error {
	ids := cmd.GetExpireSessions().GetSessionIds()
	if len(ids) > MaxBulkLeases {
		return invalid("session_ids", "%d given, at most %d", len(ids), MaxBulkLeases)
	}
	for i, id := range ids {
		if id == 0 {
			return invalid(fmt.Sprintf("session_ids[%d]", i), "zero")
		}
	}
	return nil
}

func unknownSession(proxyID string, id uint64) *adminv1.LeaseRefusal {
	return &adminv1.LeaseRefusal{
		Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION,
		Message: fmt.Sprintf("proxy %s has no session %d (closed, expired or never opened); open a new one", proxyID, id),
	}
}

// ownSession finds session id of proxyID: nil if it is not open, an error
// if it is another proxy's.
func ownSession(st *state, proxyID string, id uint64) (*adminv1.Session, error) {
	s, ok := st.sessions[id]
	if !ok {
		return nil, nil
	}
	if s.GetProxyId() != proxyID {
		return nil, fmt.Errorf("session %d is not proxy %s's: %w", id, proxyID, ErrSessionNotOwned)
	}
	return s, nil
}

// applyOpenSession opens a session for the proxy's registered runner. Its id
// is a fencing token (allocEpochs), so ids never repeat, even across a cut
// log: an expire or close naming an old id cannot end a newer session. A
// proxy may hold several (a restarted sidecar opens a new one while its old
// one runs out); the server's quota bounds how many.
func applyOpenSession(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetOpenSession()
	p, ok := tx.st.proxies[req.GetProxyId()]
	if !ok {
		return nil, fmt.Errorf("open session for %s: %w", req.GetProxyId(), ErrProxyNotFound)
	}
	if want := registeredRunner(p.GetRegistration()); req.GetRunnerId() != want {
		return &adminv1.OpenSessionResponse{
			Refusal: &adminv1.LeaseRefusal{
				Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER,
				Message: fmt.Sprintf("proxy %s registered runner %s, not %s", req.GetProxyId(), want, req.GetRunnerId()),
			},
			Index: tx.index,
		}, nil
	}
	id, err := tx.allocEpochs(1)
	if err != nil {
		return nil, fmt.Errorf("open session for %s: %w", req.GetProxyId(), err)
	}
	ttl := orDefault(req.GetTtl().AsDuration(), DefaultLeaseTTL)
	s := &adminv1.Session{
		Id:            id,
		ProxyId:       req.GetProxyId(),
		RunnerId:      req.GetRunnerId(),
		RunnerAddress: req.GetRunnerAddress(),
		Ttl:           durationpb.New(ttl),
		Grace:         durationpb.New(DefaultLeaseGrace),
		OpenedAt:      cmd.GetNow(),
		ExpiresAt:     timestamppb.New(tx.now.Add(ttl)),
	}
	tx.st.sessions[id] = s
	tx.changed = true
	tx.events = append(tx.events, leaseEvent{opened: s})
	return &adminv1.OpenSessionResponse{Session: proto.CloneOf(s), Index: tx.index}, nil
}

// endSession removes s and every lease attached to it, in mailbox order.
func (tx *txn) endSession(s *adminv1.Session) []*adminv1.Lease {
	mids := slices.Sorted(maps.Keys(tx.st.sessionLeases[s.GetId()]))
	ended := make([]*adminv1.Lease, 0, len(mids))
	for _, mid := range mids {
		l := tx.st.leases[mid]
		tx.removeLease(l)
		ended = append(ended, l)
	}
	delete(tx.st.sessions, s.GetId())
	tx.changed = true
	tx.events = append(tx.events, leaseEvent{closed: s.GetId()})
	return ended
}

// applyCloseSession ends the session and its leases. A session that is gone
// already answers closed=false: the goal holds.
func applyCloseSession(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetCloseSession()
	s, err := ownSession(tx.st, req.GetProxyId(), req.GetSessionId())
	if err != nil {
		return nil, fmt.Errorf("close session: %w", err)
	}
	if s == nil {
		return &adminv1.CloseSessionResponse{Index: tx.index}, nil
	}
	ended := tx.endSession(s)
	return &adminv1.CloseSessionResponse{Closed: true, LeasesReleased: uint32(len(ended)), Index: tx.index}, nil
}

// applyAcquireLeases grants the listed mailboxes to the session's runner in
// the session: one grant (grant.go), each mailbox refused or granted as
// AcquireLease would. A mailbox the session's runner holds already, in this
// session, another or none, is a reconnect: a restarted sidecar's new
// session takes its mailboxes over from the old one, and a per-mailbox
// lease moves into the session.
func applyAcquireLeases(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetAcquireLeases()
	s, err := ownSession(tx.st, req.GetProxyId(), req.GetSessionId())
	if err != nil {
		return nil, fmt.Errorf("acquire leases: %w", err)
	}
	if s == nil {
		return &adminv1.AcquireLeasesResponse{Refusal: unknownSession(req.GetProxyId(), req.GetSessionId()), Index: tx.index}, nil
	}
	h := holder{runnerID: s.GetRunnerId(), runnerAddress: s.GetRunnerAddress(), session: s}
	results, err := tx.grant(cmd, h, req.GetMailboxIds())
	if err != nil {
		return nil, fmt.Errorf("acquire leases in session %d: %w", s.GetId(), err)
	}
	return &adminv1.AcquireLeasesResponse{Results: results, Index: tx.index}, nil
}

// applyReleaseLeases drops the listed leases the session holds. A mailbox
// with no lease is ok=false without a refusal (a retry, or it expired); one
// held outside this session is refused UNKNOWN_SESSION, naming the holder.
func applyReleaseLeases(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetReleaseLeases()
	s, err := ownSession(tx.st, req.GetProxyId(), req.GetSessionId())
	if err != nil {
		return nil, fmt.Errorf("release leases: %w", err)
	}
	if s == nil {
		return &adminv1.ReleaseLeasesResponse{Refusal: unknownSession(req.GetProxyId(), req.GetSessionId()), Index: tx.index}, nil
	}
	results := make([]*adminv1.MailboxLeaseResult, len(req.GetMailboxIds()))
	for i, mid := range req.GetMailboxIds() {
		results[i] = &adminv1.MailboxLeaseResult{MailboxId: mid}
		cur, ok := tx.st.leases[mid]
		switch {
		case !ok:
		case cur.GetSessionId() != s.GetId():
			results[i].Refusal = &adminv1.LeaseRefusal{
				Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION,
				Message: fmt.Sprintf("mailbox %s is held by runner %s in session %d (epoch %d), not in session %d", mid, cur.GetRunnerId(), cur.GetSessionId(), cur.GetEpoch(), s.GetId()),
				Current: proto.CloneOf(cur),
			}
		default:
			tx.removeLease(cur)
			results[i].Ok = true
		}
	}
	return &adminv1.ReleaseLeasesResponse{Results: results, Index: tx.index}, nil
}

// applyExpireSessions ends each named session that is still open, with its
// leases. The leader decided they were silent past ttl + grace; ids are
// never reused, so a stale decision can only name a session already gone.
func applyExpireSessions(tx *txn, cmd *adminv1.Command) (any, error) {
	res := &ExpireSessionsResult{}
	for _, id := range cmd.GetExpireSessions().GetSessionIds() {
		s, ok := tx.st.sessions[id]
		if !ok {
			continue
		}
		res.Leases = append(res.Leases, tx.endSession(s)...)
		res.Sessions = append(res.Sessions, s)
	}
	return res, nil
}

// sessionView is a stored session with its lease count filled in.
func (s *state) sessionView(sess *adminv1.Session) *adminv1.Session {
	out := proto.CloneOf(sess)
	out.LeaseCount = uint32(len(s.sessionLeases[sess.GetId()]))
	return out
}

func sortedSessions(m map[uint64]*adminv1.Session) []*adminv1.Session {
	out := make([]*adminv1.Session, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[id])
	}
	return out
}

// Sessions returns the open sessions sorted by id, with their lease counts.
func (f *FSM) Sessions() ([]*adminv1.Session, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]*adminv1.Session, 0, len(f.st.sessions))
	for _, s := range sortedSessions(f.st.sessions) {
		out = append(out, f.st.sessionView(s))
	}
	return out, f.applied
}

// SessionLeases returns session id's leases sorted by mailbox id (none if
// it has none or is not open): read from the session's own index, so it
// costs its leases, not the whole table.
func (f *FSM) SessionLeases(id uint64) ([]*adminv1.Lease, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	mids := slices.Sorted(maps.Keys(f.st.sessionLeases[id]))
	out := make([]*adminv1.Lease, 0, len(mids))
	for _, m := range mids {
		out = append(out, proto.CloneOf(f.st.leases[m]))
	}
	return out, f.applied
}

// Session returns session id, or nil.
func (f *FSM) Session(id uint64) (*adminv1.Session, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s, ok := f.st.sessions[id]
	if !ok {
		return nil, f.applied
	}
	return f.st.sessionView(s), f.applied
}

// ProxySessions is how many sessions proxy has open, for its quota.
func (f *FSM) ProxySessions(proxyID string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, s := range f.st.sessions {
		if s.GetProxyId() == proxyID {
			n++
		}
	}
	return n
}
