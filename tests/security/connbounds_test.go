package security

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/conntest"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// TestConnectionBoundsOnRealProcesses starts real processes (an admin
// node, a runner with its sidecar, a gateway) with small --conn-* bounds
// (docs/security.md#connection-bounds). Every listener closes a connection
// that sends nothing within the handshake bound and a stream-less HTTP/2
// one within the idle bound, and sends a ping flood away; meanwhile the
// mesh's own connections, quiet for many idle bounds, are not cut where it
// matters: the lease stays held under the same epoch, with the same
// members and term, and the gateway still answers for the mailbox.
func TestConnectionBoundsOnRealProcesses(t *testing.T) {
	const handshake, idle = 500 * time.Millisecond, time.Second
	conn := []string{"--conn-handshake-timeout", handshake.String(), "--conn-idle-timeout", idle.String(), "--conn-min-ping-interval", "200ms"}
	kafka := kafkatest.Start(t, kafkatest.Topics(2, topic))
	kafka.ProduceEnvelopes(t, topic, kafkatest.Envelopes(topic, 5)...)
	m := &mesh{admins: e2e.StartAdmins(t, e2e.AdminOptions{Size: 1, Args: conn})}
	m.admins.CreateNamespace(60*time.Second, namespace, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
	m.runner = e2e.StartRunner(t, e2e.RunnerOptions{ProxyID: proxyID, Brokers: kafka.Brokers, Args: append([]string{"--batch-wait", "20ms"}, conn...)})
	m.sidecar = e2e.StartSidecar(t, e2e.SidecarOptions{ProxyID: proxyID, RunnerID: "runner-1", Runner: m.runner, Admins: m.admins.GRPCAddrs(), Lease: lease})
	testwait.For(t, 60*time.Second, "sidecar ready", m.sidecar.Ready)
	m.gateway = e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gw-1", Admins: m.admins.GRPCAddrs(), Timeout: 3 * time.Second, Args: conn})
	served := func() (bool, string) {
		code, msg, err := m.queryStats("")
		return err == nil && code == http.StatusOK, fmt.Sprint(code, " ", msg, " ", err)
	}
	testwait.For(t, 60*time.Second, "the mailbox through the gateway", served)
	before := m.state(t)

	admin := m.admins.Nodes[0]
	operator := e2e.ClientTLS(t, nil, identity.Operator, e2e.Operator)
	reader := e2e.ClientTLS(t, nil, identity.Reader, "r")
	sidecar := e2e.ClientTLS(t, nil, identity.Proxy, proxyID)
	t.Run("listeners", func(t *testing.T) {
		for _, l := range []struct {
			name, addr string
			h2         bool        // speaks HTTP/2
			cfg        *tls.Config // nil: plaintext
		}{
			{"admin gRPC", admin.GRPCAddr, true, operator},
			{"admin HTTP", admin.HTTPAddr, false, nil},
			{"runner query", m.runner.QueryAddr, true, reader},
			{"runner HTTP", m.runner.HTTPAddr, true, nil},
			{"runner control API", m.runner.ControlAddr, true, sidecar},
			{"gateway HTTP", m.gateway.HTTPAddr, false, nil},
			{"gateway gRPC", m.gateway.GRPCAddr, true, nil},
		} {
			t.Run(l.name+": nothing sent", func(t *testing.T) {
				t.Parallel()
				conntest.ClosedUnused(t, l.addr, handshake)
			})
			if !l.h2 {
				continue
			}
			t.Run(l.name+": no stream", func(t *testing.T) {
				t.Parallel()
				conntest.IdleClosed(t, l.addr, l.cfg, idle)
			})
			t.Run(l.name+": ping flood", func(t *testing.T) {
				t.Parallel()
				conntest.PingFloodSentAway(t, l.addr, l.cfg)
			})
		}
	})
	// The checks above took a few idle bounds; the sidecar stays ready for
	// a few more, in which its connections would be cut if they were going
	// to be.
	for end := time.Now().Add(3 * idle); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if ok, why := m.sidecar.Ready(); !ok {
			t.Fatalf("the sidecar went unready under the connection bounds: %s", why)
		}
	}
	testwait.For(t, 10*time.Second, "the mailbox still through the gateway", served)
	if d := diff(before, m.state(t)); d != "" {
		t.Fatalf("the mesh changed under the connection bounds: %s", d)
	}
}
