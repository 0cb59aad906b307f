package ir

import (
	"cmp"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// AdminState is what an admin node feeds the xDS pipeline: its FSM's
// proxies (fsm.Proxies) and the node's own settings.
type AdminState struct {
	// Proxies are the registered proxies.
	Proxies []*adminv1.ProxyInfo
	// Index is the Raft index of the last change to what the IR takes from
	// the proxies (fsm.ProxyRoutesIndex); it becomes the IR version.
	Index uint64
	// Gateway is the Envoy gateway's listener and, when the admin node runs
	// with TLS, the trust domain of the mesh's mutual TLS.
	Gateway Gateway
	// Admins lists the admin nodes' gRPC addresses (IP:port).
	Admins []string
	// Lookup is the RLS target naming the admin nodes.
	Lookup string
}

// FromAdmin builds the IR for s: one Proxy per registration, its runner id
// defaulting to the proxy id as AcquireLease's does, unhealthy while the
// FSM marks it stale or its sidecar reports its runner not ready (a runner
// dead while its sidecar heartbeats). Invalid registrations are kept here
// and dropped, with errors, by Valid.
func FromAdmin(s AdminState) *IR {
	x := &IR{Version: s.Index, Gateway: s.Gateway, Admins: append([]string(nil), s.Admins...), Lookup: s.Lookup}
	for _, info := range s.Proxies {
		reg := info.GetProxy().GetRegistration()
		x.Proxies = append(x.Proxies, Proxy{
			ID:       reg.GetProxyId(),
			RunnerID: cmp.Or(reg.GetRunnerId(), reg.GetProxyId()),
			Address:  reg.GetAddress(),
			Healthy:  info.GetProxy().GetStatus() != adminv1.ProxyStatus_PROXY_STATUS_STALE && !info.GetProxy().GetRunnerNotReady(),
		})
	}
	return x.Sorted()
}
