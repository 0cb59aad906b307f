package cache

import (
	"fmt"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// TestEqualAgreesWithProtoEqual compares every resource of successive
// translations (shared routes and rebuilt ones) both ways.
func TestEqualAgreesWithProtoEqual(t *testing.T) {
	t.Parallel()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, NotFound: []string{"127.0.0.1:9"},
		Runners: []ir.Runner{{ID: "a", Address: "127.0.0.1:1", Healthy: true}, {ID: "b", Address: "127.0.0.1:2", Healthy: true}}}
	for i := range 20 {
		ns := fmt.Sprintf("ns%d", i)
		x.Mailboxes = append(x.Mailboxes, ir.Mailbox{ID: ns + "@p", Namespace: ns, RunnerID: "a", Epoch: 1})
		x.Aliases = append(x.Aliases, ir.Alias{Namespace: ns, MailboxID: ns + "@p"})
	}
	tr := translator.New()
	var states []*translator.Resources
	for _, change := range []func(*ir.IR){
		func(*ir.IR) {},
		func(x *ir.IR) { x.Mailboxes[7].RunnerID = "b" },
		func(x *ir.IR) { x.Mailboxes[7].Epoch = 9 },
		func(x *ir.IR) { x.Runners[1].Healthy = false },
		func(x *ir.IR) { x.Aliases = x.Aliases[:10] },
		func(*ir.IR) {},
	} {
		change(x)
		res, err := tr.Translate(x)
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, res)
		fresh, _ := translator.Translate(x)
		states = append(states, fresh)
	}
	for i := range states {
		for j := range states {
			for typ, items := range states[i].ByType() {
				other := states[j].ByType()[typ]
				for k := range min(len(items), len(other)) {
					a, b := items[k], other[k]
					if got, want := equal(a.ProtoReflect(), b.ProtoReflect()), proto.Equal(a, b); got != want {
						t.Fatalf("states %d/%d %s[%d]: equal = %v, proto.Equal = %v", i, j, typ, k, got, want)
					}
				}
			}
		}
	}
	if equal((&routev3.Route{}).ProtoReflect(), (&routev3.Route{Name: "x"}).ProtoReflect()) {
		t.Fatal("routes with different names are equal")
	}
}
