package cache

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// state is one proxy whose runner listens on port 9000+n: states of
// different n differ in the proxy's endpoint alone.
func state(version uint64, n uint64) *ir.IR {
	return &ir.IR{
		Version: version,
		Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
		Proxies: []ir.Proxy{{ID: "proxy-01", RunnerID: "runner-01", Address: fmt.Sprintf("127.0.0.1:%d", 9000+n), Healthy: true}},
	}
}

type harness struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	cache *Cache
	u     *Updater
	reg   *prometheus.Registry
}

func start(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, clock: clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)), cache: New(slog.New(slog.NewTextHandler(io.Discard, nil))), reg: prometheus.NewRegistry()}
	h.u = NewUpdater(h.cache, UpdaterConfig{Debounce: 10 * time.Millisecond, MaxDelay: 25 * time.Millisecond,
		Clock: h.clock, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: h.reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.u.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// update hands x over and waits until Run has armed its timer for it.
func (h *harness) update(x *ir.IR) {
	h.t.Helper()
	before := h.clock.Waiters()
	h.u.Update(x)
	h.eventually(func() bool { return h.clock.Waiters() > before }, "timer armed")
}

func (h *harness) eventually(cond func() bool, what string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) translations(result string) float64 {
	return testutil.ToFloat64(h.u.translations.WithLabelValues(result))
}

func TestUpdaterCoalescesBurst(t *testing.T) {
	t.Parallel()
	h := start(t)
	for v := uint64(1); v <= 5; v++ {
		h.u.Update(state(v, v))
	}
	// Run may still be re-arming for the later wake-ups, so time moves in
	// small steps until the push; every update is in before any step.
	h.eventually(func() bool {
		h.clock.Step(time.Millisecond)
		return h.cache.Version() == "5"
	}, "version 5 served")
	h.eventually(func() bool { return h.translations("ok") == 1 }, "translation counted")
	if got := testutil.ToFloat64(h.u.coalesced); got != 4 {
		t.Fatalf("coalesced = %v, want 4", got)
	}
	if at, ok := h.u.StampedAt("5"); !ok || !at.Equal(time.Unix(1_700_000_000, 0)) {
		t.Fatalf("StampedAt(5) = %v %v, want the first update's time", at, ok)
	}
}

func TestUpdaterSkipsUnchangedState(t *testing.T) {
	t.Parallel()
	h := start(t)
	h.update(state(1, 1))
	h.clock.Step(10 * time.Millisecond)
	h.eventually(func() bool { return h.cache.Version() == "1" }, "version 1 served")

	// A heartbeat advances the applied index but changes no route.
	h.update(state(2, 1))
	h.clock.Step(10 * time.Millisecond)
	h.eventually(func() bool { return h.translations("unchanged") == 1 }, "unchanged state skipped")
	if v := h.cache.Version(); v != "1" {
		t.Fatalf("served version = %s after an unchanged state, want 1", v)
	}

	h.update(state(3, 3))
	h.clock.Step(10 * time.Millisecond)
	h.eventually(func() bool { return h.cache.Version() == "3" }, "version 3 served")
}

func TestUpdaterMaxDelayBoundsSteadyStream(t *testing.T) {
	t.Parallel()
	h := start(t)
	// An update every 6 ms never lets the 10 ms debounce expire; the 25 ms
	// bound must push anyway.
	for i := range 4 {
		h.update(state(uint64(i+1), uint64(i+1)))
		if i < 3 {
			h.clock.Step(6 * time.Millisecond)
			if v := h.cache.Version(); v != "" {
				t.Fatalf("pushed version %s at %d ms, before the debounce or max delay", v, 6*(i+1))
			}
		}
	}
	h.clock.Step(7 * time.Millisecond)
	h.eventually(func() bool { return h.cache.Version() == "4" }, "push at max delay")
}

func TestUpdaterServesGoodPartOfInvalidState(t *testing.T) {
	t.Parallel()
	h := start(t)
	x := state(7, 7)
	x.Proxies = append(x.Proxies, ir.Proxy{ID: "bad@id", Address: "127.0.0.1:9100", Healthy: true})
	h.update(x)
	h.clock.Step(10 * time.Millisecond)
	h.eventually(func() bool { return h.cache.Version() == "7" && h.translations("error") == 1 }, "version 7 served")
	snap, err := h.cache.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := snap.GetResources(resource.RouteType)[translator.RouteConfigName].(*routev3.RouteConfiguration)
	if !ok {
		t.Fatal("no route configuration served")
	}
	// The good proxy keeps its header route next to the not-found route.
	routes := rc.GetVirtualHosts()[0].GetRoutes()
	if n := len(routes); n != 2 || routes[0].GetRoute().GetCluster() != translator.ClusterName("proxy-01") {
		t.Fatalf("routes = %d, first to %q, want 2, the first to the good proxy", n, routes[0].GetRoute().GetCluster())
	}
}

// Pinned bug: the admin's feed waited for the version string of its update
// to be served, and an update equal to the served state (a routes index that
// moved without a route change) never is, so the next real change waited
// out the feed's whole bound. Processed reports every outcome.
func TestProcessedReportsEveryOutcome(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		second *ir.IR
		result string
		want   float64
	}{
		{name: "served", second: state(2, 2), result: "ok", want: 2},
		{name: "unchanged", second: state(2, 1), result: "unchanged", want: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := start(t)
			before := h.clock.Waiters()
			first := h.u.Update(state(1, 1))
			h.eventually(func() bool { return h.clock.Waiters() > before }, "timer armed")
			h.clock.Step(10 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := h.u.Processed(ctx, first); err != nil {
				t.Fatalf("first update: %v", err)
			}
			before = h.clock.Waiters()
			gen := h.u.Update(tc.second)
			if gen != first+1 {
				t.Fatalf("generation %d after %d", gen, first)
			}
			h.eventually(func() bool { return h.clock.Waiters() > before }, "timer armed")
			h.clock.Step(10 * time.Millisecond)
			if err := h.u.Processed(ctx, gen); err != nil {
				t.Fatalf("second update (%s): %v", tc.name, err)
			}
			if got := h.translations(tc.result); got != tc.want {
				t.Fatalf("%s translations = %v, want %v", tc.result, got, tc.want)
			}
		})
	}
}

func TestProcessedHonoursContext(t *testing.T) {
	t.Parallel()
	h := start(t)
	gen := h.u.Update(state(1, 1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.u.Processed(ctx, gen); err == nil {
		t.Fatal("Processed returned nil for an update never flushed and a cancelled context")
	}
}

// TestUpdaterPatchesRunnerMoves: a runner moving is served from the last
// state's resources with the proxy's endpoints replaced (see patch), not
// translated again; a state the patch does not take (here a proxy joining)
// is translated whole.
func TestUpdaterPatchesRunnerMoves(t *testing.T) {
	t.Parallel()
	h := start(t)
	serve := func(x *ir.IR) *translator.Resources {
		t.Helper()
		before := h.clock.Waiters()
		gen := h.u.Update(x)
		h.eventually(func() bool { return h.clock.Waiters() > before }, "timer armed")
		h.clock.Step(10 * time.Millisecond)
		if err := h.u.Processed(context.Background(), gen); err != nil {
			t.Fatal(err)
		}
		// Processed orders this read after Run's write.
		return h.u.lastRes
	}
	first := serve(state(1, 1))
	moved := serve(state(2, 2))
	if moved.Routes[0] != first.Routes[0] || moved.Clusters[1] != first.Clusters[1] || moved.Listeners[0] != first.Listeners[0] {
		t.Fatal("a runner move translated resources it does not change")
	}
	if moved.Endpoints[1] == first.Endpoints[1] || h.cache.Version() != "2" {
		t.Fatalf("a runner move was not served (version %s)", h.cache.Version())
	}
	joined := state(3, 2)
	joined.Proxies = append(joined.Proxies, ir.Proxy{ID: "proxy-02", Address: "127.0.0.1:9100", Healthy: true})
	if got := serve(joined); got.Routes[0] == moved.Routes[0] || len(got.Clusters) != 3 {
		t.Fatalf("a proxy joining was not translated whole: %d clusters", len(got.Clusters))
	}
}
