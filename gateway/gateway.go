// Package gateway is prism gateway: an HTTP/JSON and gRPC front door to the
// mailboxes for machines without Envoy. Every request becomes one
// prism.mailbox.v1.MailboxQuery call on a grpc-go xDS channel
// (xds:///mailbox-query) fed by the admin nodes, so grpc-go picks the runner
// from the mesh's routes; the gateway has no routing logic of its own. It
// names the mailbox in x-mailbox-id metadata, or the namespace in
// x-prism-namespace for the /v1/namespaces/{namespace}/ paths.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	grpcxds "google.golang.org/grpc/xds"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/mailbox/query/request"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"

	// The RLS cluster specifier plugin routes x-prism-namespace calls
	// (xds/lookup); without it grpc-go skips that route. Its control channel
	// dials the admin nodes with the fallback TLS below, which admits their
	// admin identities.
	_ "google.golang.org/grpc/balancer/rls"
)

// ProbeMailbox is the mailbox id the readiness probe asks for. It is not a
// valid mailbox id, so no route ever has it and the answer, NotFound, comes
// from the not-found cluster: proof that the listener, the routes and a
// cluster with its endpoints all arrived.
const ProbeMailbox = "prism-gateway-readiness-probe"

// Config of a Gateway; zero fields take defaults.
type Config struct {
	// Bootstrap is the grpc-go xDS bootstrap (see Bootstrap). Nil takes
	// grpc-go's own, from $GRPC_XDS_BOOTSTRAP or $GRPC_XDS_BOOTSTRAP_CONFIG.
	Bootstrap []byte
	// TLS is the gateway's identity; the bootstrap names the same files
	// (Bootstrap(admins, id, &files)). Connections to runners take the
	// TLS the control plane's clusters ask for (grpc-go's xDS credentials,
	// checking each runner's proxy identity); a cluster without it gets
	// mutual TLS with any proxy or admin identity of this trust bundle.
	// Nil is a plaintext mesh.
	TLS *pki.Source
	// Timeout bounds every upstream call; default 10s.
	Timeout time.Duration
	// ProbeInterval is how often Run probes until the routes arrive;
	// default 250ms.
	ProbeInterval time.Duration
	// Clock ticks the probes (default the real clock).
	Clock clock.WithTicker
	// Registry receives the gateway's metrics; nil makes one with the Go and
	// process collectors.
	Registry *prometheus.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Gateway forwards queries over its xDS channel.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	conn    *grpc.ClientConn
	client  mailboxv1.MailboxQueryClient
	health  *health.Server
	metrics *metrics
	ready   atomic.Bool
	// nonce numbers the lookups retries take past grpc-go's cache
	// (mesh.HeaderLookupNonce).
	nonce atomic.Uint64
}

// New dials xds:///mailbox-query. The channel connects lazily; Run reports
// when the routes have arrived.
func New(cfg Config) (*Gateway, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 250 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	fallback := insecure.NewCredentials()
	if cfg.TLS != nil {
		fallback = credentials.NewTLS(cfg.TLS.ClientConfig(pki.RoleIs(identity.Proxy, identity.Admin)))
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: fallback})
	if err != nil {
		return nil, fmt.Errorf("gateway: xds credentials: %w", err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithConnectParams(runnerConnectParams), grpc.WithStatsHandler(sentHandler{})}
	if cfg.Bootstrap != nil {
		// grpc-go reads its bootstrap environment once, at package init, so
		// a bootstrap built from flags can only reach it this way (the
		// resolver lacks CSDS support, which the gateway does not use).
		rb, err := grpcxds.NewXDSResolverWithConfigForTesting(cfg.Bootstrap)
		if err != nil {
			return nil, fmt.Errorf("gateway: xds bootstrap: %w", err)
		}
		opts = append(opts, grpc.WithResolvers(rb))
	} else if resolver.Get("xds") == nil {
		return nil, errors.New("gateway: no xds resolver registered")
	}
	conn, err := grpc.NewClient("xds:///"+mesh.QueryListenerName, opts...)
	if err != nil {
		return nil, fmt.Errorf("gateway: dial xds:///%s: %w", mesh.QueryListenerName, err)
	}
	g := &Gateway{
		cfg: cfg, log: cfg.Logger, conn: conn, client: mailboxv1.NewMailboxQueryClient(conn),
		health: health.NewServer(), metrics: newMetrics(cfg.Registry),
	}
	g.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	g.health.SetServingStatus(mailboxv1.MailboxQuery_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return g, nil
}

// Registry is where the gateway's metrics live.
func (g *Gateway) Registry() *prometheus.Registry { return g.cfg.Registry }

// Ready is nil once a call through the xDS channel has been answered by the
// mesh, i.e. the listener, routes, clusters and endpoints have arrived.
// grpc-go keeps serving its last routes if the admin nodes go away, so the
// gateway stays ready from then on.
func (g *Gateway) Ready() error {
	if !g.ready.Load() {
		return errors.New("no routes from the admin nodes yet")
	}
	return nil
}

// Run probes until the routes have arrived, then marks the gateway ready
// (/readyz, gRPC health) and returns; it returns ctx's error if they never do.
func (g *Gateway) Run(ctx context.Context) error {
	t := g.cfg.Clock.NewTicker(g.cfg.ProbeInterval)
	defer t.Stop()
	for attempt := 1; ; attempt++ {
		err := g.probe(ctx)
		if err == nil {
			g.ready.Store(true)
			g.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			g.health.SetServingStatus(mailboxv1.MailboxQuery_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
			g.log.Info("gateway ready: routes received", "probes", attempt)
			return nil
		}
		if attempt == 1 || attempt%40 == 0 {
			g.log.Info("waiting for routes from the admin nodes", "err", err, "probes", attempt)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
		}
	}
}

func (g *Gateway) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(g.cfg.Timeout, 2*time.Second))
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, ProbeMailbox)
	_, err := g.client.GetStats(ctx, &mailboxv1.GetStatsRequest{})
	if c := status.Code(err); c != codes.NotFound && c != codes.OK {
		return fmt.Errorf("probe: %w", err)
	}
	return nil
}

// RegisterGRPC adds the MailboxQuery front door and the gRPC health service
// to s.
func (g *Gateway) RegisterGRPC(s *grpc.Server) {
	request.Register(s, &grpcProxy{g: g})
	healthpb.RegisterHealthServer(s, g.health)
}

// Close ends the xDS channel; calls in flight fail.
func (g *Gateway) Close() error {
	g.health.Shutdown()
	return g.conn.Close()
}
