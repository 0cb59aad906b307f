package cache

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// TestSetVersionsEachTypeByItsLastChange pins what SotW clients rely on:
// an unchanged type keeps its version, a changed one gets a new one, even
// when the caller repeats an IR version.
func TestSetVersionsEachTypeByItsLastChange(t *testing.T) {
	t.Parallel()
	c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	set := func(version uint64, change func(*ir.IR)) map[string]string {
		t.Helper()
		x := state(version, 1)
		change(x)
		res, err := translator.Translate(x)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(context.Background(), version, res); err != nil {
			t.Fatal(err)
		}
		snap, err := c.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{
			"routes":    snap.GetVersion(resource.RouteType),
			"endpoints": snap.GetVersion(resource.EndpointType),
			"listeners": snap.GetVersion(resource.ListenerType),
		}
	}
	moved := func(x *ir.IR) { x.Proxies[0].Address = "127.0.0.1:9005" }
	steps := []struct {
		name            string
		version         uint64
		change          func(*ir.IR)
		routes, eps, ls string
	}{
		{"first", 3, func(*ir.IR) {}, "3", "3", "3"},
		{"runner moves", 5, moved, "3", "5", "3"},
		{"proxy unhealthy, same IR version", 5, func(x *ir.IR) { moved(x); x.Proxies[0].Healthy = false }, "3", "5.1", "3"},
		{"healthy again, same IR version", 5, moved, "3", "5.2", "3"},
		{"lookup target set", 8, func(x *ir.IR) { moved(x); x.Lookup = "dns:///127.0.0.1:9090" }, "8", "5.2", "3"},
	}
	for _, s := range steps {
		got := set(s.version, s.change)
		if got["routes"] != s.routes || got["endpoints"] != s.eps || got["listeners"] != s.ls {
			t.Fatalf("%s: versions %v, want routes %s, endpoints %s, listeners %s", s.name, got, s.routes, s.eps, s.ls)
		}
		if c.Version() != strconv.FormatUint(s.version, 10) {
			t.Fatalf("%s: Version() = %s", s.name, c.Version())
		}
	}
}

// formatted counts how often it is formatted.
type formatted struct{ n *int }

func (f formatted) String() string { *f.n++; return "x" }

// TestLoggerFormatsOnlyWhatTheHandlerKeeps: go-control-plane logs every
// watch with its resource names (1,000 on each ACK of a grpc-go client at
// 1,000 proxies); formatting lines the handler drops was a large share of
// a runner move's CPU.
func TestLoggerFormatsOnlyWhatTheHandlerKeeps(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	l := logger{slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	var n int
	l.Debugf("watch %v", formatted{&n})
	linearLogger{l}.Infof("watch %v", formatted{&n})
	if n != 0 || out.Len() != 0 {
		t.Fatalf("debug lines formatted %d times, wrote %q", n, out.String())
	}
	l.Warnf("refused %v", formatted{&n})
	if n != 1 || !strings.Contains(out.String(), "refused x") {
		t.Fatalf("warning formatted %d times, wrote %q", n, out.String())
	}
}

// TestRunnerMoveLeavesSnapshotCache: the snapshot cache serves listeners and
// clusters alone, so it holds nothing else and a runner move, which changes
// neither, does not set it again (each SetSnapshot hashes every resource it
// holds for delta clients); Snapshot still shows the moved endpoints.
func TestRunnerMoveLeavesSnapshotCache(t *testing.T) {
	t.Parallel()
	c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	set := func(version, port uint64) {
		t.Helper()
		res, err := translator.Translate(state(version, port))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(context.Background(), version, res); err != nil {
			t.Fatal(err)
		}
	}
	set(1, 1)
	before, err := c.snapshots.GetSnapshot(NodeKey)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(before.GetResources(resource.EndpointType)) + len(before.GetResources(resource.RouteType)); n != 0 {
		t.Fatalf("snapshot cache holds %d routes and endpoints it does not serve", n)
	}
	set(2, 2)
	after, err := c.snapshots.GetSnapshot(NodeKey)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatal("a runner move set the snapshot cache again")
	}
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := snap.GetVersion(resource.EndpointType); v != "2" {
		t.Fatalf("endpoints at %q after the move, want 2", v)
	}
	if v := snap.GetVersion(resource.ClusterType); v != "1" {
		t.Fatalf("clusters at %q after the move, want 1", v)
	}
}
