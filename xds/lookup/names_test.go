package lookup

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// The lookup reads paths the translator defines, and answers with targets
// that must be clusters the translator serves grpc-go and no route names:
// grpc-go v1.85 stalls an RLS target a route already names
// (ir.LookupCluster).
func TestNamesMatchTheTranslator(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ what, lookup, translator string }{
		{"MailboxQuery prefix", mailboxQueryPrefix, translator.MailboxQueryPrefix},
		{"namespaces prefix", namespacesPrefix, translator.NamespacesPrefix},
	} {
		if tc.lookup != tc.translator {
			t.Errorf("%s: lookup says %q, the translator %q", tc.what, tc.lookup, tc.translator)
		}
	}

	res, err := translator.Translate(&ir.IR{
		Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{"127.0.0.1:9000"}, Lookup: "dns:///127.0.0.1:9000",
		Proxies: []ir.Proxy{{ID: "proxy-01", Address: "127.0.0.1:8982", Healthy: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]*clusterv3.Cluster{}
	for _, c := range res.Clusters {
		served[c.GetName()] = c
	}
	routed := map[string]bool{}
	for _, rc := range res.Routes {
		for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
			routed[r.GetRoute().GetCluster()] = true
		}
	}
	for _, target := range []string{ProxyTarget("proxy-01"), AdminTarget} {
		if c := served[target]; c == nil || c.GetClusterType() == nil {
			t.Errorf("target %s: grpc-go is served no aggregate cluster by that name", target)
		}
		if routed[target] {
			t.Errorf("target %s is a route's cluster", target)
		}
	}
}
