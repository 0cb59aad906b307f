package fsm

import (
	"fmt"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// Moves by handoff (make-before-break). A planned move of a namespace from
// its assigned proxy P to Q goes through replicated states only:
//
//	start:   incoming_proxy_id = Q; Q's sidecar sees CATCHING_UP, acquires
//	         ns@Q (placementRefusal lets the incoming proxy) and catches up,
//	         while the alias keeps resolving to ns@P.
//	switch:  assigned = Q, handoff_proxy_id = P until handoff_until; the alias
//	         resolves to ns@Q, P keeps serving ns@P as HANDING_OFF.
//	end:     the tail is over; P's assignment disappears and it releases.
//	abandon: incoming cleared; P never stopped serving.
//
// The FSM never reads a clock: the leader's mover (admin/server) decides
// when a move has caught up, when a tail is over, when a move has taken too
// long, and says so with a command, each of which checks that what it
// relies on still holds and otherwise changes nothing. Unplanned losses
// (a source going stale or its runner dying) stay break-before-make, in
// replace.

// MoveResult is what a move command did: Applied, or Refused saying why
// nothing changed (the state moved on since the command was proposed).
type MoveResult struct {
	Applied bool
	Refused string
}

func refusedMove(format string, args ...any) (*MoveResult, error) {
	return &MoveResult{Refused: fmt.Sprintf(format, args...)}, nil
}

// MoveObserver is told of every move's end, on every replica, in log order
// (for metrics). Like LeaseObserver it is called after the change, without
// the FSM's lock, and must not call back into the FSM.
type MoveObserver interface {
	// MoveSwitched reports a move's switch to its destination.
	MoveSwitched(namespace string, reason adminv1.MoveReason)
	// MoveAbandoned reports a move ended without a switch.
	MoveAbandoned(namespace string, reason adminv1.MoveAbandonReason)
}

// WithMoveObserver reports every move's end to o.
func WithMoveObserver(o MoveObserver) Option { return func(f *FSM) { f.moves = o } }

// moveEvent is one move's end for the MoveObserver: switched, else
// abandoned.
type moveEvent struct {
	namespace string
	switched  bool
	reason    adminv1.MoveReason
	abandon   adminv1.MoveAbandonReason
}

// serving reports whether p can serve what it holds: live and its runner
// ready. A namespace whose assigned proxy is not serving is reassigned at
// once; one whose proxy serves but is no longer its owner (a join, a
// cordon) moves by handoff.
func serving(p *adminv1.Proxy) bool {
	return p.GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_LIVE && !p.GetRunnerNotReady()
}

// targetRefusal says why p cannot be a move's destination, or "".
func targetRefusal(p *adminv1.Proxy) adminv1.MoveAbandonReason {
	switch {
	case p.GetStatus() != adminv1.ProxyStatus_PROXY_STATUS_LIVE:
		return adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_STALE
	case p.GetRunnerNotReady():
		return adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_NOT_READY
	case unschedulable(p):
		return adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_CORDONED
	}
	return adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_UNSPECIFIED
}

// moving reports whether n has a move in progress or a handoff tail: a
// namespace takes one move at a time, so the tail's proxy is never also a
// move's destination.
func moving(n *adminv1.Namespace) bool {
	return n.GetIncomingProxyId() != "" || n.GetHandoffProxyId() != ""
}

// startMove begins n's move to `to`; the caller checked it may.
func (tx *txn) startMove(n *adminv1.Namespace, to string, reason adminv1.MoveReason) {
	n = proto.CloneOf(n)
	n.IncomingProxyId = to
	n.MoveIndex = tx.index
	n.MoveStartedAt = tx.nowpb()
	n.MoveReason = reason
	tx.putNamespace(n)
}

// abandonMove ends n's move in progress without a switch and returns the
// stored record.
func (tx *txn) abandonMove(n *adminv1.Namespace, why adminv1.MoveAbandonReason) *adminv1.Namespace {
	n = proto.CloneOf(n)
	n.IncomingProxyId = ""
	n.MoveReason = adminv1.MoveReason_MOVE_REASON_UNSPECIFIED
	if n.GetHandoffProxyId() == "" {
		n.MoveIndex, n.MoveStartedAt = 0, nil
	}
	tx.putNamespace(n)
	tx.moveEvents = append(tx.moveEvents, moveEvent{namespace: n.GetName(), abandon: why})
	return n
}

func validateNamespaceRef(ns string) error { return mesh.ValidateNamespaceName(ns) }

func validateStartMove(cmd *adminv1.Command) error {
	m := cmd.GetStartMove()
	if err := validateNamespaceRef(m.GetNamespace()); err != nil {
		return err
	}
	return mesh.ValidateProxyID(m.GetToProxyId())
}

// applyStartMove starts an operator's (or any named) move. An operator's
// destination need not be the namespace's hash owner: the switch marks the
// namespace operator_placed, so rebalancing does not take it back.
func applyStartMove(tx *txn, cmd *adminv1.Command) (any, error) {
	m := cmd.GetStartMove()
	n, ok := tx.st.namespaces[m.GetNamespace()]
	switch {
	case !ok:
		return refusedMove("namespace %s does not exist", m.GetNamespace())
	case moving(n):
		return refusedMove("namespace %s has a move in progress (to %q, handoff from %q)", n.GetName(), n.GetIncomingProxyId(), n.GetHandoffProxyId())
	case n.GetAssignedProxyId() == "":
		return refusedMove("namespace %s is on no proxy; placement assigns it", n.GetName())
	case n.GetAssignedProxyId() == m.GetToProxyId():
		return refusedMove("namespace %s is already on %s", n.GetName(), m.GetToProxyId())
	}
	p, ok := tx.st.proxies[m.GetToProxyId()]
	if !ok {
		return refusedMove("proxy %s is not registered", m.GetToProxyId())
	}
	if why := targetRefusal(p); why != adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_UNSPECIFIED {
		return refusedMove("proxy %s cannot take namespaces: %s", m.GetToProxyId(), why)
	}
	if excluded(p, n.GetName()) {
		return refusedMove("proxy %s reported it cannot open namespace %s's mailbox; it is excluded from it until %s", m.GetToProxyId(), n.GetName(), healthEntry(p, n.GetName()).GetExcludedUntil().AsTime().Format(time.RFC3339))
	}
	reason := m.GetReason()
	if reason == adminv1.MoveReason_MOVE_REASON_UNSPECIFIED {
		reason = adminv1.MoveReason_MOVE_REASON_OPERATOR
	}
	tx.startMove(n, m.GetToProxyId(), reason)
	return &MoveResult{Applied: true}, nil
}

func validateSwitchMove(cmd *adminv1.Command) error {
	m := cmd.GetSwitchMove()
	if err := validateNamespaceRef(m.GetNamespace()); err != nil {
		return err
	}
	if err := mesh.ValidateProxyID(m.GetToProxyId()); err != nil {
		return err
	}
	if m.GetMoveIndex() == 0 {
		return invalid("move_index", "zero")
	}
	if m.GetHandoffUntil() == nil || m.GetHandoffUntil().CheckValid() != nil {
		return invalid("handoff_until", "missing or malformed")
	}
	return nil
}

// applySwitchMove makes the destination the assigned proxy if the move is
// still the one the mover judged caught up and the destination still holds
// its mailbox and may take namespaces.
func applySwitchMove(tx *txn, cmd *adminv1.Command) (any, error) {
	m := cmd.GetSwitchMove()
	n, ok := tx.st.namespaces[m.GetNamespace()]
	if !ok {
		return refusedMove("namespace %s does not exist", m.GetNamespace())
	}
	if n.GetIncomingProxyId() != m.GetToProxyId() || n.GetMoveIndex() != m.GetMoveIndex() {
		return refusedMove("namespace %s: move to %s at %d is not in progress (incoming %q at %d)",
			n.GetName(), m.GetToProxyId(), m.GetMoveIndex(), n.GetIncomingProxyId(), n.GetMoveIndex())
	}
	if why := targetRefusal(tx.st.proxies[m.GetToProxyId()]); why != adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_UNSPECIFIED {
		return refusedMove("namespace %s: destination %s: %s", n.GetName(), m.GetToProxyId(), why)
	}
	mid := mesh.MailboxID{Namespace: n.GetName(), Proxy: m.GetToProxyId()}.String()
	if _, ok := tx.st.leases[mid]; !ok {
		return refusedMove("namespace %s: %s holds no lease", n.GetName(), mid)
	}
	reason := n.GetMoveReason()
	n = proto.CloneOf(n)
	n.HandoffProxyId = n.GetAssignedProxyId()
	n.PriorProxyId = n.GetAssignedProxyId()
	n.HandoffUntil = m.GetHandoffUntil()
	n.AssignedProxyId = m.GetToProxyId()
	n.AssignmentIndex = tx.index
	n.IncomingProxyId = ""
	n.SwitchedAt = tx.nowpb()
	n.OperatorPlaced = reason == adminv1.MoveReason_MOVE_REASON_OPERATOR
	tx.putNamespace(n)
	tx.moveEvents = append(tx.moveEvents, moveEvent{namespace: n.GetName(), switched: true, reason: reason})
	return &MoveResult{Applied: true}, nil
}

func validateEndHandoff(cmd *adminv1.Command) error {
	m := cmd.GetEndHandoff()
	if err := validateNamespaceRef(m.GetNamespace()); err != nil {
		return err
	}
	if err := mesh.ValidateProxyID(m.GetHandoffProxyId()); err != nil {
		return err
	}
	if m.GetHandoffUntil() == nil || m.GetHandoffUntil().CheckValid() != nil {
		return invalid("handoff_until", "missing or malformed")
	}
	return nil
}

// applyEndHandoff ends the named tail once the command's leader time has
// reached its end.
func applyEndHandoff(tx *txn, cmd *adminv1.Command) (any, error) {
	m := cmd.GetEndHandoff()
	n, ok := tx.st.namespaces[m.GetNamespace()]
	switch {
	case !ok:
		return refusedMove("namespace %s does not exist", m.GetNamespace())
	case n.GetHandoffProxyId() != m.GetHandoffProxyId() || !proto.Equal(n.GetHandoffUntil(), m.GetHandoffUntil()):
		return refusedMove("namespace %s: the handoff from %s is not the current one (%q)", n.GetName(), m.GetHandoffProxyId(), n.GetHandoffProxyId())
	case tx.now.Before(n.GetHandoffUntil().AsTime()):
		return refusedMove("namespace %s: the handoff from %s lasts until %s", n.GetName(), m.GetHandoffProxyId(), n.GetHandoffUntil().AsTime())
	}
	tx.putNamespace(endHandoff(n))
	return &MoveResult{Applied: true}, nil
}

// endHandoff is n without its tail (and, with no move in progress, without
// the move's bookkeeping).
func endHandoff(n *adminv1.Namespace) *adminv1.Namespace {
	n = proto.CloneOf(n)
	n.HandoffProxyId, n.HandoffUntil, n.SwitchedAt = "", nil, nil
	if n.GetIncomingProxyId() == "" {
		n.MoveIndex, n.MoveStartedAt = 0, nil
	}
	return n
}

func validateAbandonMove(cmd *adminv1.Command) error {
	return validateNamespaceRef(cmd.GetAbandonMove().GetNamespace())
}

// applyAbandonMove ends the named move (any, for move_index zero).
func applyAbandonMove(tx *txn, cmd *adminv1.Command) (any, error) {
	m := cmd.GetAbandonMove()
	n, ok := tx.st.namespaces[m.GetNamespace()]
	switch {
	case !ok:
		return refusedMove("namespace %s does not exist", m.GetNamespace())
	case n.GetIncomingProxyId() == "":
		return refusedMove("namespace %s has no move in progress", n.GetName())
	case m.GetMoveIndex() != 0 && m.GetMoveIndex() != n.GetMoveIndex():
		return refusedMove("namespace %s: the move at %d is not the one in progress (%d)", n.GetName(), m.GetMoveIndex(), n.GetMoveIndex())
	}
	why := m.GetReason()
	if why == adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_UNSPECIFIED {
		why = adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_CANCELLED
	}
	tx.abandonMove(n, why)
	return &MoveResult{Applied: true}, nil
}

// RebalanceResult lists the moves a Rebalance started.
type RebalanceResult struct {
	Started []string
}

func validateRebalance(cmd *adminv1.Command) error {
	if cmd.GetRebalance().GetMaxConcurrentMoves() == 0 {
		return invalid("max_concurrent_moves", "zero")
	}
	return nil
}

// applyRebalance starts the planned moves placement wants (pendingMoves),
// in namespace order, while fewer than the limit are in progress.
func applyRebalance(tx *txn, cmd *adminv1.Command) (any, error) {
	res := &RebalanceResult{}
	free := int(cmd.GetRebalance().GetMaxConcurrentMoves()) - tx.st.movesInProgress()
	for _, name := range tx.st.pendingMoves() {
		if free <= 0 {
			break
		}
		n := tx.st.namespaces[name]
		reason := adminv1.MoveReason_MOVE_REASON_REBALANCE
		if unschedulable(tx.st.proxies[n.GetAssignedProxyId()]) {
			reason = adminv1.MoveReason_MOVE_REASON_DRAIN
		}
		tx.startMove(n, tx.st.ownerOf(n), reason)
		res.Started = append(res.Started, name)
		free--
	}
	return res, nil
}

func validateCordonProxy(cmd *adminv1.Command) error {
	return mesh.ValidateProxyID(cmd.GetCordonProxy().GetProxyId())
}

// applyCordonProxy sets a proxy's cordon. A cordoned proxy leaves the
// placement table, so its namespaces become planned moves (Rebalance starts
// them) and moves toward it are abandoned; an uncordoned one comes back and
// takes its partitions back the same way.
func applyCordonProxy(tx *txn, cmd *adminv1.Command) (any, error) {
	m := cmd.GetCordonProxy()
	prev, ok := tx.st.proxies[m.GetProxyId()]
	if !ok {
		return nil, fmt.Errorf("cordon %s: %w", m.GetProxyId(), ErrProxyNotFound)
	}
	if prev.GetCordoned() == m.GetCordoned() {
		return &MoveResult{Refused: fmt.Sprintf("proxy %s already has cordoned=%t", m.GetProxyId(), m.GetCordoned())}, nil
	}
	p := proto.CloneOf(prev)
	p.Cordoned = m.GetCordoned()
	tx.putProxy(p)
	tx.replace()
	return &MoveResult{Applied: true}, nil
}

// movesInProgress counts the namespaces with a destination catching up.
func (s *state) movesInProgress() int {
	n := 0
	for name := range s.moving {
		if s.namespaces[name].GetIncomingProxyId() != "" {
			n++
		}
	}
	return n
}

// pendingMoves lists, sorted, the namespaces placement wants elsewhere and
// has not started moving: the hash owner is another proxy, the assigned
// proxy serves (else replace reassigned it at once), no move or tail is in
// progress, and an operator did not place it on a proxy that is still
// placeable. Only the misplaced can be.
func (s *state) pendingMoves() []string {
	var out []string
	for _, name := range sortedKeys(s.misplaced) {
		if s.pendingMove(s.namespaces[name]) {
			out = append(out, name)
		}
	}
	return out
}

// pendingMoveCount is len(pendingMoves()) without sorting or listing.
func (s *state) pendingMoveCount() int {
	c := 0
	for name := range s.misplaced {
		if s.pendingMove(s.namespaces[name]) {
			c++
		}
	}
	return c
}

// pendingMove says whether n is one of pendingMoves.
func (s *state) pendingMove(n *adminv1.Namespace) bool {
	owner, a := s.ownerOf(n), n.GetAssignedProxyId()
	if owner == "" || owner == a || moving(n) || !serving(s.proxies[a]) {
		return false
	}
	return !n.GetOperatorPlaced() || !placeable(s.proxies[a])
}

// Move is one namespace's move in progress or handoff tail, for ListMoves
// and the leader's mover.
type Move struct {
	Namespace *adminv1.Namespace
	// From is the serving proxy: the assigned one while catching up, the
	// handoff proxy in the tail. To is the destination.
	From, To string
	Role     adminv1.AssignmentRole
}

// Moves returns every move in progress (Role CATCHING_UP) and handoff tail
// (HANDING_OFF), sorted by namespace, and the applied index.
func (f *FSM) Moves() ([]Move, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []Move
	for _, name := range sortedKeys(f.st.moving) {
		n := f.st.namespaces[name]
		if n.GetIncomingProxyId() != "" {
			out = append(out, Move{Namespace: proto.CloneOf(n), From: n.GetAssignedProxyId(), To: n.GetIncomingProxyId(), Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP})
		}
		if n.GetHandoffProxyId() != "" {
			out = append(out, Move{Namespace: proto.CloneOf(n), From: n.GetHandoffProxyId(), To: n.GetAssignedProxyId(), Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF})
		}
	}
	return out, f.applied
}

// PendingMoves is how many planned moves wait for a Rebalance, and how many
// moves are in progress: the mover proposes a Rebalance when both some wait
// and the limit has room.
//
// The mover asks every tick, and pendingMoves looks at every namespace, so
// the count is cached until the state's placementGen moves.
func (f *FSM) PendingMoves() (pending, inProgress int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c := &f.pendingCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != f.st || c.gen != f.st.placementGen {
		c.st, c.gen, c.n = f.st, f.st.placementGen, f.st.pendingMoveCount()
	}
	return c.n, f.st.movesInProgress()
}
