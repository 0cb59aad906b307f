// Package node assembles one lease sidecar process: the admin client, the
// client of the runner's control API, the agent and its HTTP server
// (/healthz, /readyz, /metrics). `prism sidecar` and `prism dev` only turn
// their flags into a Config.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/sidecar/agent"
)

// Config is one sidecar next to one runner.
type Config struct {
	ProxyID string
	// RunnerID names the runner in leases; "" is the proxy id.
	RunnerID string
	// AdvertiseAddr is the runner's query address that routes point at.
	AdvertiseAddr string
	// RunnerAddr is the runner's control API (loopback).
	RunnerAddr string
	// HTTPAddr serves /healthz, /readyz and /metrics, its connections
	// bounded by Conn (internal/connlimit; zero fields take its defaults).
	HTTPAddr string
	Conn     connlimit.Bounds
	// AdminEndpoints are admin nodes' gRPC addresses; any of them will do.
	AdminEndpoints []string
	Registration   *adminv1.ProxyRegistration

	// LeaseMode: one session for every lease (default), or each lease on
	// its own for an admin cluster without the Sessions service.
	LeaseMode         agent.LeaseMode
	LeaseTTL          time.Duration // 0: the namespace's
	HeartbeatInterval time.Duration
	// RunnerDeadAfter: the runner failing probes this long has its leases
	// given back (0: three heartbeat intervals, at most half the ttl).
	RunnerDeadAfter time.Duration
	StopTimeout     time.Duration // bound on the graceful stop: runner drain, then every release
	AttemptTimeout  time.Duration // bound on one call to one admin node
	RetryMax        time.Duration // longest wait between retries, which start at 100ms and double
	// TLS, when set, is the identity of the proxy, proxy/<ProxyID>, which
	// the runner shares: the runner's control API is dialled over mutual TLS
	// and must present exactly that identity too. nil dials in plaintext.
	TLS    *pki.Source
	Logger *slog.Logger
}

// checkIdentity refuses a certificate that names another proxy: the admin
// would refuse its every call for this proxy id, and the runner would not
// take its orders.
func checkIdentity(src *pki.Source, proxyID string) error {
	if src == nil {
		return nil
	}
	got := src.Identity()
	if got.Role != identity.Proxy || got.Name != proxyID {
		want := identity.Identity{TrustDomain: got.TrustDomain, Role: identity.Proxy, Name: proxyID}
		return fmt.Errorf("sidecar of proxy %q: the TLS certificate is %s, want %s (issue the proxy's certificate for this proxy id, or run with that proxy id)", proxyID, got, want)
	}
	return nil
}

// runnerCredentials are the control API's: the runner must hold the
// sidecar's own identity.
func runnerCredentials(src *pki.Source) credentials.TransportCredentials {
	if src == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(src.ClientConfig(pki.Exactly(src.Identity())))
}

// runnerConnectParams reconnect to the runner's control API at most half a
// second after a failed dial, where grpc-go's default waits up to two
// minutes.
var runnerConnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
	MinConnectTimeout: 5 * time.Second,
}

// Run runs the sidecar until ctx ends; then the runner drains and every
// lease is released (bounded by StopTimeout), and the HTTP server stops.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "sidecar")
	if err := checkIdentity(cfg.TLS, cfg.ProxyID); err != nil {
		return err
	}
	admin, err := agent.DialEndpoints(cfg.AdminEndpoints, cfg.AttemptTimeout, log, cfg.TLS)
	if err != nil {
		return err
	}
	defer admin.Close()
	// The dialer tells the agent when the runner is gone (its control port
	// refuses connections), and when it listens again. The reconnect
	// backoff is short: a loopback dial costs nothing, and a runner that
	// started again is served again as soon as it is reached.
	dialer := agent.NewRunnerDialer()
	rc, err := grpc.NewClient(cfg.RunnerAddr, grpc.WithTransportCredentials(runnerCredentials(cfg.TLS)),
		grpc.WithContextDialer(dialer.Dial), grpc.WithConnectParams(runnerConnectParams))
	if err != nil {
		return fmt.Errorf("runner control address %s: %w", cfg.RunnerAddr, err)
	}
	defer rc.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// One instance per process: the drain POST /drain asks for ends when
	// this process does, so the pod that replaces it is placed again.
	instance := agent.NewInstance()
	a, err := agent.New(agent.Config{
		ProxyID: cfg.ProxyID, RunnerID: cfg.RunnerID, AdvertiseAddr: cfg.AdvertiseAddr, Registration: cfg.Registration, Instance: instance,
		Cordon: func(ctx context.Context, id string) error {
			_, err := admin.DrainProxy(ctx, &adminv1.DrainProxyRequest{ProxyId: id, Instance: instance})
			return err
		},
		LeaseMode: cfg.LeaseMode, LeaseTTL: cfg.LeaseTTL, HeartbeatInterval: cfg.HeartbeatInterval, RunnerDeadAfter: cfg.RunnerDeadAfter, StopTimeout: cfg.StopTimeout,
		Backoff: wait.Backoff{Duration: min(100*time.Millisecond, cfg.RetryMax), Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: cfg.RetryMax},
		Admin:   admin, Runner: runnerv1.NewRunnerControlClient(rc), RunnerConn: dialer,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("sidecar http listen %s: %w", cfg.HTTPAddr, err)
	}
	srv := cfg.Conn.HTTP(&http.Server{Handler: a.Handler()})
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("sidecar serving", "http_addr", ln.Addr().String(), "admin_endpoints", cfg.AdminEndpoints, "runner_addr", cfg.RunnerAddr)
	runErr := a.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return errors.Join(runErr, srv.Shutdown(sctx))
}
