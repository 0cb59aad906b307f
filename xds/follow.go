package xds

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds/ir"
)

// Source is what the control plane reads from an admin node's FSM;
// *admin/fsm.FSM implements it.
type Source interface {
	// Changed returns the applied index and a channel closed by the next
	// state change.
	Changed() (uint64, <-chan struct{})
	// ProxyRoutesIndex is the Raft index of the last change to anything the
	// IR takes from the proxies (a registration's address or runner id, a
	// proxy added or removed, staleness). Leases and heartbeats leave it.
	ProxyRoutesIndex() uint64
	// Proxies returns the registered proxies.
	Proxies() ([]*adminv1.ProxyInfo, uint64)
}

// FollowConfig completes the IR Follow builds from a Source.
type FollowConfig struct {
	// Gateway is the mailbox gateway the IR routes to. An admin node running
	// with TLS sets Gateway.UpstreamTLS to its trust domain, so the gateways
	// reach runners and admin nodes over mutual TLS; a node given a JWKS
	// sets Gateway.QueryAuth, so Envoy checks query tokens.
	Gateway ir.Gateway
	// NotFound lists the admin nodes' gRPC addresses, which serve the
	// not-found MailboxQuery, the namespace lookup and ext_authz (the IR's
	// Admins). Envoy needs IPs, so host names (a StatefulSet's peer DNS
	// names) are resolved every round (see notFoundIPs).
	NotFound []string
	// Lookup is the gRPC target grpc-go's RLS asks for namespaces (the IR's
	// Lookup), e.g. "dns:///admin.prism.svc:9000"; empty leaves grpc-go's
	// namespace route out.
	Lookup string
	// Resolve looks a host name up; nil is net.DefaultResolver.LookupHost.
	Resolve func(ctx context.Context, host string) ([]string, error)
}

// Follow keeps the control plane on src's routing state until ctx ends.
// Every node, leader or follower, serves xDS from its own FSM. After every
// FSM change it resolves the admin addresses and, only when the proxy
// routes index moved, reads the proxies; it hands over a new state when
// either moved. Lease changes and heartbeats move neither, so they cost a
// comparison of two numbers. The version is always the proxy routes index,
// the same on every replica for the same proxies; an admin address change,
// which has no index of its own, is served under a suffixed label of it
// (see cache.Cache.Set).
func (cp *ControlPlane) Follow(ctx context.Context, src Source, cfg FollowConfig) error {
	resolve := cfg.Resolve
	if resolve == nil {
		resolve = net.DefaultResolver.LookupHost
	}
	var (
		lastIndex  uint64
		lastAdmins []string
		sent       bool
	)
	for {
		_, changed := src.Changed()
		start := time.Now()
		idx := src.ProxyRoutesIndex()
		admins := notFoundIPs(ctx, cfg.NotFound, resolve)
		if !sent || idx != lastIndex || !slices.Equal(admins, lastAdmins) {
			proxies, _ := src.Proxies()
			gen := cp.Update(ir.FromAdmin(ir.AdminState{
				// 1: an FSM that never had a proxy still serves listeners and
				// the not-found routes (index 1 is Raft's bootstrap entry,
				// never a proxy change).
				Proxies: proxies, Index: max(idx, 1),
				Gateway: cfg.Gateway, Admins: admins, Lookup: cfg.Lookup,
			}))
			lastIndex, lastAdmins, sent = idx, admins, true
			// Bounded in case the control plane is not running.
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = cp.Processed(wctx, gen)
			cancel()
		}
		// Back-pressure: reading the proxies and translating them cost time
		// proportional to the proxies (milliseconds at 1,000). Resting as
		// long as the last round took keeps xDS from starving Raft on the
		// same machine during a burst of registrations, while a single
		// change still goes out within one round.
		rest := min(time.Since(start), time.Second)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rest):
		}
	}
}

// notFoundIPs turns the admin gRPC addresses into IP:port: IPs stay, host
// names resolve (first address), unspecified or unresolvable ones are left
// out. Sorted, so nodes resolving the same names build the same IR.
func notFoundIPs(ctx context.Context, addrs []string, resolve func(ctx context.Context, host string) ([]string, error)) []string {
	var out []string
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			if !ip.IsUnspecified() {
				out = append(out, a)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		ips, err := resolve(rctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			continue
		}
		slices.Sort(ips)
		out = append(out, net.JoinHostPort(ips[0], port))
	}
	slices.Sort(out)
	return slices.Compact(out)
}
