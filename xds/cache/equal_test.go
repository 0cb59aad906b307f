package cache

import (
	"fmt"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// TestEqualAgreesWithProtoEqual compares every resource of successive
// translations both ways.
func TestEqualAgreesWithProtoEqual(t *testing.T) {
	t.Parallel()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{"127.0.0.1:9"}}
	for i := range 20 {
		x.Proxies = append(x.Proxies, ir.Proxy{ID: fmt.Sprintf("p%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 1000+i), Healthy: true})
	}
	var states []*translator.Resources
	var prev *translator.Resources
	for _, change := range []func(*ir.IR){
		func(*ir.IR) {},
		func(x *ir.IR) { x.Proxies[7].Address = "127.0.0.1:2007" },
		func(x *ir.IR) { x.Proxies[7].RunnerID = "r7" },
		func(x *ir.IR) { x.Proxies[1].Healthy = false },
		func(x *ir.IR) { x.Proxies = x.Proxies[:10] },
		func(x *ir.IR) { x.Lookup = "dns:///127.0.0.1:9" },
		func(*ir.IR) {},
	} {
		change(x)
		res, err := translator.Translate(x)
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, res)
		// The objects served so far next to the new ones, as Set compares.
		if prev != nil {
			states = append(states, prev)
		}
		prev = res
	}
	variants := map[string]func(*translator.Resources) map[resource.Type][]types.Resource{
		"grpc-go": (*translator.Resources).ForGRPC,
		"envoy":   (*translator.Resources).ForEnvoy,
	}
	for name, variant := range variants {
		for i := range states {
			for j := range states {
				for typ, items := range variant(states[i]) {
					other := variant(states[j])[typ]
					for k := range min(len(items), len(other)) {
						a, b := items[k], other[k]
						if got, want := equal(a.ProtoReflect(), b.ProtoReflect()), proto.Equal(a, b); got != want {
							t.Fatalf("%s states %d/%d %s[%d]: equal = %v, proto.Equal = %v", name, i, j, typ, k, got, want)
						}
					}
				}
			}
		}
	}
	if equal((&routev3.Route{}).ProtoReflect(), (&routev3.Route{Name: "x"}).ProtoReflect()) {
		t.Fatal("routes with different names are equal")
	}
}
