package xdsgrpc

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// sent is what one response carried: its type (short name), the resources
// it (re)sent and the ones it removed.
type sent struct {
	typ     string
	names   []string
	removed []string
}

// each is one line per resource sent ("Type[name]") or removed ("Type
// removed[name]"): how a change's resources are split into responses is
// the cache's business.
func (s sent) each() []string {
	var out []string
	for _, n := range s.names {
		out = append(out, s.typ+"["+n+"]")
	}
	for _, n := range s.removed {
		out = append(out, s.typ+" removed["+n+"]")
	}
	return out
}

func short(url string) string { return url[strings.LastIndexByte(url, '.')+1:] }

// collectDelta reads responses until the marker's endpoints at version and
// every response in want have arrived, and returns everything read. A stray
// response arriving later shows up in the next collection.
func collectDelta(t *testing.T, c *xdstest.DeltaClient, version string, want []string) []string {
	t.Helper()
	var out []string
	markerSeen := false
	for !markerSeen || !subset(want, out) {
		resp, err := c.Next()
		if err != nil {
			t.Fatalf("delta stream: %v (after %v)", err, out)
		}
		s := sent{typ: short(resp.GetTypeUrl()), removed: resp.GetRemovedResources()}
		for _, r := range resp.GetResources() {
			s.names = append(s.names, r.GetName())
		}
		out = append(out, s.each()...)
		if resp.GetTypeUrl() == resource.EndpointType && resp.GetSystemVersionInfo() == version {
			markerSeen = true
		}
	}
	return out
}

func subset(want, got []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

func TestDeltaSendsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const proxies = 10
	x := xdstest.Mesh(1, proxies, cp.Addr)
	cp.Update(x)
	dc, err := xdstest.DialDelta(ctx, cp.Addr, "delta-client")
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	// A grpc-go client's clusters: per proxy and for the admin nodes an
	// EDS cluster and the aggregate over it that RLS answers name. Its one
	// listener is the API listener and its one table what that names: the
	// gateway's are Envoy's alone.
	const clusters = 2 * (proxies + 1)
	counts := map[string]int{}
	for counts["Cluster"] < clusters || counts["ClusterLoadAssignment"] < proxies+1 || counts["Listener"] < 1 || counts["RouteConfiguration"] < 1 {
		resp, err := dc.Next()
		if err != nil {
			t.Fatal(err)
		}
		counts[short(resp.GetTypeUrl())] += len(resp.GetResources())
	}
	if counts["Cluster"] != clusters || counts["ClusterLoadAssignment"] != proxies+1 || counts["RouteConfiguration"] != 1 || counts["Listener"] != 1 {
		t.Fatalf("initial delta responses carried %v, want every resource once", counts)
	}

	// Each step changes the state and then, as a marker, moves proxy-09's
	// runner; everything read up to the marker's endpoints is what the
	// step sent. Lease changes are not among them: they are not in the
	// routing state at all.
	eds := func(p string) string { return "ClusterLoadAssignment[" + translator.ClusterName(p) + "]" }
	marker := []string{eds(xdstest.ProxyID(9))}
	newProxy := ir.Proxy{ID: "proxy-new", Address: "127.0.0.1:29999", Healthy: true}
	tables := []string{"RouteConfiguration[" + translator.RouteConfigName + "]"}
	steps := []struct {
		name   string
		change func(*ir.IR, uint64) *ir.IR
		want   []string
	}{
		{
			name:   "a runner restarts on a new address",
			change: func(x *ir.IR, v uint64) *ir.IR { return xdstest.MoveRunner(x, v, 3, "127.0.0.1:29003") },
			want:   []string{eds(xdstest.ProxyID(3))},
		},
		{
			name: "a proxy registers",
			change: func(x *ir.IR, v uint64) *ir.IR {
				y := xdstest.MoveRunner(x, v, 0, x.Proxies[0].Address)
				y.Proxies = append(y.Proxies, newProxy)
				return y
			},
			want: append([]string{
				"Cluster[" + translator.ClusterName(newProxy.ID) + "]",
				"Cluster[" + ir.LookupCluster(translator.ClusterName(newProxy.ID)) + "]",
				eds(newProxy.ID),
			}, tables...),
		},
		{
			name: "the proxy goes stale",
			change: func(x *ir.IR, v uint64) *ir.IR {
				y := xdstest.MoveRunner(x, v, 0, x.Proxies[0].Address)
				y.Proxies[len(y.Proxies)-1].Healthy = false
				return y
			},
			want: []string{eds(newProxy.ID)},
		},
		{
			name: "the proxy is removed",
			change: func(x *ir.IR, v uint64) *ir.IR {
				y := xdstest.MoveRunner(x, v, 0, x.Proxies[0].Address)
				y.Proxies = y.Proxies[:len(y.Proxies)-1]
				return y
			},
			want: append([]string{
				"Cluster removed[" + translator.ClusterName(newProxy.ID) + "]",
				"Cluster removed[" + ir.LookupCluster(translator.ClusterName(newProxy.ID)) + "]",
				"ClusterLoadAssignment removed[" + translator.ClusterName(newProxy.ID) + "]",
			}, tables...),
		},
		{
			// Catches any stray response to the step before.
			name:   "another runner move",
			change: func(x *ir.IR, v uint64) *ir.IR { return xdstest.MoveRunner(x, v, 1, "127.0.0.1:29001") },
			want:   []string{eds(xdstest.ProxyID(1))},
		},
	}
	version := uint64(1)
	for _, step := range steps {
		version++
		x = step.change(x, version)
		cp.Update(x)
		version++
		x = xdstest.MoveRunner(x, version, 9, "127.0.0.1:"+itoa(30000+version))
		cp.Update(x)
		// The change and the marker may or may not be coalesced into one
		// snapshot; either way only the changed resources may appear.
		want := append(slices.Clone(step.want), marker...)
		got := collectDelta(t, dc, itoa(version), want)
		if !sameSet(got, want) {
			t.Fatalf("%s: delta responses = %v, want only %v", step.name, got, want)
		}
	}

	if n := metric(t, cp.Registry, "prism_xds_connected_clients", map[string]string{"protocol": "delta"}); n != 1 {
		t.Errorf("connected delta clients = %v, want 1", n)
	}
	if n := metric(t, cp.Registry, "prism_xds_pushes_total", map[string]string{"protocol": "delta", "type": "ClusterLoadAssignment"}); n < 5 {
		t.Errorf("delta endpoint pushes = %v, want at least 5", n)
	}
	if n := metric(t, cp.Registry, "prism_xds_push_bytes_total", map[string]string{"protocol": "delta", "type": "Cluster"}); n <= 0 {
		t.Errorf("delta cluster push bytes = %v, want > 0", n)
	}
}

// TestSotWSendsOnlyChangedTypes pins the per-type versions: a runner moving
// sends a state-of-the-world client endpoints, not clusters or route tables.
func TestSotWSendsOnlyChangedTypes(t *testing.T) {
	t.Parallel()
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x := xdstest.Mesh(1, 10, cp.Addr)
	cp.Update(x)
	sc, err := xdstest.DialSotW(ctx, cp.Addr, "sotw-client")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	// Every resource once: routes and endpoints may come one per response.
	seen := map[string]int{}
	for seen["Cluster"] < 11 || seen["ClusterLoadAssignment"] < 11 || seen["Listener"] < 1 || seen["RouteConfiguration"] < 1 {
		resp, err := sc.Next()
		if err != nil {
			t.Fatal(err)
		}
		seen[short(resp.GetTypeUrl())] += len(resp.GetResources())
	}
	pushes := func(typ string) float64 {
		return metric(t, cp.Registry, "prism_xds_pushes_total", map[string]string{"protocol": "sotw", "type": typ})
	}
	clusters, routes := pushes("Cluster"), pushes("RouteConfiguration")
	cp.Update(xdstest.MoveRunner(x, 2, 3, "127.0.0.1:29003"))
	resp, err := sc.Next()
	if err != nil {
		t.Fatal(err)
	}
	if short(resp.GetTypeUrl()) != "ClusterLoadAssignment" || resp.GetVersionInfo() != "2" {
		t.Fatalf("first response after a runner move: %s version %s, want ClusterLoadAssignment version 2",
			short(resp.GetTypeUrl()), resp.GetVersionInfo())
	}
	if c, r := pushes("Cluster"), pushes("RouteConfiguration"); c != clusters || r != routes {
		t.Errorf("a runner move pushed %v clusters and %v route tables, want none", c-clusters, r-routes)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

func dedupe(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func sameSet(a, b []string) bool { return slices.Equal(dedupe(a), dedupe(b)) }

// metric returns a counter or gauge value, or a histogram's sample count.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
