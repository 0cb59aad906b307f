package fsm

import (
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// recoverySource is the mailbox a move's destination seeds its own from
// (docs/architecture.md#peer-recovery): the source's, while its proxy
// serves (live, its runner ready), at the runner address of the mailbox's
// lease, or of the proxy's registration while the mailbox holds none (the
// source reacquiring: its runner refuses the copy meanwhile, and the
// destination retries within its --recovery-give-up). Nil once the source
// does not serve: that ends the move (replace), and the destination reads
// Kafka alone. The source's assignment lists the destination in
// recovery_peers for as long as the move is in progress, so the copy is
// allowed from the move's start to its switch or abandon.
//
// A lease that comes and goes does not change the source named, so the
// destination's first assignment, which its sidecar opens the mailbox with,
// names it whenever the source serves: a destination opened without one
// reads Kafka alone, and would lose what Kafka deleted.
func (s *state) recoverySource(n *adminv1.Namespace) *adminv1.RecoverySource {
	from := n.GetAssignedProxyId()
	p := s.proxies[from]
	if from == "" || !serving(p) {
		return nil
	}
	mid := mesh.MailboxID{Namespace: n.GetName(), Proxy: from}.String()
	addr := s.leases[mid].GetRunnerAddress()
	if addr == "" {
		addr = p.GetRegistration().GetAddress()
	}
	if addr == "" {
		return nil
	}
	return &adminv1.RecoverySource{MailboxId: mid, Address: addr}
}

// priorMailbox is the mailbox whose history n's mailbox on proxyID lacks
// unless it was copied or has data of its own (docs/architecture.md#moves):
// the one on the proxy n was assigned to before, if that is another proxy.
// A namespace only ever assigned one proxy names none, so its first mailbox
// reads Kafka as the whole of its history.
func priorMailbox(n *adminv1.Namespace, proxyID string) string {
	prior := n.GetPriorProxyId()
	if prior == "" || prior == proxyID {
		return ""
	}
	return mesh.MailboxID{Namespace: n.GetName(), Proxy: prior}.String()
}

// NamespaceReplicas lists every proxy with a role in namespace name (its
// assigned proxy, its replicas, a move's destination, a handoff tail's
// source), sorted by
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
	for _, id := range n.GetReplicaProxyIds() {
		roles[id] = adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA
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
		if roles[id] == adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA {
			r.InSync = f.st.inSync(n, n.GetAssignedProxyId(), id)
		}
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
