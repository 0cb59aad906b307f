package translator

import (
	"fmt"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/xds/ir"
)

// mesh1k is 1,000 proxies with 32-character ids, the largest scale the
// issue names (a million mailboxes on them change none of it).
func mesh1k(tls, auth bool) *ir.IR {
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "0.0.0.0:8080"}, Lookup: "dns:///prism-admin.prism.svc.cluster.local:9000"}
	for i := range 3 {
		x.Admins = append(x.Admins, fmt.Sprintf("10.0.1.%d:9000", i+1))
	}
	if tls {
		x.Gateway.UpstreamTLS = ir.UpstreamTLS{TrustDomain: "prism.example.com"}
	}
	if auth {
		x.Gateway.QueryAuth = ir.QueryAuth{Issuer: "https://idp.example.com", Audience: "prism", JWKSURL: "https://idp.example.com/.well-known/jwks.json"}
	}
	for i := range 1000 {
		id := fmt.Sprintf("prism-proxy-%04d-abcdefghijklmnop", i)
		x.Proxies = append(x.Proxies, ir.Proxy{ID: id, RunnerID: id, Address: fmt.Sprintf("10.%d.%d.%d:8982", i/65536, i/256%256, i%256), Healthy: true})
	}
	return x
}

// TestResponsesFitAt1kProxies: with 1,000 proxies, upstream TLS and query
// auth, every resource type a client is served, all its resources in one
// state-of-the-world response, stays under 512 KB, far below grpc-go's
// 4 MiB limit; the tables grow with proxies only. grpc-go's clusters count
// the lookup aggregates, two clusters per proxy.
func TestResponsesFitAt1kProxies(t *testing.T) {
	t.Parallel()
	const limit = 512 << 10
	for _, c := range []struct {
		name      string
		tls, auth bool
	}{{"plain", false, false}, {"upstream TLS and query auth", true, true}} {
		res, err := Translate(mesh1k(c.tls, c.auth))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(res.Clusters); n != 2*1000+2 {
			t.Fatalf("%s: grpc-go is served %d clusters, want a proxy cluster and its lookup aggregate per proxy, and prism/admin and its", c.name, n)
		}
		for variant, byType := range map[string]map[resource.Type][]types.Resource{"grpc-go": res.ForGRPC(), "envoy": res.ForEnvoy()} {
			for typ, list := range byType {
				n := 0
				for _, m := range list {
					n += proto.Size(m)
				}
				if n > limit {
					t.Errorf("%s, %s %s: %d bytes at 1,000 proxies, over %d", c.name, variant, typ, n, limit)
				} else {
					t.Logf("%s, %s %s: %d bytes (%d per proxy)", c.name, variant, typ, n, n/1000)
				}
			}
		}
	}
}

// BenchmarkTranslate1k is a translation of 1,000 proxies from scratch, what
// every proxy registration or address change costs.
func BenchmarkTranslate1k(b *testing.B) {
	x := mesh1k(true, true)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Translate(x); err != nil {
			b.Fatal(err)
		}
	}
}
