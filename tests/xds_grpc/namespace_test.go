package xdsgrpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/rls" // the x-prism-namespace route's cluster specifier
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
	// grpc-go v1.85's cds balancer, created by RLS for a target that the
	// route table already names (proxy/P, prism/admin), subscribes to it
	// and then waits for the next xDS config update instead of using the
	// cluster it already has (cdsbalancer.handleXDSConfigUpdate returns
	// after SubscribeToCluster; xdsdepmgr sends no update for a cluster it
	// already tracks), so the call waits until some resource changes.
	t.Skip("grpc-go v1.85: an RLS target already named by a route stays CONNECTING until the next xDS update (see the comment)")
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

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
