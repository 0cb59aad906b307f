package cache

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/translator"
)

// TestSetVersionsEachTypeByItsLastChange pins what SotW clients rely on:
// an unchanged type keeps its version, a changed one gets a new one, even
// when the caller repeats an IR version.
func TestSetVersionsEachTypeByItsLastChange(t *testing.T) {
	t.Parallel()
	c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	set := func(version uint64, epoch uint64, healthy bool) map[string]string {
		t.Helper()
		x := state(version, epoch)
		x.Runners[0].Healthy = healthy
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
	steps := []struct {
		name            string
		version, epoch  uint64
		healthy         bool
		routes, eps, ls string
	}{
		{"first", 3, 1, true, "3", "3", "3"},
		{"lease change", 5, 5, true, "5", "3", "3"},
		{"runner unhealthy, same IR version", 5, 5, false, "5", "5.1", "3"},
		{"healthy again, same IR version", 5, 5, true, "5", "5.2", "3"},
		{"next version", 8, 8, true, "8", "5.2", "3"},
	}
	for _, s := range steps {
		got := set(s.version, s.epoch, s.healthy)
		if got["routes"] != s.routes || got["endpoints"] != s.eps || got["listeners"] != s.ls {
			t.Fatalf("%s: versions %v, want routes %s, endpoints %s, listeners %s", s.name, got, s.routes, s.eps, s.ls)
		}
		if c.Version() != strconv.FormatUint(s.version, 10) {
			t.Fatalf("%s: Version() = %s", s.name, c.Version())
		}
	}
}
