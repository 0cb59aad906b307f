package fsm

import (
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// recoverySource is the mailbox a move's destination seeds its own from
// (docs/architecture.md#peer-recovery): the source's, while the source
// serves it, that is while its proxy serves (live, its runner ready) and
// the mailbox holds a lease, whose runner address is where its runner
// answers. Nil otherwise: a mailbox not served is not one to copy, and the
// destination reads Kafka alone. The source's assignment lists the
// destination in recovery_peers for as long as the move is in progress, so
// the copy is allowed from the move's start to its switch or abandon.
func (s *state) recoverySource(n *adminv1.Namespace) *adminv1.RecoverySource {
	from := n.GetAssignedProxyId()
	if from == "" || !serving(s.proxies[from]) {
		return nil
	}
	mid := mesh.MailboxID{Namespace: n.GetName(), Proxy: from}.String()
	l, ok := s.leases[mid]
	if !ok || l.GetRunnerAddress() == "" {
		return nil
	}
	return &adminv1.RecoverySource{MailboxId: mid, Address: l.GetRunnerAddress()}
}

// NamespaceReplicas lists every proxy with a role in namespace name (its
// assigned proxy, a move's destination, a handoff tail's source), sorted by
// proxy id, each with its mailbox's lease epoch and its last report on the
// namespace, for prismctl namespace get; nil for an unknown namespace.
func (f *FSM) NamespaceReplicas(name string) []*adminv1.NamespaceReplica {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, ok := f.st.namespaces[name]
	if !ok {
		return nil
	}
	roles := map[string]adminv1.AssignmentRole{}
	for id, role := range map[string]adminv1.AssignmentRole{
		n.GetHandoffProxyId():  adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF,
		n.GetIncomingProxyId(): adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP,
	} {
		if id != "" {
			roles[id] = role
		}
	}
	// The assigned proxy's role wins: an unplanned reassignment to the
	// tail's proxy gives it the namespace back (assignmentsAmong).
	if id := n.GetAssignedProxyId(); id != "" {
		roles[id] = adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING
	}
	var out []*adminv1.NamespaceReplica
	for _, id := range sortedKeys(roles) {
		mid := mesh.MailboxID{Namespace: name, Proxy: id}.String()
		r := &adminv1.NamespaceReplica{ProxyId: id, MailboxId: mid, Role: roles[id], Epoch: f.st.leases[mid].GetEpoch()}
		if h := healthEntry(f.st.proxies[id], name); h != nil {
			r.Health = proto.CloneOf(h)
		}
		out = append(out, r)
	}
	return out
}

// Health is proxy's last report on namespace ns (a clone), or nil.
func (f *FSM) Health(proxy, ns string) *adminv1.NamespaceHealth {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if h := healthEntry(f.st.proxies[proxy], ns); h != nil {
		return proto.CloneOf(h)
	}
	return nil
}
