package xdsgrpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/xdstest"
)

// TestNamespaceCallsFollowTheAlias: a call naming only its namespace
// (x-prism-namespace, as prism gateway sends for /v1/namespaces/) lands on
// the runner of the namespace's current mailbox, follows the alias when it
// moves, and gets NotFound naming the namespace once it is gone; a call
// naming a mailbox too is routed by the mailbox.
func TestNamespaceCallsFollowTheAlias(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "runner-a", "runner-b")
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(w.cp.Addr, "test-"+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	publish := func(mailboxes []ir.Mailbox, aliases ...ir.Alias) {
		w.version++
		x := &ir.IR{Version: w.version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, NotFound: []string{w.cp.Addr},
			Mailboxes: mailboxes, Aliases: aliases}
		for id, r := range w.runners {
			x.Runners = append(x.Runners, ir.Runner{ID: id, Address: r.Addr, Healthy: true})
		}
		w.cp.Update(x)
	}
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
	auditA := ir.Mailbox{ID: "audit@proxy-a", Namespace: "audit", RunnerID: "runner-a", Epoch: 3}
	auditB := ir.Mailbox{ID: "audit@proxy-b", Namespace: "audit", RunnerID: "runner-b", Epoch: 8}
	admin := ir.Mailbox{ID: "$admin@proxy-b", Namespace: "$admin", RunnerID: "runner-b", Epoch: 4}

	publish([]ir.Mailbox{auditA, admin}, ir.Alias{Namespace: "audit", MailboxID: auditA.ID}, ir.Alias{Namespace: "$admin", MailboxID: admin.ID})
	await(t, "audit by namespace", ask(mesh.HeaderNamespace, "audit"), "runner-a")
	await(t, "$admin by namespace", ask(mesh.HeaderNamespace, "$admin"), "runner-b")
	await(t, "mailbox and namespace", ask(mesh.HeaderNamespace, "audit", mesh.HeaderMailboxID, admin.ID), "runner-b")
	await(t, "unknown namespace", ask(mesh.HeaderNamespace, "nobody"),
		`code:NotFound namespace "nobody" is not routed: no live lease serves it`)

	// The namespace's current mailbox moves to another proxy's runner.
	publish([]ir.Mailbox{auditB, admin}, ir.Alias{Namespace: "audit", MailboxID: auditB.ID}, ir.Alias{Namespace: "$admin", MailboxID: admin.ID})
	await(t, "audit after the move", ask(mesh.HeaderNamespace, "audit"), "runner-b")

	// The alias is withdrawn while the mailbox keeps its lease.
	publish([]ir.Mailbox{auditB, admin}, ir.Alias{Namespace: "$admin", MailboxID: admin.ID})
	await(t, "audit without an alias", ask(mesh.HeaderNamespace, "audit"),
		`code:NotFound namespace "audit" is not routed: no live lease serves it`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := ask(mesh.HeaderMailboxID, auditB.ID)(ctx); got != "runner-b" {
		t.Fatalf("audit@proxy-b by mailbox after its alias went: %s", got)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
