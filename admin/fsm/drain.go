package fsm

import (
	"fmt"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// A proxy is kept out of placement two ways. An operator's cordon
// (CordonProxy, Proxy.cordoned) lasts until an uncordon. A proxy's own
// drain (DrainProxy, the runner's preStop hook) lasts as long as the
// sidecar process that asked, named by its registration instance
// (Proxy.draining_instance): a rolling restart drains every proxy in turn,
// and a drain outliving the pod would leave each one drained once its new
// pod came up. The same process registering again (an admin failover)
// keeps it; another one (the new pod's sidecar) clears it.

// unschedulable reports whether p takes no new namespaces: cordoned by an
// operator or draining itself.
func unschedulable(p *adminv1.Proxy) bool {
	return p.GetCordoned() || p.GetDrainingInstance() != ""
}

// keptDrain is what of prev's own drain survives the registration reg: the
// drain of the registering process, none for another.
func keptDrain(prev *adminv1.Proxy, reg *adminv1.ProxyRegistration) string {
	if d := prev.GetDrainingInstance(); d != "" && d == reg.GetInstance() {
		return d
	}
	return ""
}

func validateDrainProxy(cmd *adminv1.Command) error {
	m := cmd.GetDrainProxy()
	if err := mesh.ValidateProxyID(m.GetProxyId()); err != nil {
		return err
	}
	if m.GetInstance() == "" {
		return invalid("instance", "required (the sidecar's registration instance)")
	}
	return mesh.ValidateID("instance", m.GetInstance())
}

// applyDrainProxy drains the proxy for the registered sidecar process: out
// of placement like a cordon, so its namespaces become planned moves
// (Rebalance starts them) and moves toward it are abandoned. Draining again
// for the same instance changes nothing; a drain from an instance that is
// not the registered one (a process since replaced) is refused.
func applyDrainProxy(tx *txn, cmd *adminv1.Command) (any, error) {
	m := cmd.GetDrainProxy()
	prev, ok := tx.st.proxies[m.GetProxyId()]
	if !ok {
		return nil, fmt.Errorf("drain %s: %w", m.GetProxyId(), ErrProxyNotFound)
	}
	if got := prev.GetRegistration().GetInstance(); got != m.GetInstance() {
		return nil, fmt.Errorf("drain %s: instance %q: %w (registered: %q)", m.GetProxyId(), m.GetInstance(), ErrNotRegisteredInstance, got)
	}
	if prev.GetDrainingInstance() == m.GetInstance() {
		return &adminv1.DrainProxyResponse{Proxy: proto.CloneOf(prev), Index: tx.index}, nil
	}
	p := proto.CloneOf(prev)
	p.DrainingInstance = m.GetInstance()
	tx.putProxy(p)
	if placeable(prev) != placeable(p) {
		tx.replace()
	}
	return &adminv1.DrainProxyResponse{Proxy: proto.CloneOf(p), Drained: true, Index: tx.index}, nil
}
