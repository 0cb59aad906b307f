package xdstest

import (
	"fmt"
	"slices"

	"github.com/prism-mesh/prism/xds/ir"
)

// Mesh is a state with the given number of proxies (proxy-00, ...) whose
// runners are on loopback ports nobody dials, with admin as the admin node
// (not-found, lookup). Mailbox i of MailboxID lives on proxy i % proxies.
func Mesh(version uint64, proxies int, admin string) *ir.IR {
	x := &ir.IR{Version: version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{admin}, Lookup: "dns:///" + admin}
	for i := range proxies {
		x.Proxies = append(x.Proxies, ir.Proxy{ID: ProxyID(i), Address: fmt.Sprintf("127.0.0.1:%d", 20000+i), Healthy: true})
	}
	return x
}

// ProxyID names Mesh's i-th proxy.
func ProxyID(i int) string { return fmt.Sprintf("proxy-%02d", i) }

// MailboxID is the i-th mailbox of a Mesh of the given number of proxies.
func MailboxID(i, proxies int) string { return fmt.Sprintf("ns-%05d@%s", i, ProxyID(i%proxies)) }

// MoveRunner returns a copy of x at version with proxy i's runner at addr:
// a runner restarted on a new address, the one change a Mesh's routing
// state sees (lease changes are not in it).
func MoveRunner(x *ir.IR, version uint64, i int, addr string) *ir.IR {
	c := *x
	c.Version = version
	c.Proxies = slices.Clone(x.Proxies)
	c.Proxies[i].Address = addr
	return &c
}
