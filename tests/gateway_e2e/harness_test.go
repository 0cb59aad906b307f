// Package gatewaye2e runs prism gateway against real processes on loopback:
// three `prism admin` nodes (raft-wal on temp dirs, real TCP transport,
// xDS served by every node), `prism runner` consuming an in-process kfake
// broker over TCP with `prism sidecar` holding its leases, and
// `prism gateway` routed by xDS from the admin nodes, all started by
// testkit/e2e.
package gatewaye2e

import (
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
)

const proxyID = "proxy-1"

// lease is the timing of every namespace and of the sidecar.
var lease = e2e.Lease{TTL: 3 * time.Second, Grace: 2 * time.Second, Heartbeat: 500 * time.Millisecond}

var web = e2e.NewHTTP(5 * time.Second)

// createNamespace creates ns on topic through any live admin node.
func createNamespace(admins *e2e.AdminCluster, ns, topic string) {
	admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
}
