package gatewaye2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// stats asks the gateway for a mailbox's stats and describes the answer.
func stats(gw *e2e.Gateway, mailbox string) (code int, events int64, epoch string, body string) {
	code, body, hdr, err := web.Get(gw.HTTPURL() + "/v1/mailboxes/" + mailbox + "/stats")
	if err != nil {
		return 0, 0, "", err.Error()
	}
	var st struct {
		TotalEvents int64 `json:"total_events"`
	}
	_ = json.Unmarshal([]byte(body), &st)
	return code, st.TotalEvents, hdr.Get(mesh.HeaderEpoch), body
}

// served waits until the gateway answers 200 for mailbox with wantEvents
// events (any number when negative) and returns the epoch it was served under.
func served(t *testing.T, gw *e2e.Gateway, mailbox string, wantEvents int64) string {
	t.Helper()
	var epoch string
	testwait.For(t, 60*time.Second, mailbox+" served through the gateway", func() (bool, string) {
		code, events, e, body := stats(gw, mailbox)
		epoch = e
		return code == 200 && e != "" && (wantEvents < 0 || events == wantEvents), fmt.Sprint(code, " ", body)
	})
	return epoch
}

// connectedTo is the admin node holding the gateway's ADS stream, or nil.
func connectedTo(nodes []*e2e.AdminNode) *e2e.AdminNode {
	for _, n := range nodes {
		if !n.Alive() {
			continue
		}
		if v, err := web.Metric("http://"+n.HTTPAddr, "prism_xds_connected_clients", `protocol="sotw"`); err == nil && v == 1 {
			return n
		}
	}
	return nil
}

// TestGatewayThroughAdminFailover: the gateway is given the followers first,
// so it takes its routes from a follower. The leader is killed: queries stay
// served and a new namespace's mailbox becomes reachable through the same
// follower. Then, with the old leader back, the gateway's own node is
// killed: queries stay served, the gateway moves to another node, and later
// changes (a new mailbox) still arrive; a released lease is answered 404 by
// the runner.
func TestGatewayThroughAdminFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three admin nodes, a runner, a sidecar and a gateway")
	}
	kafka := kafkatest.Start(t, kafkatest.Topics(2, "audit.events", "billing.events", "orders.events"))
	kafka.ProduceEnvelopes(t, "audit.events", kafkatest.Envelopes("audit.events", 5)...)
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3})
	admins := cluster.Nodes
	createNamespace(cluster, "audit", "audit.events")
	r := e2e.StartRunner(t, e2e.RunnerOptions{Brokers: kafka.Brokers, Args: []string{"--batch-wait", "20ms", "--log-format", "json"}})
	sidecar := e2e.StartSidecar(t, e2e.SidecarOptions{ProxyID: proxyID, RunnerID: "runner-1", Runner: r, Admins: cluster.GRPCAddrs(), Lease: lease})

	leader := e2e.Leader(admins...)
	if leader == nil {
		t.Fatal("no leader")
	}
	var followers []*e2e.AdminNode
	for _, n := range admins {
		if n != leader {
			followers = append(followers, n)
		}
	}
	gw := e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gateway-e2e", Admins: []string{followers[0].GRPCAddr, followers[1].GRPCAddr, leader.GRPCAddr}, Timeout: 3 * time.Second})
	epoch := served(t, gw, "audit@proxy-1", 5)
	if code, _, _, err := web.Get(gw.HTTPURL() + "/readyz"); code != 200 {
		t.Fatalf("gateway /readyz = %d %v while serving", code, err)
	}
	if c := connectedTo(admins); c != followers[0] {
		t.Fatalf("gateway takes its routes from %v, want the first follower %s", c, followers[0].ID)
	}
	sameByNamespace(t, gw, "audit", "audit@proxy-1")

	// The leader dies; the gateway's follower lives on.
	leader.Kill()
	for range 20 {
		if code, _, e, body := stats(gw, "audit@proxy-1"); code != 200 || e != epoch {
			t.Fatalf("with the leader dead the gateway answers %d epoch %q: %s", code, e, body)
		}
		time.Sleep(25 * time.Millisecond)
	}
	createNamespace(cluster, "billing", "billing.events")
	served(t, gw, "billing@proxy-1", -1)
	if c := connectedTo(admins); c != followers[0] {
		t.Fatalf("after the leader's death the gateway is connected to %v, want %s", c, followers[0].ID)
	}

	// The old leader comes back, so two nodes remain a quorum once the
	// gateway's own node dies.
	leader.Restart()
	testwait.For(t, 60*time.Second, "a leader with the old one back", func() (bool, string) {
		return e2e.Leader(admins...) != nil, "no leader"
	})
	followers[0].Kill()
	killed := time.Now()
	for range 20 {
		if code, _, e, body := stats(gw, "audit@proxy-1"); code != 200 || e != epoch {
			t.Fatalf("with its admin node dead the gateway answers %d epoch %q: %s", code, e, body)
		}
		time.Sleep(25 * time.Millisecond)
	}
	testwait.For(t, 60*time.Second, "the gateway on another admin node", func() (bool, string) {
		c := connectedTo(admins)
		return c != nil && c != followers[0], fmt.Sprint(c)
	})
	t.Logf("gateway reconnected to another admin node %v after its own died", time.Since(killed).Round(time.Millisecond))
	createNamespace(cluster, "orders", "orders.events")
	created := time.Now()
	served(t, gw, "orders@proxy-1", -1)
	t.Logf("a mailbox created after the failover is served through the gateway %v after its namespace", time.Since(created).Round(time.Millisecond))

	// A released lease: the sidecar has its runner close the mailbox before
	// the lease goes, and routes are per proxy, so the route to proxy-1
	// stays and the runner itself answers a JSON 404 naming the mailbox,
	// without the x-prism headers of a mailbox it serves. The namespace's
	// lookup ends at the admin's not-found service once its cached answer
	// ages.
	if err := sidecar.Term(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "released mailbox 404 from its runner", func() (bool, string) {
		code, body, hdr, err := web.Get(gw.HTTPURL() + "/v1/mailboxes/audit@proxy-1/stats")
		var e map[string]string
		return code == 404 && json.Unmarshal([]byte(body), &e) == nil && strings.Contains(e["error"], `mailbox "audit@proxy-1" is not served here`) &&
			hdr.Get(mesh.HeaderMailbox) == "" && hdr.Get(mesh.HeaderEpoch) == "", fmt.Sprint(code, " ", body, " ", hdr, err)
	})
	testwait.For(t, 30*time.Second, "released namespace 404 from the mesh", func() (bool, string) {
		code, body, _, err := web.Get(gw.HTTPURL() + "/v1/namespaces/audit/stats")
		return code == 404 && strings.Contains(body, `namespace \"audit\" is not routed`), fmt.Sprint(code, " ", body, err)
	})
	if v, err := web.Metric(gw.HTTPURL(), "prism_gateway_http_requests_total", `code="200"`, `method="GetStats"`); err != nil || v < 40 {
		t.Errorf("gateway counted %v successful GetStats (%v), want at least 40", v, err)
	}
}

// sameByNamespace waits until the gateway answers /v1/namespaces/{ns}/...
// exactly as /v1/mailboxes/{mailbox}/... (the admin's namespace lookup
// picks the proxy, the runner finds its mailbox of the namespace), and
// checks an unknown namespace is a JSON 404.
func sameByNamespace(t *testing.T, gw *e2e.Gateway, ns, mailbox string) {
	t.Helper()
	base := gw.HTTPURL()
	for _, path := range []string{"/stats", "/events?limit=3", "/events/audit.events-0002"} {
		testwait.For(t, 60*time.Second, "namespace "+ns+path+" served as its mailbox", func() (bool, string) {
			code, body, hdr, err := web.Get(base + "/v1/namespaces/" + ns + path)
			wantCode, wantBody, wantHdr, _ := web.Get(base + "/v1/mailboxes/" + mailbox + path)
			return err == nil && code == 200 && code == wantCode && body == wantBody &&
					hdr.Get(mesh.HeaderMailbox) == mailbox && hdr.Get(mesh.HeaderEpoch) == wantHdr.Get(mesh.HeaderEpoch),
				fmt.Sprintf("by namespace %d %s %v; by mailbox %d %s", code, body, err, wantCode, wantBody)
		})
	}
	code, body, _, err := web.Get(base + "/v1/namespaces/nobody/stats")
	var e map[string]string
	if code != 404 || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e["error"], `namespace "nobody"`) {
		t.Errorf("unknown namespace = %d %q %v, want a JSON 404 naming it", code, body, err)
	}
}
