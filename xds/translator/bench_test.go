package translator

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/xds/ir"
)

func mesh10k() *ir.IR {
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}}
	for i := range 20 {
		x.Runners = append(x.Runners, ir.Runner{ID: fmt.Sprintf("runner-%02d", i), Address: fmt.Sprintf("10.0.0.%d:8982", i+1), Healthy: true})
	}
	for i := range 10000 {
		ns := fmt.Sprintf("ns-%05d", i)
		x.Mailboxes = append(x.Mailboxes, ir.Mailbox{ID: ns + "@proxy-07", Namespace: ns, RunnerID: fmt.Sprintf("runner-%02d", i%20), Epoch: 1})
	}
	return x
}

// TestRouteTableFitsGRPCLimit: grpc-go's xDS client refuses a message over
// 4 MiB, and the admin makes an alias for every namespace with a live lease,
// so 10,000 mailboxes come with 10,000 aliases. The shared route table must
// stay under the limit there, or proxyless clients lose every route.
func TestRouteTableFitsGRPCLimit(t *testing.T) {
	t.Parallel()
	x := mesh10k()
	for _, m := range x.Mailboxes {
		x.Aliases = append(x.Aliases, ir.Alias{Namespace: m.Namespace, MailboxID: m.ID})
	}
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	const grpcMaxMessage = 4 << 20
	for _, rc := range res.Routes {
		if n := proto.Size(rc); n >= grpcMaxMessage {
			t.Fatalf("route configuration %s is %d bytes at 10,000 mailboxes and aliases, over grpc-go's %d", rc.GetName(), n, grpcMaxMessage)
		} else {
			t.Logf("route configuration %s: %d bytes (%d per mailbox with its alias)", rc.GetName(), n, n/len(x.Mailboxes))
		}
	}
}

// BenchmarkTranslate10k is a translation from scratch.
func BenchmarkTranslate10k(b *testing.B) {
	x := mesh10k()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Translate(x); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTranslateLeaseChange10k is the updater's case: the previous state
// is remembered and one lease moved.
func BenchmarkTranslateLeaseChange10k(b *testing.B) {
	x := mesh10k()
	tr := New()
	if _, err := tr.Translate(x); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		x.Version++
		x.Mailboxes[i%len(x.Mailboxes)].Epoch = x.Version
		if _, err := tr.Translate(x); err != nil {
			b.Fatal(err)
		}
	}
}
