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
	"github.com/prism-mesh/prism/xds/xdstest"
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
