package translator

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// FuzzMailboxRoutes: any mailbox the IR accepts translates into resources
// that pass ValidateAll, and its raw and percent-encoded paths, its
// namespace alias, and gRPC calls naming either by header route to its
// runner.
func FuzzMailboxRoutes(f *testing.F) {
	for _, seed := range [][2]string{{"$admin", "proxy-01"}, {"audit.v2", "p"}, {"$a$b$c", "x"}, {"a", "b~c_d"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, ns, proxy string) {
		m := ir.Mailbox{ID: mesh.MailboxID{Namespace: ns, Proxy: proxy}.String(), Namespace: ns, RunnerID: "runner-1", Epoch: 1}
		if m.Validate() != nil {
			return
		}
		x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
			Runners:   []ir.Runner{{ID: "runner-1", Address: "127.0.0.1:9000", Healthy: true}},
			Mailboxes: []ir.Mailbox{m},
			Aliases:   []ir.Alias{{Namespace: ns, MailboxID: m.ID}},
		}
		res, err := Translate(x)
		if err != nil {
			t.Fatalf("valid mailbox %q: %v", m.ID, err)
		}
		routes := res.Routes[0].GetVirtualHosts()[0].GetRoutes()
		for _, md := range []map[string]string{{mesh.HeaderMailboxID: m.ID}, {mesh.HeaderNamespace: ns}} {
			if got := grpcRoute(routes, md).GetRoute().GetCluster(); got != ClusterName("runner-1") {
				t.Fatalf("gRPC call with %v routes to %q", md, got)
			}
		}
		var paths []*routev3.Route
		for _, r := range routes {
			if len(r.GetMatch().GetHeaders()) == 0 {
				paths = append(paths, r)
			}
		}
		enc := strings.NewReplacer("$", "%24", "@", "%40")
		for _, p := range []string{
			"/v1/mailboxes/" + m.ID + "/events", "/v1/mailboxes/" + enc.Replace(m.ID) + "/events",
			"/v1/namespaces/" + ns + "/events", "/v1/namespaces/" + enc.Replace(ns) + "/events",
		} {
			r := route(paths, p)
			if got := r.GetRoute().GetCluster(); got != ClusterName("runner-1") {
				t.Fatalf("%q routes to %q", p, got)
			}
			if got, want := rewrite(r, p), "/v1/mailboxes/"+m.ID+"/events"; strings.HasPrefix(p, "/v1/namespaces/") && got != want {
				t.Fatalf("%q rewritten to %q, want %q", p, got, want)
			}
		}
	})
}
