package xdsgrpc

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/rls" // the x-prism-namespace route's cluster specifier
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/xdstest"
)

// TestNamespaceCallsFollowTheAlias: a call naming only its namespace
// (x-prism-namespace, as prism gateway sends for /v1/namespaces/) is routed
// by grpc-go's RLS, asking the admin's lookup, to the runner of the
// namespace's current mailbox; it follows the namespace when it moves
// (within the lookup's cache age), and gets NotFound naming the namespace
// once it is gone; a call naming a mailbox too is routed by the mailbox.
func TestNamespaceCallsFollowTheAlias(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "runner-a", "runner-b")
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(w.cp.Addr, "test-"+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(kv ...string) func(ctx context.Context) string {
		return func(ctx context.Context) string {
			var hdr metadata.MD
			_, err := mailboxv1.NewMailboxQueryClient(conn).GetStats(metadata.AppendToOutgoingContext(ctx, kv...),
				&mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
			if err != nil {
				return "code:" + status.Code(err).String() + " " + status.Convert(err).Message()
			}
			return first(hdr.Get(xdstest.RunnerHeader))
		}
	}
	a, b := w.runners["runner-a"], w.runners["runner-b"]
	a.Hold("audit@proxy-a")
	b.Hold("$admin@proxy-b")
	w.cp.Namespaces.Set("audit", "audit@proxy-a", 3)
	w.cp.Namespaces.Set("$admin", "$admin@proxy-b", 4)
	w.publish(map[string]string{"proxy-a": "runner-a", "proxy-b": "runner-b"})
	await(t, "audit by namespace", ask(mesh.HeaderNamespace, "audit"), "runner-a")
	await(t, "$admin by namespace", ask(mesh.HeaderNamespace, "$admin"), "runner-b")
	await(t, "mailbox and namespace", ask(mesh.HeaderNamespace, "audit", mesh.HeaderMailboxID, "$admin@proxy-b"), "runner-b")
	await(t, "unknown namespace", ask(mesh.HeaderNamespace, "nobody"),
		`code:NotFound namespace "nobody" is not routed: no live lease serves it`)

	// The namespace's current mailbox moves to another proxy: no route
	// changes, the lookup answers anew once grpc-go's cached answer ages.
	a.Release("audit@proxy-a")
	b.Hold("audit@proxy-b")
	w.cp.Namespaces.Set("audit", "audit@proxy-b", 8)
	await(t, "audit after the move", ask(mesh.HeaderNamespace, "audit"), "runner-b")

	// The namespace's route is withdrawn while the mailbox keeps its lease.
	w.cp.Namespaces.Set("audit", "", 0)
	await(t, "audit without a route", ask(mesh.HeaderNamespace, "audit"),
		`code:NotFound namespace "audit" is not routed: no live lease serves it`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := ask(mesh.HeaderMailboxID, "audit@proxy-b")(ctx); got != "runner-b" {
		t.Fatalf("audit@proxy-b by mailbox after its namespace route went: %s", got)
	}
}

// TestNamespaceCallsTakeClustersInUse: a namespace call is answered in one
// call, without waiting for any later xDS update, when the cluster behind
// the lookup's answer is already in use: its proxy's by an x-mailbox-id
// call, the admin nodes' by a call no proxy takes. grpc-go v1.85's RLS
// child for a target a route already names waits for an update that never
// comes (ir.LookupCluster), so without the lookup aggregates both calls
// below run out their deadline; an unknown namespace is NotFound naming it.
func TestNamespaceCallsTakeClustersInUse(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "runner-a")
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(w.cp.Addr, "test-"+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w.runners["runner-a"].Hold("audit@proxy-a")
	w.cp.Namespaces.Set("audit", "audit@proxy-a", 3)
	w.publish(map[string]string{"proxy-a": "runner-a"})
	await(t, "audit by mailbox", func(ctx context.Context) string {
		return outcome(xdstest.WhoAnswers(ctx, conn, "audit@proxy-a"))
	}, "runner-a")
	await(t, "a mailbox of no proxy", func(ctx context.Context) string {
		return outcome(xdstest.WhoAnswers(ctx, conn, "ghost@proxy-z"))
	}, "code:NotFound")

	// Nothing is published from here on.
	call := func(ns string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var hdr metadata.MD
		_, err := mailboxv1.NewMailboxQueryClient(conn).GetStats(metadata.AppendToOutgoingContext(ctx, mesh.HeaderNamespace, ns),
			&mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
		return first(hdr.Get(xdstest.RunnerHeader)), err
	}
	if runner, err := call("audit"); err != nil || runner != "runner-a" {
		t.Fatalf("audit by namespace, its proxy's cluster in use: runner %q, %v; want runner-a", runner, err)
	}
	_, err = call("nobody")
	if st := status.Convert(err); st.Code() != codes.NotFound || !strings.Contains(st.Message(), `"nobody"`) {
		t.Fatalf("unknown namespace, the admin cluster in use: %v, want NotFound naming it", err)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// TestNamespaceLookupAnswersAgeBriefly: grpc-go keeps the lookup's answer
// for a namespace, "not routed" included, for the lookup's max age of
// 250 ms (xds/translator), so a namespace granted a lease while a client
// queries it steadily is answered by its runner within that age of the
// grant, and so is a move; a query naming its own lookup nonce
// (mesh.HeaderLookupNonce, as prism gateway's retries do) is looked up
// anew at once.
func TestNamespaceLookupAnswersAgeBriefly(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "runner-a", "runner-b")
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(w.cp.Addr, "test-"+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w.publish(map[string]string{"proxy-a": "runner-a", "proxy-b": "runner-b"})
	ask := func(kv ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var hdr metadata.MD
		_, err := mailboxv1.NewMailboxQueryClient(conn).GetStats(metadata.AppendToOutgoingContext(ctx, kv...),
			&mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
		return outcome(first(hdr.Get(xdstest.RunnerHeader)), err)
	}
	// followed polls the namespace every 10 ms from its change until want
	// answers, and returns how long that took.
	followed := func(change func(), want string) time.Duration {
		t.Helper()
		change()
		start := time.Now()
		for time.Since(start) < 30*time.Second {
			if got := ask(mesh.HeaderNamespace, "fresh"); got == want {
				return time.Since(start)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("fresh never answered by %s", want)
		return 0
	}
	// Both proxies' lookup clusters in use first, so what is timed below is
	// the cache's age, not grpc-go subscribing to a cluster and connecting.
	for _, p := range []string{"a", "b"} {
		w.runners["runner-"+p].Hold("warm-" + p + "@proxy-" + p)
		w.cp.Namespaces.Set("warm-"+p, "warm-"+p+"@proxy-"+p, 1)
		await(t, "warm-"+p, func(context.Context) string { return ask(mesh.HeaderNamespace, "warm-"+p) }, "runner-"+p)
	}
	await(t, "fresh not routed", func(context.Context) string { return ask(mesh.HeaderNamespace, "fresh") }, "code:NotFound")

	granted := followed(func() {
		w.runners["runner-a"].Hold("fresh@proxy-a")
		w.cp.Namespaces.Set("fresh", "fresh@proxy-a", 3)
	}, "runner-a")
	moved := followed(func() {
		w.runners["runner-b"].Hold("fresh@proxy-b")
		w.cp.Namespaces.Set("fresh", "fresh@proxy-b", 5)
	}, "runner-b")
	t.Logf("granted: answered by its runner %v after the grant; moved: %v after the move", granted.Round(time.Millisecond), moved.Round(time.Millisecond))
	for what, late := range map[string]time.Duration{"a granted namespace": granted, "a moved namespace": moved} {
		if late > time.Second {
			t.Errorf("%s was followed %v after the change, want within the lookup's 250 ms age (+750 ms slack for a loaded machine)", what, late)
		}
	}

	// A nonce takes the lookup past the cache: the first call after a move
	// already reaches the new holder.
	w.runners["runner-a"].Hold("fresh@proxy-a")
	w.cp.Namespaces.Set("fresh", "fresh@proxy-a", 7)
	if got := ask(mesh.HeaderNamespace, "fresh", mesh.HeaderLookupNonce, "1"); got != "runner-a" {
		t.Fatalf("a call with a nonce right after a move: %s, want runner-a", got)
	}
}
