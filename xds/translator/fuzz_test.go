package translator

import (
	"strings"
	"testing"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// FuzzProxyRoutes: any proxy the IR accepts translates into resources that
// pass ValidateAll, and a mailbox of it, by header or by its raw or
// percent-encoded path, routes to it and not to a proxy whose id extends
// its own.
func FuzzProxyRoutes(f *testing.F) {
	for _, seed := range [][2]string{{"$admin", "proxy-01"}, {"audit.v2", "p"}, {"$a$b$c", "x.y"}, {"a", "b~c_d"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, ns, proxy string) {
		p := ir.Proxy{ID: proxy, Address: "127.0.0.1:9000", Healthy: true}
		id, err := mesh.ParseMailboxID(mesh.MailboxID{Namespace: ns, Proxy: proxy}.String())
		if p.Validate() != nil || err != nil || id.Namespace != ns || strings.ContainsAny(ns, "/?#%") {
			return
		}
		longer := ir.Proxy{ID: proxy + "x", Address: "127.0.0.1:9001", Healthy: true}
		x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Lookup: "dns:///127.0.0.1:9", Proxies: []ir.Proxy{longer, p}}
		res, err := Translate(x)
		if err != nil {
			t.Fatalf("valid proxy %q: %v", proxy, err)
		}
		want := ClusterName(proxy)
		mid := id.String()
		for _, rc := range res.Routes {
			routes := rc.GetVirtualHosts()[0].GetRoutes()
			if got := target(match(routes, request{MailboxQueryPrefix + "Search", map[string]string{mesh.HeaderMailboxID: mid}})); got != want {
				t.Fatalf("%s: header %q routes to %s", rc.GetName(), mid, got)
			}
			if rc.GetName() != GatewayRouteConfigName {
				continue
			}
			enc := strings.NewReplacer("$", "%24", "@", "%40").Replace(mid)
			for _, path := range []string{"/v1/mailboxes/" + mid + "/events", "/v1/mailboxes/" + enc + "/events"} {
				if got := target(match(routes, request{path: path})); got != want {
					t.Fatalf("%q routes to %s", path, got)
				}
			}
		}
	})
}
