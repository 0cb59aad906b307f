// Package server serves the xds/cache snapshot over ADS, state-of-the-world
// and delta on the same gRPC service, and measures what it sends.
package server

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/xds/cache"
)

// Stamps tells when the state behind a snapshot version was handed to the
// updater; *cache.Updater implements it.
type Stamps interface {
	StampedAt(version string) (time.Time, bool)
}

// Config configures New.
type Config struct {
	// Cache is what is served.
	Cache *cache.Cache
	// Stamps, when set, enables the push latency histogram.
	Stamps Stamps
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Clock times the push latency (default the real clock).
	Clock clock.PassiveClock
}

// Server is the xDS management server of one admin node.
type Server struct {
	xds serverv3.Server
	cb  *callbacks
}

// New returns a server for cfg.Cache; it stops serving streams when ctx ends.
func New(ctx context.Context, cfg Config) *Server {
	cb := newCallbacks(cfg)
	return &Server{xds: serverv3.NewServer(ctx, cfg.Cache.Watcher(), cb), cb: cb}
}

// Register adds the Aggregated Discovery Service (both protocols) to g.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
}

const (
	sotw  = "sotw"
	delta = "delta"
)

type callbacks struct {
	stamps Stamps
	served func() string
	clock  clock.PassiveClock
	log    *slog.Logger

	mu sync.Mutex
	// sent records, per delta stream, the types it has had a response for,
	// so the first (initial) response is not counted as a change's latency.
	sent map[int64]map[string]bool

	clients *prometheus.GaugeVec
	refused prometheus.Counter
	pushes  *prometheus.CounterVec
	bytes   *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

func newCallbacks(cfg Config) *callbacks {
	c := &callbacks{
		stamps: cfg.Stamps,
		clock:  cfg.Clock,
		log:    cfg.Log,
		sent:   map[int64]map[string]bool{},
		clients: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prism_xds_connected_clients", Help: "Open ADS streams, by protocol (sotw, delta).",
		}, []string{"protocol"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_xds_refused_streams_total", Help: "ADS streams refused because the client held a newer version than this node serves.",
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_xds_pushes_total", Help: "xDS responses sent, by resource type and protocol.",
		}, []string{"type", "protocol"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_xds_push_bytes_total", Help: "Bytes of xDS responses sent, by resource type and protocol.",
		}, []string{"type", "protocol"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prism_xds_push_latency_seconds",
			Help:    "From the routing state change reaching the updater to its resources being sent, by type and protocol.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"type", "protocol"}),
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if cfg.Cache != nil {
		c.served = cfg.Cache.Version
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(c.clients, c.refused, c.pushes, c.bytes, c.latency)
	}
	return c
}

// typeName shortens a type URL to its last element, e.g. "RouteConfiguration".
func typeName(url string) string { return url[strings.LastIndexByte(url, '.')+1:] }

func (c *callbacks) observe(protocol, typeURL, version string, size int, change bool) {
	t := typeName(typeURL)
	c.pushes.WithLabelValues(t, protocol).Inc()
	c.bytes.WithLabelValues(t, protocol).Add(float64(size))
	if !change || c.stamps == nil {
		return
	}
	if at, ok := c.stamps.StampedAt(version); ok {
		c.latency.WithLabelValues(t, protocol).Observe(c.clock.Since(at).Seconds())
	}
}

func (c *callbacks) OnStreamOpen(context.Context, int64, string) error {
	c.clients.WithLabelValues(sotw).Inc()
	return nil
}

func (c *callbacks) OnStreamClosed(id int64, node *corev3.Node) {
	c.clients.WithLabelValues(sotw).Dec()
	c.log.Debug("xds stream closed", "stream", id, "node", node.GetId())
}

// OnStreamRequest refuses a client that holds a newer version than this node
// serves: versions are Raft indexes, so this node is behind (restarted and
// still replaying its log, or cut off) and answering would roll the client's
// routes back. The stream fails UNAVAILABLE; the client keeps what it has
// and reconnects, here once caught up or to another admin node.
func (c *callbacks) OnStreamRequest(_ int64, req *discoveryv3.DiscoveryRequest) error {
	has, ok := irVersion(req.GetVersionInfo())
	if !ok || c.served == nil {
		return nil
	}
	if served, _ := irVersion(c.served()); has > served {
		c.refused.Inc()
		return status.Errorf(codes.Unavailable, "admin node serves xDS version %d, behind the client's %d; retry", served, has)
	}
	return nil
}

// irVersion is the Raft index a version string starts with ("12" or "12.1").
func irVersion(v string) (uint64, bool) {
	if i := strings.IndexByte(v, '.'); i >= 0 {
		v = v[:i]
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}

// OnStreamResponse counts a state-of-the-world response. A request that
// carries a version is from a client that already had resources, so the
// response is a change reaching it.
func (c *callbacks) OnStreamResponse(_ context.Context, _ int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
	c.observe(sotw, resp.GetTypeUrl(), resp.GetVersionInfo(), proto.Size(resp), req.GetVersionInfo() != "")
}

func (c *callbacks) OnDeltaStreamOpen(context.Context, int64, string) error {
	c.clients.WithLabelValues(delta).Inc()
	return nil
}

func (c *callbacks) OnDeltaStreamClosed(id int64, node *corev3.Node) {
	c.clients.WithLabelValues(delta).Dec()
	c.mu.Lock()
	delete(c.sent, id)
	c.mu.Unlock()
	c.log.Debug("xds delta stream closed", "stream", id, "node", node.GetId())
}

func (c *callbacks) OnStreamDeltaRequest(int64, *discoveryv3.DeltaDiscoveryRequest) error { return nil }

func (c *callbacks) OnStreamDeltaResponse(id int64, _ *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
	c.mu.Lock()
	types := c.sent[id]
	if types == nil {
		types = map[string]bool{}
		c.sent[id] = types
	}
	change := types[resp.GetTypeUrl()]
	types[resp.GetTypeUrl()] = true
	c.mu.Unlock()
	c.observe(delta, resp.GetTypeUrl(), resp.GetSystemVersionInfo(), proto.Size(resp), change)
}

func (c *callbacks) OnFetchRequest(context.Context, *discoveryv3.DiscoveryRequest) error { return nil }

func (c *callbacks) OnFetchResponse(*discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse) {}
