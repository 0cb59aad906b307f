package cache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// resourcesDiff names the first list in which two translations differ, "" when they do not.
func resourcesDiff(a, b *translator.Resources) string {
	lists := func(r *translator.Resources) map[string][]proto.Message {
		out := map[string][]proto.Message{}
		for _, l := range r.Listeners {
			out["listeners"] = append(out["listeners"], l)
		}
		for _, x := range r.Routes {
			out["routes"] = append(out["routes"], x)
		}
		for _, c := range r.Clusters {
			out["clusters"] = append(out["clusters"], c)
		}
		for _, e := range r.Endpoints {
			out["endpoints"] = append(out["endpoints"], e)
		}
		for _, c := range r.EnvoyClusters {
			out["envoy clusters"] = append(out["envoy clusters"], c)
		}
		if r.EnvoyClusters != nil {
			out["envoy clusters"] = append(out["envoy clusters"], nil)
		}
		return out
	}
	la, lb := lists(a), lists(b)
	for _, k := range []string{"listeners", "routes", "clusters", "endpoints", "envoy clusters"} {
		if !slices.EqualFunc(la[k], lb[k], proto.Equal) {
			return k
		}
	}
	return ""
}

// TestPatchIsTranslate holds the updater's shortcut to the translator: for
// every change a patch accepts, it builds exactly what Translate builds,
// sharing every resource but the changed proxies' endpoints with the
// state before; runner moves, restarts and staleness are always patched,
// and every other change (or a change to an invalid address) is not.
func TestPatchIsTranslate(t *testing.T) {
	t.Parallel()
	const n = 12
	variants := map[string]ir.Gateway{
		"plaintext":    {Address: "127.0.0.1:8080"},
		"upstream tls": {Address: "127.0.0.1:8080", UpstreamTLS: ir.UpstreamTLS{TrustDomain: "prism.local"}},
		"query auth": {Address: "127.0.0.1:8080", UpstreamTLS: ir.UpstreamTLS{TrustDomain: "prism.local"},
			QueryAuth: ir.QueryAuth{Issuer: "https://idp.example", Audience: "prism", JWKSURL: "https://idp.example/jwks.json"}},
	}
	type change struct {
		name  string
		patch bool // whether a patch must take it
		apply func(x *ir.IR, r *rand.Rand)
	}
	pick := func(x *ir.IR, r *rand.Rand) *ir.Proxy { return &x.Proxies[r.IntN(len(x.Proxies))] }
	changes := []change{
		{"runner moves", true, func(x *ir.IR, r *rand.Rand) {
			pick(x, r).Address = fmt.Sprintf("10.0.%d.%d:8982", r.IntN(200), r.IntN(200))
		}},
		{"runner restarts", true, func(x *ir.IR, r *rand.Rand) {
			p := pick(x, r)
			p.RunnerID = fmt.Sprintf("runner-%d", r.IntN(1000))
			p.Address = fmt.Sprintf("10.1.%d.%d:8982", r.IntN(200), r.IntN(200))
		}},
		{"proxy stale or back", true, func(x *ir.IR, r *rand.Rand) { p := pick(x, r); p.Healthy = !p.Healthy }},
		{"three runners move", true, func(x *ir.IR, r *rand.Rand) {
			for range 3 {
				pick(x, r).Address = fmt.Sprintf("10.2.%d.%d:8982", r.IntN(200), r.IntN(200))
			}
		}},
		{"invalid address", false, func(x *ir.IR, r *rand.Rand) { pick(x, r).Address = "nowhere" }},
		{"proxy joins", false, func(x *ir.IR, r *rand.Rand) {
			x.Proxies = append(x.Proxies, ir.Proxy{ID: fmt.Sprintf("proxy-j%d", r.IntN(1_000_000)), Address: "10.3.0.1:8982", Healthy: true})
		}},
		{"proxy leaves", false, func(x *ir.IR, r *rand.Rand) {
			i := r.IntN(len(x.Proxies))
			x.Proxies = slices.Delete(x.Proxies, i, i+1)
		}},
		{"proxy renamed", false, func(x *ir.IR, r *rand.Rand) { pick(x, r).ID = fmt.Sprintf("proxy-r%d", r.IntN(1_000_000)) }},
		{"admins change", false, func(x *ir.IR, r *rand.Rand) { x.Admins = []string{fmt.Sprintf("10.9.0.%d:9000", r.IntN(200))} }},
		{"lookup changes", false, func(x *ir.IR, r *rand.Rand) { x.Lookup = fmt.Sprintf("dns:///10.9.1.%d:9000", r.IntN(200)) }},
	}
	for name, gw := range variants {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(1, uint64(len(name))))
			last := &ir.IR{Version: 1, Gateway: gw, Admins: []string{"10.9.0.1:9000"}, Lookup: "dns:///10.9.0.1:9000"}
			for i := range n {
				last.Proxies = append(last.Proxies, ir.Proxy{ID: fmt.Sprintf("proxy-%02d", i), RunnerID: fmt.Sprintf("runner-%02d", i), Address: fmt.Sprintf("10.0.0.%d:8982", i+1), Healthy: true})
			}
			lastRes, err := translator.Translate(last)
			if err != nil {
				t.Fatal(err)
			}
			for step := range 200 {
				c := changes[r.IntN(len(changes))]
				next := &ir.IR{Version: last.Version + 1, Gateway: last.Gateway, Admins: slices.Clone(last.Admins), Lookup: last.Lookup, Proxies: slices.Clone(last.Proxies)}
				c.apply(next, r)
				want, wantErr := translator.Translate(next)
				got, ok := patch(last, lastRes, next)
				if ok != (c.patch && !next.Equal(last)) {
					t.Fatalf("step %d, %s: patched %v", step, c.name, ok)
				}
				if ok {
					if wantErr != nil {
						t.Fatalf("step %d, %s: patched a state Translate refuses: %v", step, c.name, wantErr)
					}
					if d := resourcesDiff(got, want); d != "" {
						t.Fatalf("step %d, %s: patched %s differ from Translate's", step, c.name, d)
					}
					if got.Routes[0] != lastRes.Routes[0] || got.Clusters[1] != lastRes.Clusters[1] || got.Listeners[0] != lastRes.Listeners[0] {
						t.Fatalf("step %d, %s: unchanged resources not shared with the last state", step, c.name)
					}
				}
				if wantErr != nil {
					// Invalid states are not built on; go back to a good one.
					continue
				}
				last, lastRes = next, want
				if ok {
					lastRes = got
				}
			}
		})
	}
}
