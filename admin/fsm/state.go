package fsm

import (
	"cmp"
	"maps"
	"slices"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// state holds the tables. Stored messages are never modified in place: a
// change stores a modified clone. That makes a snapshot a cheap copy of the
// maps and lets Persist marshal outside the lock while Apply continues.
type state struct {
	proxies    map[string]*adminv1.Proxy
	namespaces map[string]*adminv1.Namespace
	leases     map[string]*adminv1.Lease
	members    map[string]*adminv1.MemberAddress
	sessions   map[uint64]*adminv1.Session
	// sessionLeases holds each open session's mailboxes (absent: none),
	// derived from leases like proxyLeases. Its inner sets are modified in
	// place, so a snapshot's clone leaves it out (Persist does not need it).
	sessionLeases map[uint64]map[string]struct{}
	// namespaceLeases holds each namespace's mailboxes with a lease (absent:
	// none), derived from leases like sessionLeases, so a namespace's route
	// looks at its own few mailboxes instead of every lease.
	namespaceLeases map[string]map[string]struct{}
	// moving holds the names of the namespaces with a move or a handoff
	// tail in progress (moving), derived from namespaces like the lease
	// indexes, so the mover's every tick looks at the few moves instead of
	// every namespace.
	moving map[string]struct{}
	// byPartition holds the names of each partition's namespaces, byProxy
	// those of each proxy's by any role (assigned, "" for none; handoff;
	// incoming), and misplaced those whose owner (ownerOf) is not their
	// assigned proxy. Derived from namespaces, the placement table and the
	// exclusions like moving, so replace, a proxy's assignments and
	// pendingMoves look at the namespaces they concern instead of every
	// one.
	byPartition map[uint32]map[string]struct{}
	byProxy     map[string]map[string]struct{}
	misplaced   map[string]struct{}
	// replicated holds the names of the namespaces that ask for replicas
	// (wantedReplicas > 0), derived like moving, so replace looks at their
	// replica sets only.
	replicated map[string]struct{}
	// placementGen counts changes to what pendingMoves reads (namespaces,
	// the placement table, and each proxy's serving, schedulability and
	// exclusions), so PendingMoves answers from its cache while none
	// happened; never persisted.
	placementGen uint64
	// epochHighWater is the highest fencing token handed out (epoch.go).
	epochHighWater uint64
	// proxyLeases counts the leases of each proxy (absent: none) for the
	// per-proxy quota. Derived from leases alone, so every replica holds the
	// same counts; kept by grantLease and removeLease, recounted on restore,
	// never persisted.
	proxyLeases map[string]int
	// table is derived from the placeable proxies; recomputed, never
	// persisted.
	table placement.Table
	// routesIndex is the index of the last change to anything routes are
	// derived from; every replica agrees on it, so it is the xDS version.
	routesIndex uint64
	// proxyRoutesIndex is the index of the last change to what routing takes
	// from proxies (a proxy added, its address or runner_id, its staleness,
	// its runner's readiness):
	// the per-proxy routes move only with it, not with any lease.
	proxyRoutesIndex uint64
}

func newState() *state {
	return &state{
		proxies:    map[string]*adminv1.Proxy{},
		namespaces: map[string]*adminv1.Namespace{},
		leases:     map[string]*adminv1.Lease{},
		members:    map[string]*adminv1.MemberAddress{},
		sessions:   map[uint64]*adminv1.Session{},

		sessionLeases:   map[uint64]map[string]struct{}{},
		namespaceLeases: map[string]map[string]struct{}{},
		proxyLeases:     map[string]int{},
		moving:          map[string]struct{}{},
		byPartition:     map[uint32]map[string]struct{}{},
		byProxy:         map[string]map[string]struct{}{},
		misplaced:       map[string]struct{}{},
		replicated:      map[string]struct{}{},
	}
}

func (s *state) clone() *state {
	return &state{
		proxies:     maps.Clone(s.proxies),
		namespaces:  maps.Clone(s.namespaces),
		leases:      maps.Clone(s.leases),
		members:     maps.Clone(s.members),
		sessions:    maps.Clone(s.sessions),
		proxyLeases: maps.Clone(s.proxyLeases),

		epochHighWater:   s.epochHighWater,
		table:            s.table,
		routesIndex:      s.routesIndex,
		proxyRoutesIndex: s.proxyRoutesIndex,
	}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// placeable reports whether p may own partitions: live, its runner not
// given up on by its sidecar, and neither cordoned nor draining
// (unschedulable). A proxy whose runner died while its sidecar heartbeats
// is left out like a stale one, so its namespaces move to proxies that can
// serve them, and come back by the same rendezvous rule once its sidecar
// reports the runner ready. A cordoned or draining one still serves, so its
// namespaces leave by handoff (replace).
func placeable(p *adminv1.Proxy) bool {
	return serving(p) && !unschedulable(p)
}

// placeableProxyIDs lists the proxies placement uses, sorted.
func (s *state) placeableProxyIDs() []string {
	var ids []string
	for _, id := range sortedKeys(s.proxies) {
		if placeable(s.proxies[id]) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (tx *txn) putProxy(p *adminv1.Proxy) {
	id := p.GetRegistration().GetProxyId()
	prev, ok := tx.st.proxies[id]
	if !ok || routedDiffers(prev, p) {
		tx.st.proxyRoutesIndex = tx.index
	}
	if !ok || placementDiffers(prev, p) {
		tx.st.placementGen++
	}
	tx.st.proxies[id] = p
	if !slices.Equal(excludedNames(prev), excludedNames(p)) {
		// ownerOf of a namespace excluded from p, or no longer, changed.
		for _, name := range excludedNames(prev) {
			tx.st.placeCheck(name)
		}
		for _, name := range excludedNames(p) {
			tx.st.placeCheck(name)
		}
	}
	tx.changed = true
}

// routedDiffers reports whether two records of a proxy differ in what
// routing takes from it (its endpoint's health follows both staleness and
// the runner's readiness); heartbeats and labels do not count.
func routedDiffers(a, b *adminv1.Proxy) bool {
	ra, rb := a.GetRegistration(), b.GetRegistration()
	return ra.GetAddress() != rb.GetAddress() || ra.GetRunnerId() != rb.GetRunnerId() || a.GetStatus() != b.GetStatus() ||
		a.GetRunnerNotReady() != b.GetRunnerNotReady()
}

// placementDiffers reports whether two records of a proxy differ in what
// placement and pendingMoves take from it: whether it serves, whether it
// takes new namespaces, and which namespaces are excluded from it.
func placementDiffers(a, b *adminv1.Proxy) bool {
	return serving(a) != serving(b) || unschedulable(a) != unschedulable(b) || !slices.Equal(excludedNames(a), excludedNames(b))
}

// excludedNames lists the namespaces excluded from p (exclude.go), in its
// stored health's order.
func excludedNames(p *adminv1.Proxy) []string {
	var out []string
	for _, h := range p.GetNamespaceHealth() {
		if h.GetExcludedUntil() != nil {
			out = append(out, h.GetNamespace())
		}
	}
	return out
}

// putNamespace stores n with its replica set as placement wants it now
// (chooseReplicas), so no change to a namespace leaves its replicas on a
// proxy that took another role in it.
func (tx *txn) putNamespace(n *adminv1.Namespace) {
	n = tx.st.withReplicas(n, tx.index)
	if prev, ok := tx.st.namespaces[n.GetName()]; ok {
		tx.st.unindex(prev)
	}
	tx.st.namespaces[n.GetName()] = n
	tx.st.index(n)
	tx.st.placementGen++
	tx.st.routesIndex = tx.index
	tx.changed = true
}

func (tx *txn) deleteNamespace(name string) {
	if prev, ok := tx.st.namespaces[name]; ok {
		tx.st.unindex(prev)
	}
	delete(tx.st.namespaces, name)
	tx.st.placementGen++
	tx.st.routesIndex = tx.index
	tx.changed = true
}

// index adds stored namespace n to the derived indexes.
func (s *state) index(n *adminv1.Namespace) {
	name := n.GetName()
	addName(s.byPartition, n.GetPartition(), name)
	for _, id := range proxyRoles(n) {
		addName(s.byProxy, id, name)
	}
	if moving(n) {
		s.moving[name] = struct{}{}
	}
	if wantedReplicas(n) > 0 {
		s.replicated[name] = struct{}{}
	}
	if s.ownerOf(n) != n.GetAssignedProxyId() {
		s.misplaced[name] = struct{}{}
	}
}

// unindex removes n, as stored, from the derived indexes.
func (s *state) unindex(n *adminv1.Namespace) {
	name := n.GetName()
	removeName(s.byPartition, n.GetPartition(), name)
	for _, id := range proxyRoles(n) {
		removeName(s.byProxy, id, name)
	}
	delete(s.moving, name)
	delete(s.misplaced, name)
	delete(s.replicated, name)
}

// placeCheck recomputes whether namespace name, if it exists, is
// misplaced, after a change to what ownerOf reads.
func (s *state) placeCheck(name string) {
	n, ok := s.namespaces[name]
	switch {
	case !ok:
	case s.ownerOf(n) != n.GetAssignedProxyId():
		s.misplaced[name] = struct{}{}
	default:
		delete(s.misplaced, name)
	}
}

// proxyRoles lists the proxies n is indexed under in byProxy: its assigned
// one (possibly ""), its handoff one and its incoming one, when set, and its
// replicas'.
func proxyRoles(n *adminv1.Namespace) []string {
	out := append([]string{n.GetAssignedProxyId()}, n.GetReplicaProxyIds()...)
	if h := n.GetHandoffProxyId(); h != "" {
		out = append(out, h)
	}
	if in := n.GetIncomingProxyId(); in != "" {
		out = append(out, in)
	}
	return out
}

func addName[K comparable](m map[K]map[string]struct{}, k K, name string) {
	if m[k] == nil {
		m[k] = map[string]struct{}{}
	}
	m[k][name] = struct{}{}
}

func removeName[K comparable](m map[K]map[string]struct{}, k K, name string) {
	if len(m[k]) > 1 {
		delete(m[k], name)
	} else {
		delete(m, k)
	}
}

// reindexNamespaces rebuilds every index derived from the namespaces, the
// table and the exclusions (a restore; tests compare it with the
// incremental ones).
func (s *state) reindexNamespaces() {
	s.moving = map[string]struct{}{}
	s.byPartition = map[uint32]map[string]struct{}{}
	s.byProxy = map[string]map[string]struct{}{}
	s.misplaced = map[string]struct{}{}
	s.replicated = map[string]struct{}{}
	for _, n := range s.namespaces {
		s.index(n)
	}
}

// countLeases is the per-proxy lease count recomputed from the table.
func countLeases(leases map[string]*adminv1.Lease) map[string]int {
	n := map[string]int{}
	for _, l := range leases {
		n[l.GetProxyId()]++
	}
	return n
}

// countNamespaceLeases is namespaceLeases recomputed from the table.
func countNamespaceLeases(leases map[string]*adminv1.Lease) map[string]map[string]struct{} {
	n := map[string]map[string]struct{}{}
	for mid, l := range leases {
		ns := l.GetNamespace()
		if n[ns] == nil {
			n[ns] = map[string]struct{}{}
		}
		n[ns][mid] = struct{}{}
	}
	return n
}

// countSessionLeases is sessionLeases recomputed from the table.
func countSessionLeases(leases map[string]*adminv1.Lease) map[uint64]map[string]struct{} {
	n := map[uint64]map[string]struct{}{}
	for mid, l := range leases {
		if sid := l.GetSessionId(); sid != 0 {
			if n[sid] == nil {
				n[sid] = map[string]struct{}{}
			}
			n[sid][mid] = struct{}{}
		}
	}
	return n
}

func (s *state) unlinkSession(l *adminv1.Lease) {
	sid := l.GetSessionId()
	if sid == 0 {
		return
	}
	delete(s.sessionLeases[sid], l.GetMailboxId())
	if len(s.sessionLeases[sid]) == 0 {
		delete(s.sessionLeases, sid)
	}
}

// grantLease stores l, a new lease or a re-grant replacing the mailbox's
// current one (same mailbox id, so same proxy: the count stays; the session
// may differ).
func (tx *txn) grantLease(l *adminv1.Lease) {
	if cur, ok := tx.st.leases[l.GetMailboxId()]; ok {
		tx.st.unlinkSession(cur)
	} else {
		tx.st.proxyLeases[l.GetProxyId()]++
		ns := l.GetNamespace()
		if tx.st.namespaceLeases[ns] == nil {
			tx.st.namespaceLeases[ns] = map[string]struct{}{}
		}
		tx.st.namespaceLeases[ns][l.GetMailboxId()] = struct{}{}
	}
	if sid := l.GetSessionId(); sid != 0 {
		if tx.st.sessionLeases[sid] == nil {
			tx.st.sessionLeases[sid] = map[string]struct{}{}
		}
		tx.st.sessionLeases[sid][l.GetMailboxId()] = struct{}{}
	}
	tx.st.leases[l.GetMailboxId()] = l
	tx.st.routesIndex = tx.index
	tx.changed = true
	tx.events = append(tx.events, leaseEvent{granted: l})
}

func (tx *txn) removeLease(l *adminv1.Lease) {
	delete(tx.st.leases, l.GetMailboxId())
	tx.st.unlinkSession(l)
	if ns := l.GetNamespace(); len(tx.st.namespaceLeases[ns]) > 1 {
		delete(tx.st.namespaceLeases[ns], l.GetMailboxId())
	} else {
		delete(tx.st.namespaceLeases, ns)
	}
	if p := l.GetProxyId(); tx.st.proxyLeases[p] > 1 {
		tx.st.proxyLeases[p]--
	} else {
		delete(tx.st.proxyLeases, p)
	}
	tx.st.routesIndex = tx.index
	tx.changed = true
	tx.events = append(tx.events, leaseEvent{mailboxID: l.GetMailboxId(), epoch: l.GetEpoch()})
}

// checkpointLease records renewal data; routes do not depend on it.
func (tx *txn) checkpointLease(l *adminv1.Lease) {
	tx.st.leases[l.GetMailboxId()] = l
	tx.changed = true
}

// replace recomputes the placement table from the placeable proxies and
// acts on the namespaces whose owner changed; rendezvous hashing makes them
// the minimal set. One whose assigned proxy no longer serves (stale, runner
// dead, or excluded from it: exclude.go) is reassigned at once, break-before-make: nothing serves it, so
// waiting buys nothing. One whose proxy still serves (a join, a cordon, a
// proxy back in placement) is left where it is for Rebalance, which moves it
// by handoff at the leader's rate. A move whose destination can no longer
// take namespaces is abandoned, and so is one placement started toward a
// proxy that is no longer the owner (Rebalance starts one toward the new
// owner). Iteration is sorted so updates happen in the same order
// everywhere.
func (tx *txn) replace() {
	prev := tx.st.table
	tx.st.table = placement.Compute(tx.st.placeableProxyIDs())
	tx.st.placementGen++
	tx.st.replaced(&prev)
	scope := (*state).replaceCandidates
	if tx.replaceScope != nil {
		scope = tx.replaceScope
	}
	for _, name := range scope(tx.st) {
		n := tx.st.namespaces[name]
		owner := tx.st.ownerOf(n)
		if in := n.GetIncomingProxyId(); in != "" {
			if why := targetRefusal(tx.st.proxies[in]); why != adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_UNSPECIFIED {
				n = tx.abandonMove(n, why)
			} else if excluded(tx.st.proxies[in], name) {
				n = tx.abandonMove(n, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TARGET_NOT_READY)
			} else if in != owner && n.GetMoveReason() != adminv1.MoveReason_MOVE_REASON_OPERATOR {
				n = tx.abandonMove(n, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_REPLACED)
			}
		}
		a := n.GetAssignedProxyId()
		if owner == a || serving(tx.st.proxies[a]) && !excluded(tx.st.proxies[a], name) {
			continue
		}
		if n.GetIncomingProxyId() != "" {
			n = tx.abandonMove(n, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_SOURCE_LOST)
		}
		// An in-sync replica takes over instead of an empty mailbox
		// (docs/architecture.md#replicas): it holds the history already.
		to := owner
		if r := tx.st.promotion(n, owner); r != "" {
			to = r
		}
		if n.GetHandoffProxyId() == to && to != "" {
			// The tail's proxy takes the namespace back: it serves it as
			// the assigned proxy now.
			n = endHandoff(n)
		}
		n = proto.CloneOf(n)
		if a != "" {
			n.PriorProxyId = a
		}
		n.AssignedProxyId = to
		n.AssignmentIndex = tx.index
		n.OperatorPlaced = false
		tx.putNamespace(n)
	}
	// The placeable set changed: a replica on a proxy that stopped serving
	// is replaced, one that can be placed now is added.
	for _, name := range sortedKeys(tx.st.replicated) {
		n := tx.st.namespaces[name]
		if m := tx.st.withReplicas(n, tx.index); m != n {
			tx.putNamespace(m)
		}
	}
}

// replaced updates misplaced after the table changed from prev: the
// namespaces of the partitions whose owner changed, and every excluded one,
// whose owner is the next in rendezvous order among the placeable proxies.
func (s *state) replaced(prev *placement.Table) {
	for p := range uint32(placement.Partitions) {
		if prev.Owner(p) != s.table.Owner(p) {
			for name := range s.byPartition[p] {
				s.placeCheck(name)
			}
		}
	}
	for _, p := range s.proxies {
		for _, name := range excludedNames(p) {
			s.placeCheck(name)
		}
	}
}

// replaceCandidates lists, sorted, the namespaces replace may change: the
// rest it would pass over. One without a move incoming changes only if its
// assigned proxy does not serve it (the owner, from the placeable proxies,
// serves), that is if the proxy no longer serves or excludes it. With no
// placeable proxy every owner is "", so the unassigned stay as they are.
func (s *state) replaceCandidates() []string {
	set := map[string]struct{}{}
	for name := range s.moving {
		if s.namespaces[name].GetIncomingProxyId() != "" {
			set[name] = struct{}{}
		}
	}
	empty := s.table == placement.Table{}
	for id, names := range s.byProxy {
		if serving(s.proxies[id]) || id == "" && empty {
			continue
		}
		for name := range names {
			if s.namespaces[name].GetAssignedProxyId() == id {
				set[name] = struct{}{}
			}
		}
	}
	for id, p := range s.proxies {
		if !serving(p) {
			continue
		}
		for _, name := range excludedNames(p) {
			if s.namespaces[name].GetAssignedProxyId() == id {
				set[name] = struct{}{}
			}
		}
	}
	return sortedKeys(set)
}

// assignments lists what proxyID must host, one entry per namespace: those
// assigned to it (SERVING), those in a handoff tail from it (HANDING_OFF),
// those moving to it (CATCHING_UP) and those it holds a replica of
// (REPLICA). A namespace takes one move at a time, and its replicas are
// never on a proxy with another role in it (chooseReplicas), so the roles
// never overlap but for an unplanned reassignment to the tail's proxy,
// which ends the tail.
func (s *state) assignments(proxyID string) []*adminv1.NamespaceAssignment {
	if proxyID == "" {
		return nil
	}
	return s.assignmentsAmong(sortedKeys(s.byProxy[proxyID]), proxyID)
}

// assignmentsAmong is assignments over the namespaces names, which must hold
// every one proxyID has a role in (more are skipped).
func (s *state) assignmentsAmong(names []string, proxyID string) []*adminv1.NamespaceAssignment {
	var out []*adminv1.NamespaceAssignment
	for _, name := range names {
		n := s.namespaces[name]
		var role adminv1.AssignmentRole
		version := n.GetAssignmentIndex()
		switch proxyID {
		case n.GetAssignedProxyId():
			role = adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING
		case n.GetHandoffProxyId():
			role = adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF
		case n.GetIncomingProxyId():
			role, version = adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP, n.GetMoveIndex()
		default:
			if !isReplica(n, proxyID) {
				continue
			}
			role, version = adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA, n.GetReplicaIndex()
		}
		as := &adminv1.NamespaceAssignment{
			Namespace: n.GetName(),
			Partition: n.GetPartition(),
			Config:    proto.CloneOf(n.GetConfig()),
			MailboxId: mesh.MailboxID{Namespace: n.GetName(), Proxy: proxyID}.String(),
			Version:   version,
			Role:      role,
		}
		switch role {
		case adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP, adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA:
			as.RecoverySource = s.recoverySource(n)
		case adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING:
			as.RecoveryPeers = recoveryPeers(n)
			as.PriorMailboxId = priorMailbox(n, proxyID)
		}
		out = append(out, as)
	}
	return out
}

// proxyInfo is p with its partitions and namespaces, the sorted names of
// those assigned to it.
func (s *state) proxyInfo(p *adminv1.Proxy, namespaces []string) *adminv1.ProxyInfo {
	return &adminv1.ProxyInfo{Proxy: proto.CloneOf(p), PartitionRanges: s.table.Ranges(p.GetRegistration().GetProxyId()), Namespaces: namespaces}
}

// namespacesOf lists the namespaces assigned to one proxy, sorted.
func (s *state) namespacesOf(id string) []string {
	var out []string
	for _, name := range sortedKeys(s.byProxy[id]) {
		if s.namespaces[name].GetAssignedProxyId() == id {
			out = append(out, name)
		}
	}
	return out
}

// namespacesByProxy lists every proxy's namespaces, sorted.
func (s *state) namespacesByProxy() map[string][]string {
	out := map[string][]string{}
	for id := range s.byProxy {
		if names := s.namespacesOf(id); len(names) > 0 {
			out[id] = names
		}
	}
	return out
}

func routeOf(l *adminv1.Lease) *adminv1.Route {
	return &adminv1.Route{
		MailboxId:     l.GetMailboxId(),
		Namespace:     l.GetNamespace(),
		ProxyId:       l.GetProxyId(),
		RunnerId:      l.GetRunnerId(),
		RunnerAddress: l.GetRunnerAddress(),
		Partition:     l.GetPartition(),
		Epoch:         l.GetEpoch(),
	}
}

// namespaceRoute is the mailbox namespace ns's alias routes to, if any of
// its mailboxes holds a lease: the one on the assigned proxy, else its first
// in-sync replica, else the newest grant (the smaller id on equal epochs,
// which grants never share), but never the mailbox of a move's destination
// or a replica not in sync, which would answer a partial history. The
// route lists the other in-sync replicas, in order, for a gateway's failover
// (docs/architecture.md#replicas). It reads only ns's own mailboxes.
func (s *state) namespaceRoute(ns string) (*adminv1.NamespaceRoute, bool) {
	var best *adminv1.Lease
	n := s.namespaces[ns]
	if assigned := n.GetAssignedProxyId(); assigned != "" {
		best = s.leases[mesh.MailboxID{Namespace: ns, Proxy: assigned}.String()]
	}
	var replicas []*adminv1.NamespaceRouteReplica
	for _, r := range s.inSyncReplicas(n) {
		l := s.leases[mesh.MailboxID{Namespace: ns, Proxy: r}.String()]
		if best == nil {
			best = l
			continue
		}
		replicas = append(replicas, &adminv1.NamespaceRouteReplica{MailboxId: l.GetMailboxId(), Epoch: l.GetEpoch()})
	}
	if best == nil {
		for mid := range s.namespaceLeases[ns] {
			l := s.leases[mid]
			if in := n.GetIncomingProxyId(); in != "" && l.GetProxyId() == in || isReplica(n, l.GetProxyId()) {
				continue
			}
			if best == nil || l.GetEpoch() > best.GetEpoch() || l.GetEpoch() == best.GetEpoch() && mid < best.GetMailboxId() {
				best = l
			}
		}
	}
	if best == nil {
		return nil, false
	}
	return &adminv1.NamespaceRoute{Namespace: ns, MailboxId: best.GetMailboxId(), Epoch: best.GetEpoch(), InSyncReplicas: replicas}, true
}

// namespaceRoutes is namespaceRoute of every namespace with a live lease.
func (s *state) namespaceRoutes() map[string]*adminv1.NamespaceRoute {
	out := make(map[string]*adminv1.NamespaceRoute, len(s.namespaceLeases))
	for ns := range s.namespaceLeases {
		out[ns], _ = s.namespaceRoute(ns)
	}
	return out
}

func sortedValues[V any](m map[string]V) []V {
	out := make([]V, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

func sortBy[T any](s []T, key func(T) string) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
}
