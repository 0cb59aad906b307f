package xdsgrpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

// The admins each test's xDS client dials, through a resolver of its own
// scheme. The xDS client reaches its management server by a bootstrap URI,
// so the resolver must be in grpc-go's global registry, which channels
// read without a lock: it is written here, before any test runs, and never
// while another test's channel may be resolving (a parallel test
// registering its scheme raced every xDS client being built).
var (
	failoverAdmins = manual.NewBuilderWithScheme("prism-admins-failover")
	laggingAdmins  = manual.NewBuilderWithScheme("prism-admins-lagging")
)

func init() {
	resolver.Register(failoverAdmins)
	resolver.Register(laggingAdmins)
}

// TestClientSurvivesLosingItsAdminNode runs three control planes fed the
// same states, as three admin nodes applying the same Raft log. The grpc-go
// client reaches them through one name resolving to all three (as a headless
// Service does); the node it is connected to dies: routes stay served, and a
// later runner move arrives through another node.
func TestClientSurvivesLosingItsAdminNode(t *testing.T) {
	t.Parallel()
	var nodes []*xdstest.ControlPlane
	var addrs []resolver.Address
	for range 3 {
		cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cp.Close)
		nodes = append(nodes, cp)
		addrs = append(addrs, resolver.Address{Addr: cp.Addr})
	}
	runners := map[string]*xdstest.Runner{}
	for _, id := range []string{"runner-a", "runner-b"} {
		r, err := xdstest.StartRunner(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		r.Hold("audit@proxy-a")
		runners[id] = r
	}
	// owner is the runner serving proxy-a: a change of owner is proxy-a's
	// runner restarting on another address.
	publish := func(version uint64, owner string, alive []*xdstest.ControlPlane) {
		x := &ir.IR{Version: version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}}
		for _, n := range alive {
			x.Admins = append(x.Admins, n.Addr)
		}
		x.Proxies = []ir.Proxy{{ID: "proxy-a", RunnerID: owner, Address: runners[owner].Addr, Healthy: true}}
		for _, n := range alive {
			n.Update(x)
		}
	}

	failoverAdmins.InitialState(resolver.State{Addresses: addrs})
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(failoverAdmins.Scheme()+":///admins", "failover-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(ctx context.Context) string { return outcome(xdstest.WhoAnswers(ctx, conn, "audit@proxy-a")) }

	publish(10, "runner-a", nodes)
	await(t, "audit on runner-a", ask, "runner-a")

	connected := -1
	for i, n := range nodes {
		if metric(t, n.Registry, "prism_xds_connected_clients", map[string]string{"protocol": "sotw"}) == 1 {
			connected = i
		}
	}
	if connected < 0 {
		t.Fatal("the client is connected to no admin node")
	}
	nodes[connected].Close()
	alive := append(append([]*xdstest.ControlPlane{}, nodes[:connected]...), nodes[connected+1:]...)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := ask(ctx); got != "runner-a" {
		t.Fatalf("with its admin node gone the client answers %q, want runner-a from the routes it has", got)
	}

	publish(11, "runner-b", alive)
	await(t, "audit after the move, served by another admin node", ask, "runner-b")
	total := 0.0
	for _, n := range alive {
		total += metric(t, n.Registry, "prism_xds_connected_clients", map[string]string{"protocol": "sotw"})
	}
	if total != 1 {
		t.Errorf("surviving admin nodes hold %v client streams, want 1", total)
	}
}

// TestLaggingAdminNodeDoesNotRollClientsBack: the client's node dies and the
// next node it reaches has not applied the latest routes yet (restarted,
// replaying its log). That node must not hand the client older routes; once
// it catches up, the client follows it again.
func TestLaggingAdminNodeDoesNotRollClientsBack(t *testing.T) {
	t.Parallel()
	var nodes []*xdstest.ControlPlane
	var addrs []resolver.Address
	for range 2 {
		cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cp.Close)
		nodes = append(nodes, cp)
		addrs = append(addrs, resolver.Address{Addr: cp.Addr})
	}
	current, lagging := nodes[0], nodes[1]
	runners := map[string]*xdstest.Runner{}
	for _, id := range []string{"runner-a", "runner-b"} {
		r, err := xdstest.StartRunner(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		r.Hold("audit@proxy-a")
		runners[id] = r
	}
	// owner is the runner serving proxy-a, "" when proxy-a is gone.
	state := func(version uint64, owner string) *ir.IR {
		x := &ir.IR{Version: version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{current.Addr, lagging.Addr}}
		if owner != "" {
			x.Proxies = []ir.Proxy{{ID: "proxy-a", RunnerID: owner, Address: runners[owner].Addr, Healthy: true}}
		}
		return x
	}

	laggingAdmins.InitialState(resolver.State{Addresses: addrs}) // pick_first: current first
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(laggingAdmins.Scheme()+":///admins", "lagging-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(ctx context.Context) string { return outcome(xdstest.WhoAnswers(ctx, conn, "audit@proxy-a")) }

	current.Update(state(10, "runner-a"))
	lagging.Update(state(10, "runner-a"))
	current.Update(state(11, "runner-b"))
	await(t, "client on the current node", ask, "runner-b")
	if metric(t, current.Registry, "prism_xds_connected_clients", map[string]string{"protocol": "sotw"}) != 1 {
		t.Fatal("the client did not connect to the first admin node")
	}

	current.Close()
	// The lagging node (version 10) refuses the client (version 11); the
	// client keeps its routes. A rollback would send audit to runner-a.
	await(t, "lagging node refuses the client", func(context.Context) string {
		if metric(t, lagging.Registry, "prism_xds_refused_streams_total", nil) > 0 {
			return "refused"
		}
		return "not yet"
	}, "refused")
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got := ask(ctx)
		cancel()
		if got != "runner-b" {
			t.Fatalf("client answered by %q while its admin node lags, want runner-b from the routes it had", got)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The lagging node catches up and goes on: the client follows it.
	lagging.Update(state(11, "runner-b"))
	lagging.Update(state(12, ""))
	await(t, "client follows the caught-up node", ask, "code:NotFound")
}
