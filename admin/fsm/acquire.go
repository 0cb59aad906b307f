package fsm

import (
	"fmt"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// registeredRunner is the runner id a proxy's mailboxes may be granted to:
// the one its registration names, else the proxy id, which is also the
// sidecar's default runner id (one runner per proxy).
func registeredRunner(reg *adminv1.ProxyRegistration) string {
	if r := reg.GetRunnerId(); r != "" {
		return r
	}
	return reg.GetProxyId()
}

// placementRefusal checks that mailbox "{ns}@{proxy}" is one the caller may
// hold: the namespace exists, is placed on that proxy, and the caller is the
// runner registered for it. It returns nil if so. A move's destination
// (incoming_proxy_id) and the namespace's replicas may hold their mailboxes
// too, so they catch up while the assigned proxy serves.
//
// It runs at apply time, on replicated state only, so it is ordered with
// every placement change in the log: an acquire applied after a move sees
// the move, on every replica. A grant before the move stays valid; the move
// does not revoke it (see applyAcquireLease).
func placementRefusal(st *state, req *adminv1.AcquireLeaseRequest) *adminv1.LeaseRefusal {
	id, _ := mesh.ParseMailboxID(req.GetMailboxId()) // validated before apply
	ns, ok := st.namespaces[id.Namespace]
	if !ok {
		return &adminv1.LeaseRefusal{
			Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NAMESPACE_NOT_FOUND,
			Message: fmt.Sprintf("mailbox %s: namespace %s does not exist", req.GetMailboxId(), id.Namespace),
		}
	}
	if owner := ns.GetAssignedProxyId(); owner != id.Proxy && ns.GetIncomingProxyId() != id.Proxy && !isReplica(ns, id.Proxy) {
		where := "no live proxy"
		if owner != "" {
			where = "proxy " + owner
		}
		return &adminv1.LeaseRefusal{
			Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE,
			Message: fmt.Sprintf("mailbox %s: namespace %s is placed on %s, not %s", req.GetMailboxId(), id.Namespace, where, id.Proxy),
		}
	}
	// Placement and moves only pick live proxies, so the proxy is registered.
	if want := registeredRunner(st.proxies[id.Proxy].GetRegistration()); req.GetRunnerId() != want {
		return &adminv1.LeaseRefusal{
			Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER,
			Message: fmt.Sprintf("mailbox %s: proxy %s registered runner %s, not %s", req.GetMailboxId(), id.Proxy, want, req.GetRunnerId()),
		}
	}
	return nil
}
