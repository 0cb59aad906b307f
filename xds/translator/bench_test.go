package translator

import (
	"fmt"
	"testing"

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
