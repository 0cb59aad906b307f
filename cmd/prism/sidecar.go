package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/sidecar/agent"
	"github.com/prism-mesh/prism/sidecar/inject"
)

// envOr is the flag default taken from the environment, which is how the
// injector configures the sidecar (sidecar/inject's Env* names).
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := envOr(name, "")
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("$%s: %w", name, err)
	}
	return d, nil
}

func sidecarCommand() *cobra.Command {
	var (
		proxyID, runnerID, adminEndpoints, runnerAddr, advertiseAddr, httpAddr string
		logLevel, logFormat, region, zone                                      string
		labels                                                                 map[string]string
		leaseTTL, heartbeat, stopTimeout, attemptTimeout, retryMax             time.Duration
	)
	ttlDefault, ttlErr := envDuration(inject.EnvLeaseTTL, 15*time.Second)
	hbDefault, hbErr := envDuration(inject.EnvHeartbeatInterval, 5*time.Second)
	cmd := &cobra.Command{
		Use:   "sidecar",
		Short: "Hold the leases of the runner next to it: register, watch assignments, acquire, heartbeat, fence, release",
		Long: `sidecar runs next to one runner (prism runner without --mailbox) and talks to it on --runner-addr.
It registers proxy --proxy-id with the admin cluster (--admin-endpoints, any node), watches the proxy's
namespace assignments and, for each, has the runner open mailbox {namespace}@{proxy-id}, acquires its
lease with the runner's query address (--advertise-addr) and only then lets the runner consume and serve
it under the lease's epoch. It heartbeats every --heartbeat-interval (jittered) and stops the runner on a
mailbox once the lease ttl has passed since it sent the last acknowledged heartbeat, or on a refusal,
then acquires again. SIGTERM: the runner drains (stop fetching, flush, commit), then every lease is
released, within --stop-timeout. /readyz is ready only while every assigned lease is held.

Every flag defaults to its environment variable (PRISM_PROXY_ID, PRISM_ADMIN_ENDPOINTS, PRISM_LEASE_TTL,
PRISM_HEARTBEAT_INTERVAL, PRISM_RUNNER_ADDR, PRISM_ADVERTISE_ADDR, PRISM_HTTP_ADDR, PRISM_LOG_LEVEL,
PRISM_RUNNER_ID), as set by the injector.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := errors.Join(ttlErr, hbErr); err != nil {
				return err
			}
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			if proxyID == "" {
				return errors.New("--proxy-id: empty and no hostname to default to")
			}
			endpoints := splitBrokers(adminEndpoints)
			if len(endpoints) == 0 {
				return errors.New("--admin-endpoints: at least one admin host:port is required")
			}
			if retryMax <= 0 || attemptTimeout <= 0 {
				return errors.New("--retry-max and --admin-attempt-timeout must be positive")
			}
			if advertiseAddr == "" {
				return errors.New("--advertise-addr: the runner's MailboxQuery host:port, as Envoy and clients reach it, is required")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return runSidecar(ctx, log, sidecarRun{
				proxyID: proxyID, runnerID: runnerID, advertiseAddr: advertiseAddr, runnerAddr: runnerAddr, httpAddr: httpAddr,
				endpoints: endpoints, registration: &adminv1.ProxyRegistration{
					Version: version, Capabilities: []string{"mailbox"}, Labels: labels, Region: region, Zone: zone,
				},
				leaseTTL: leaseTTL, heartbeat: heartbeat, stopTimeout: stopTimeout, attemptTimeout: attemptTimeout, retryMax: retryMax,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&proxyID, "proxy-id", envOr(inject.EnvProxyID, agent.Hostname()), "proxy id to register; mailboxes are {namespace}@{proxy-id}")
	f.StringVar(&runnerID, "runner-id", envOr("PRISM_RUNNER_ID", ""), "runner id in leases (default: the proxy id)")
	f.StringVar(&adminEndpoints, "admin-endpoints", envOr(inject.EnvAdminEndpoints, ""), "admin gRPC endpoints, comma-separated host:port; list every node")
	f.DurationVar(&leaseTTL, "lease-ttl", ttlDefault, "lease ttl to ask for (0: the namespace's); the granted ttl is what the sidecar fences by")
	f.DurationVar(&heartbeat, "heartbeat-interval", hbDefault, "time between heartbeats (jittered down by up to 20%; below --lease-ttl)")
	f.StringVar(&runnerAddr, "runner-addr", envOr(inject.EnvRunnerAddr, defaultControlAddr), "the runner's control API (loopback)")
	f.StringVar(&advertiseAddr, "advertise-addr", envOr(inject.EnvAdvertiseAddr, ""), "the runner's MailboxQuery host:port that routes point to (pod IP and query port)")
	f.StringVar(&httpAddr, "http-addr", envOr(inject.EnvHTTPAddr, fmt.Sprintf(":%d", inject.SidecarHTTPPort)), "HTTP listen address for /healthz, /readyz and /metrics")
	f.StringVar(&logLevel, "log-level", envOr(inject.EnvLogLevel, "info"), "log level: debug, info, warn, error")
	f.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&region, "region", envOr("PRISM_REGION", ""), "region reported at registration")
	f.StringVar(&zone, "zone", envOr("PRISM_ZONE", ""), "zone reported at registration")
	f.StringToStringVar(&labels, "label", nil, "label reported at registration, key=value (repeatable)")
	f.DurationVar(&stopTimeout, "stop-timeout", 4500*time.Millisecond, "bound on the graceful stop: runner drain, then every release (keep it under 5s)")
	f.DurationVar(&retryMax, "retry-max", 5*time.Second, "longest wait between retries (acquire, heartbeat, watch), which start at 100ms and double")
	f.DurationVar(&attemptTimeout, "admin-attempt-timeout", 2*time.Second, "bound on one call to one admin node before trying the next")
	return cmd
}

// sidecarRun is one lease agent's settings, as `prism sidecar` takes them
// from flags and `prism dev` sets them for its runner.
type sidecarRun struct {
	proxyID, runnerID, advertiseAddr, runnerAddr, httpAddr string
	endpoints                                              []string
	registration                                           *adminv1.ProxyRegistration
	leaseTTL, heartbeat, stopTimeout, attemptTimeout       time.Duration
	retryMax                                               time.Duration
}

// runSidecar runs the agent next to the runner at s.runnerAddr, with its
// /healthz, /readyz and /metrics on s.httpAddr, until ctx ends; then the
// runner drains and every lease is released (bounded by s.stopTimeout).
func runSidecar(ctx context.Context, log *slog.Logger, s sidecarRun) error {
	log = log.With("component", "sidecar")
	admin, err := agent.DialEndpoints(s.endpoints, s.attemptTimeout, log)
	if err != nil {
		return err
	}
	defer admin.Close()
	rc, err := grpc.NewClient(s.runnerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("--runner-addr: %w", err)
	}
	defer rc.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := agent.New(agent.Config{
		ProxyID: s.proxyID, RunnerID: s.runnerID, AdvertiseAddr: s.advertiseAddr, Registration: s.registration,
		LeaseTTL: s.leaseTTL, HeartbeatInterval: s.heartbeat, StopTimeout: s.stopTimeout,
		Backoff: wait.Backoff{Duration: min(100*time.Millisecond, s.retryMax), Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: s.retryMax},
		Admin:   admin, Runner: runnerv1.NewRunnerControlClient(rc),
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.httpAddr)
	if err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("sidecar serving", "http_addr", ln.Addr().String(), "admin_endpoints", s.endpoints, "runner_addr", s.runnerAddr)
	runErr := a.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return errors.Join(runErr, srv.Shutdown(sctx))
}
