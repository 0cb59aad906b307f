package moves

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/movetest"
	"github.com/prism-mesh/prism/testkit/testbin"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// threeProxies starts proxies 1-3, creates namespaces read from the quiet
// topic and waits until each is served where hashing places it.
func threeProxies(t *testing.T, prefix string, n int) (*movetest.World, []string, map[string]string) {
	t.Helper()
	w := movetest.New(t)
	ids := []string{"proxy-1", "proxy-2", "proxy-3"}
	for _, id := range ids {
		w.StartProxy(id, batchWait...)
	}
	w.AwaitProxies(ids...)
	tab := placement.Compute(ids)
	var names []string
	where := map[string]string{}
	for i := range n {
		ns := fmt.Sprintf("%s-%d", prefix, i)
		names = append(names, ns)
		where[ns] = tab.Owner(placement.Partition(ns))
	}
	create(w, names)
	w.StartGateway()
	w.Served(where, allEvents, 60*time.Second)
	return w, names, where
}

// TestMoveByHandWithoutAFailedQuery: `prismctl namespace move`'s call moves
// a namespace to another proxy while a client reads it: no query fails.
func TestMoveByHandWithoutAFailedQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w, names, where := threeProxies(t, "byhand", 3)
	ns := names[0]
	to := "proxy-1"
	if where[ns] == to {
		to = "proxy-2"
	}
	r := read(w, names)
	w.Must("move "+ns, func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: to})
		return err
	})
	where[ns] = to
	w.Settled(where, 60*time.Second)
	w.Served(where, allEvents, 30*time.Second)
	time.Sleep(2 * time.Second)
	answers := r.End()
	t.Logf("%s moved to %s; %d queries", ns, to, len(answers))
	check(t, answers)
}

// TestDrainWithoutAFailedQuery: a cordoned (drained) proxy hands every
// namespace off while a client reads them; uncordoned, it gets its share
// back the same way.
func TestDrainWithoutAFailedQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w, names, where := threeProxies(t, "drain", 6)
	drained := where[names[0]]
	var others []string
	for _, id := range []string{"proxy-1", "proxy-2", "proxy-3"} {
		if id != drained {
			others = append(others, id)
		}
	}
	rest := placement.Compute(others)
	after := map[string]string{}
	held := 0
	for _, ns := range names {
		after[ns] = rest.Owner(placement.Partition(ns))
		if where[ns] == drained {
			held++
		}
	}
	r := read(w, names)
	cordon := func(on bool) {
		w.Must(fmt.Sprint("cordon ", drained, " ", on), func(ctx context.Context, a adminv1.AdminClient) error {
			_, err := a.CordonProxy(ctx, &adminv1.CordonProxyRequest{ProxyId: drained, Cordoned: on})
			return err
		})
	}
	cordon(true)
	w.Settled(after, 90*time.Second)
	w.Served(after, allEvents, 30*time.Second)
	cordon(false)
	w.Settled(where, 90*time.Second)
	w.Served(where, allEvents, 30*time.Second)
	time.Sleep(2 * time.Second)
	answers := r.End()
	t.Logf("%s drained of %d namespaces and uncordoned; %d queries", drained, held, len(answers))
	check(t, answers)
}

// TestRollingRestartWithoutAFailedQuery restarts every runner one by one in
// the kubelet's order with native sidecars: the runner container's preStop
// hook (`prism sidecar drain-wait`) hands its proxy's namespaces off, then
// the runner gets SIGTERM and exits, then its sidecar; both come back (a new
// sidecar process, so its own drain is over) and rebalancing hands the
// namespaces back. A client reads every namespace throughout: no query fails.
func TestRollingRestartWithoutAFailedQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	w, names, where := threeProxies(t, "rolling", 6)
	prism, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	r := read(w, names)
	for _, id := range []string{"proxy-1", "proxy-2", "proxy-3"} {
		p := w.Proxies[id]
		preStop := exec.Command(prism, "sidecar", "drain-wait", "--addr", p.Sidecar.HTTPAddr, "--timeout", "60s")
		if out, err := preStop.CombinedOutput(); err != nil {
			t.Fatalf("%s preStop: %v\n%s", id, err, out)
		}
		if err := p.Runner.Term(15 * time.Second); err != nil {
			t.Fatalf("%s runner: %v", id, err)
		}
		if err := p.Sidecar.Term(15 * time.Second); err != nil {
			t.Fatalf("%s sidecar: %v", id, err)
		}
		p.Runner.Restart()
		p.Sidecar.Restart()
		w.Settled(where, 90*time.Second)
		w.Served(where, allEvents, 30*time.Second)
	}
	time.Sleep(2 * time.Second)
	answers := r.End()
	t.Logf("three runners restarted in the kubelet's order; %d queries", len(answers))
	check(t, answers)
}

// TestDestinationDiesDuringCatchUp: a namespace with a long history is moved
// and its destination's runner is stopped before it can catch up, then
// killed. The move is abandoned and the source never stops serving: no
// query fails and every answer comes from the source's mailbox.
func TestDestinationDiesDuringCatchUp(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const big = "big.events"
	w := movetest.New(t, kafkatest.Topics(2, big))
	w.Kafka.ProduceEnvelopes(t, big, kafkatest.Envelopes(big, 20000)...)
	ids := []string{"proxy-1", "proxy-2"}
	for _, id := range ids {
		w.StartProxy(id, batchWait...)
	}
	// Both registered before the namespace is: placed while only one was,
	// it would be moved by rebalancing, and the hand move below refused
	// while that move's tail runs.
	w.AwaitProxies(ids...)
	ns := movetest.OwnedBy("deep", "proxy-1", ids...)
	w.Admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{big}, Lease: movetest.Lease.Config()})
	w.StartGateway()
	testwait.For(t, 90*time.Second, ns+" caught up on proxy-1", func() (bool, string) {
		a := w.Ask(ns)
		return a.OK() && a.Mailbox == ns+"@proxy-1" && a.Events == 20000, a.String()
	})
	r := read(w, []string{ns})
	w.Must("move "+ns, func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: "proxy-2"})
		return err
	})
	dest := w.Proxies["proxy-2"].Runner
	dest.Pause()
	time.Sleep(time.Second)
	dest.Kill()
	// The destination's sidecar reports its runner dead after
	// --runner-dead-after (three heartbeats, 1.5 s), which abandons the move.
	w.Settled(map[string]string{ns: "proxy-1"}, 30*time.Second)
	time.Sleep(2 * time.Second)
	answers := r.End()
	t.Logf("move of %s abandoned; %d queries", ns, len(answers))
	check(t, answers)
	for _, a := range answers {
		if a.Mailbox != ns+"@proxy-1" {
			t.Fatalf("answered by %q during an abandoned move: %s", a.Mailbox, a)
		}
	}
}
