package server

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"
)

type stamps map[string]time.Time

func (s stamps) StampedAt(v string) (time.Time, bool) { t, ok := s[v]; return t, ok }

func TestCallbacksMeasurePushes(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_100, 0)
	c := newCallbacks(Config{
		Stamps:     stamps{"7": now.Add(-250 * time.Millisecond)},
		Registerer: prometheus.NewRegistry(),
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock:      clocktesting.NewFakePassiveClock(now),
	})
	ctx := context.Background()
	node := &corev3.Node{Id: "gw"}

	_ = c.OnStreamOpen(ctx, 1, "")
	_ = c.OnDeltaStreamOpen(ctx, 2, "")
	if got := testutil.ToFloat64(c.clients.WithLabelValues(sotw)); got != 1 {
		t.Fatalf("sotw clients = %v", got)
	}

	route := resource.RouteType
	// Initial responses carry no change: counted, but no latency sample.
	c.OnStreamResponse(ctx, 1, &discoveryv3.DiscoveryRequest{TypeUrl: route},
		&discoveryv3.DiscoveryResponse{TypeUrl: route, VersionInfo: "7", Nonce: "a"})
	c.OnStreamDeltaResponse(2, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: route},
		&discoveryv3.DeltaDiscoveryResponse{TypeUrl: route, SystemVersionInfo: "7", Nonce: "b"})
	// Changes: a SotW client that had version 6, the delta stream's second.
	c.OnStreamResponse(ctx, 1, &discoveryv3.DiscoveryRequest{TypeUrl: route, VersionInfo: "6"},
		&discoveryv3.DiscoveryResponse{TypeUrl: route, VersionInfo: "7", Nonce: "c"})
	c.OnStreamDeltaResponse(2, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: route},
		&discoveryv3.DeltaDiscoveryResponse{TypeUrl: route, SystemVersionInfo: "7", Nonce: "d"})

	for _, p := range []string{sotw, delta} {
		if got := testutil.ToFloat64(c.pushes.WithLabelValues("RouteConfiguration", p)); got != 2 {
			t.Errorf("%s pushes = %v, want 2", p, got)
		}
		if got := testutil.ToFloat64(c.bytes.WithLabelValues("RouteConfiguration", p)); got <= 0 {
			t.Errorf("%s push bytes = %v", p, got)
		}
	}
	for _, p := range []string{sotw, delta} {
		var m dto.Metric
		if err := c.latency.WithLabelValues("RouteConfiguration", p).(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		// One sample, for the change, of the 250 ms since the state was stamped.
		if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 0.25 {
			t.Errorf("%s latency: %d samples summing %v s, want 1 of 0.25 s", p, h.GetSampleCount(), h.GetSampleSum())
		}
	}

	c.OnStreamClosed(1, node)
	c.OnDeltaStreamClosed(2, node)
	if got := testutil.ToFloat64(c.clients.WithLabelValues(delta)); got != 0 {
		t.Fatalf("delta clients after close = %v", got)
	}
	if len(c.sent) != 0 {
		t.Fatalf("closed delta stream still tracked: %v", c.sent)
	}
}

func TestCallbacksRefuseClientsAheadOfThisNode(t *testing.T) {
	t.Parallel()
	c := newCallbacks(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c.served = func() string { return "40" }
	tests := []struct {
		has  string
		want codes.Code
	}{
		{"", codes.OK},     // a new client
		{"12", codes.OK},   // behind: it gets this node's newer state
		{"40", codes.OK},   // the same state
		{"40.2", codes.OK}, // same IR version, later relabel on another node
		{"41", codes.Unavailable},
		{"not-a-version", codes.OK},
	}
	for _, tt := range tests {
		err := c.OnStreamRequest(1, &discoveryv3.DiscoveryRequest{TypeUrl: resource.RouteType, VersionInfo: tt.has})
		if got := status.Code(err); got != tt.want {
			t.Errorf("client at %q: %v, want %v", tt.has, err, tt.want)
		}
	}
	if got := testutil.ToFloat64(c.refused); got != 1 {
		t.Errorf("refused streams = %v, want 1", got)
	}
}
