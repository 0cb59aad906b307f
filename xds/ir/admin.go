package ir

import (
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// AdminState is what an admin node feeds the xDS pipeline: its FSM's routes
// (fsm.Routes()) and the node's own settings.
type AdminState struct {
	// Routes has one route per live lease.
	Routes []*adminv1.Route
	// NamespaceRoutes maps namespaces to their current mailbox.
	NamespaceRoutes []*adminv1.NamespaceRoute
	// RoutesIndex is the Raft index of the last change to either list; it
	// becomes the IR version.
	RoutesIndex uint64
	// StaleProxies lists proxies the FSM marks stale; their runners'
	// endpoints are sent unhealthy so queries fail fast until the leases
	// expire.
	StaleProxies map[string]bool
	// Gateway is the Envoy gateway's listener and, when the admin node runs
	// with TLS, the trust domain of the mesh's mutual TLS.
	Gateway Gateway
	// NotFound lists the admin nodes' gRPC addresses serving xds/notfound.
	NotFound []string
}

// FromAdmin builds the IR for s. A runner is known by its routes: its
// address is the one of its highest-epoch lease, since a runner that
// restarted on a new address re-acquires and so holds the newest epochs.
// Invalid routes are kept here and dropped, with errors, by Valid.
func FromAdmin(s AdminState) *IR {
	x := &IR{Version: s.RoutesIndex, Gateway: s.Gateway, NotFound: append([]string(nil), s.NotFound...)}
	type runner struct {
		r     Runner
		epoch uint64
	}
	runners := map[string]*runner{}
	var order []string
	for _, rt := range s.Routes {
		x.Mailboxes = append(x.Mailboxes, Mailbox{
			ID: rt.GetMailboxId(), Namespace: rt.GetNamespace(), RunnerID: rt.GetRunnerId(), Epoch: rt.GetEpoch(),
		})
		cur, ok := runners[rt.GetRunnerId()]
		if !ok {
			cur = &runner{}
			runners[rt.GetRunnerId()] = cur
			order = append(order, rt.GetRunnerId())
		}
		if !ok || rt.GetEpoch() > cur.epoch {
			cur.epoch = rt.GetEpoch()
			cur.r = Runner{
				ID: rt.GetRunnerId(), Address: rt.GetRunnerAddress(), Healthy: !s.StaleProxies[rt.GetProxyId()], ProxyID: rt.GetProxyId(),
			}
		}
	}
	for _, id := range order {
		x.Runners = append(x.Runners, runners[id].r)
	}
	for _, nr := range s.NamespaceRoutes {
		x.Aliases = append(x.Aliases, Alias{Namespace: nr.GetNamespace(), MailboxID: nr.GetMailboxId()})
	}
	return x.Sorted()
}
