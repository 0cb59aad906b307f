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

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
	"github.com/prism-mesh/prism/xds/xdstest"
)

// sent is what one response carried: its type (short name), the resources
// it (re)sent and the ones it removed.
type sent struct {
	typ     string
	names   []string
	removed []string
}

func (s sent) String() string {
	return s.typ + "[" + strings.Join(s.names, ",") + "] removed[" + strings.Join(s.removed, ",") + "]"
}

func short(url string) string { return url[strings.LastIndexByte(url, '.')+1:] }

// collectDelta reads responses until the route configuration at version and
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
		out = append(out, s.String())
		if resp.GetTypeUrl() == resource.RouteType && resp.GetSystemVersionInfo() == version {
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

	const runners, mailboxes = 10, 1000
	x := xdstest.Mesh(1, runners, mailboxes, cp.Addr)
	cp.Update(x)
	dc, err := xdstest.DialDelta(ctx, cp.Addr, "delta-client")
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	counts := map[string]int{}
	for len(counts) < len(xdstest.Types) {
		resp, err := dc.Next()
		if err != nil {
			t.Fatal(err)
		}
		counts[short(resp.GetTypeUrl())] += len(resp.GetResources())
	}
	if counts["Cluster"] != runners+1 || counts["ClusterLoadAssignment"] != runners+1 || counts["RouteConfiguration"] != 1 || counts["Listener"] != 2 {
		t.Fatalf("initial delta responses carried %v, want every resource once", counts)
	}

	// Each step changes one lease and then, as a marker, one more lease
	// between existing runners; everything read up to the marker's route
	// configuration is what the step sent.
	routeOnly := []string{"RouteConfiguration[mailbox-routes] removed[]"}
	newRunner := ir.Runner{ID: "runner-new", Address: "127.0.0.1:29999", Healthy: true}
	steps := []struct {
		name   string
		change func(*ir.IR, uint64) *ir.IR
		want   []string
	}{
		{
			name:   "lease moves between existing runners",
			change: func(x *ir.IR, v uint64) *ir.IR { return xdstest.MoveLease(x, v, 500, xdstest.RunnerID(3)) },
			want:   routeOnly,
		},
		{
			name: "lease moves to a newly registered runner",
			change: func(x *ir.IR, v uint64) *ir.IR {
				y := xdstest.MoveLease(x, v, 502, newRunner.ID)
				y.Runners = append(y.Runners, newRunner)
				return y
			},
			want: []string{
				"Cluster[" + translator.ClusterName(newRunner.ID) + "] removed[]",
				"ClusterLoadAssignment[" + translator.ClusterName(newRunner.ID) + "] removed[]",
				"RouteConfiguration[mailbox-routes] removed[]",
			},
		},
		{
			name: "runner goes unhealthy",
			change: func(x *ir.IR, v uint64) *ir.IR {
				y := xdstest.MoveLease(x, v, 0, x.Mailboxes[0].RunnerID)
				y.Mailboxes[0].Epoch = x.Mailboxes[0].Epoch
				i := slices.IndexFunc(y.Runners, func(r ir.Runner) bool { return r.ID == newRunner.ID })
				y.Runners[i].Healthy = false
				return y
			},
			want: []string{"ClusterLoadAssignment[" + translator.ClusterName(newRunner.ID) + "] removed[]"},
		},
		{
			name: "lease released and runner deregistered",
			change: func(x *ir.IR, v uint64) *ir.IR {
				y := xdstest.MoveLease(x, v, 0, x.Mailboxes[0].RunnerID)
				y.Mailboxes[0].Epoch = x.Mailboxes[0].Epoch
				y.Mailboxes = slices.Delete(y.Mailboxes, 502, 503)
				y.Runners = slices.DeleteFunc(y.Runners, func(r ir.Runner) bool { return r.ID == newRunner.ID })
				return y
			},
			want: []string{
				"Cluster[] removed[" + translator.ClusterName(newRunner.ID) + "]",
				"ClusterLoadAssignment[] removed[" + translator.ClusterName(newRunner.ID) + "]",
				"RouteConfiguration[mailbox-routes] removed[]",
			},
		},
		{
			// Catches any stray response to the step before.
			name:   "another lease move",
			change: func(x *ir.IR, v uint64) *ir.IR { return xdstest.MoveLease(x, v, 900, xdstest.RunnerID(1)) },
			want:   routeOnly,
		},
	}
	version := uint64(1)
	marker := 700
	for _, step := range steps {
		version++
		x = step.change(x, version)
		cp.Update(x)
		version++
		marker++
		x = xdstest.MoveLease(x, version, marker, xdstest.RunnerID(9))
		cp.Update(x)
		// The change and the marker may or may not be coalesced into one
		// snapshot; either way only the changed resources may appear.
		want := append(slices.Clone(step.want), routeOnly...)
		got := collectDelta(t, dc, itoa(version), want)
		if !sameSet(got, want) {
			t.Fatalf("%s: delta responses = %v, want only %v", step.name, got, want)
		}
	}

	if n := metric(t, cp.Registry, "prism_xds_connected_clients", map[string]string{"protocol": "delta"}); n != 1 {
		t.Errorf("connected delta clients = %v, want 1", n)
	}
	if n := metric(t, cp.Registry, "prism_xds_pushes_total", map[string]string{"protocol": "delta", "type": "RouteConfiguration"}); n < 5 {
		t.Errorf("delta route pushes = %v, want at least 5", n)
	}
	if n := metric(t, cp.Registry, "prism_xds_push_bytes_total", map[string]string{"protocol": "delta", "type": "Cluster"}); n <= 0 {
		t.Errorf("delta cluster push bytes = %v, want > 0", n)
	}
}

// TestSotWSendsOnlyChangedTypes pins the per-type versions: a lease move
// re-sends the route table to a state-of-the-world client, not every cluster
// and endpoint.
func TestSotWSendsOnlyChangedTypes(t *testing.T) {
	t.Parallel()
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x := xdstest.Mesh(1, 10, 1000, cp.Addr)
	cp.Update(x)
	sc, err := xdstest.DialSotW(ctx, cp.Addr, "sotw-client")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	seen := map[string]bool{}
	for len(seen) < 4 {
		resp, err := sc.Next()
		if err != nil {
			t.Fatal(err)
		}
		seen[short(resp.GetTypeUrl())] = true
	}
	cp.Update(xdstest.MoveLease(x, 2, 500, xdstest.RunnerID(3)))
	resp, err := sc.Next()
	if err != nil {
		t.Fatal(err)
	}
	if short(resp.GetTypeUrl()) != "RouteConfiguration" || resp.GetVersionInfo() != "2" {
		t.Fatalf("first response after a lease move: %s version %s, want RouteConfiguration version 2",
			short(resp.GetTypeUrl()), resp.GetVersionInfo())
	}
	if n := metric(t, cp.Registry, "prism_xds_pushes_total", map[string]string{"protocol": "sotw", "type": "Cluster"}); n != 1 {
		t.Errorf("sotw cluster pushes = %v, want 1 (the initial one)", n)
	}
	if n := metric(t, cp.Registry, "prism_xds_push_latency_seconds", map[string]string{"protocol": "sotw", "type": "RouteConfiguration"}); n != 1 {
		t.Errorf("sotw route push latency samples = %v, want 1 (the change, not the initial response)", n)
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
