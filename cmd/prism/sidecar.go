package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/sidecar/agent"
	"github.com/prism-mesh/prism/sidecar/inject"
	"github.com/prism-mesh/prism/sidecar/node"
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
		proxyID, runnerID, adminEndpoints, runnerAddr, advertiseAddr, httpAddr      string
		logLevel, logFormat, region, zone, leaseMode                                string
		labels                                                                      map[string]string
		leaseTTL, heartbeat, runnerDeadAfter, stopTimeout, attemptTimeout, retryMax time.Duration
		tls                                                                         tlsFlags
		conn                                                                        connFlags
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
it under the lease's epoch. With --lease-mode=session (the default) every lease belongs to one session
of this sidecar: the mailboxes are acquired in batches (all those known at start in one call) and one
keepalive every --heartbeat-interval (jittered) renews them all; an admin cluster without sessions (not
upgraded) is detected and the sidecar falls back to --lease-mode=mailbox, one heartbeat per lease. It
stops the runner on a mailbox once the lease ttl has passed since it sent the last acknowledged
keepalive (heartbeat), or on a refusal, then acquires again (a lost session: in a new one). A runner whose control API fails the stats probe for --runner-dead-after gets no
more renewals: the sidecar fences it, releases its leases and acquires again once the runner answers.
SIGTERM: the runner drains (stop fetching, flush, commit), then every lease is released (the session
closed), within --stop-timeout. /readyz is ready only while every assigned lease is held. POST
/drain?timeout=D (prism sidecar drain-wait, the runner's preStop hook) cordons the proxy and waits until
its namespaces have been handed off to other proxies.

Every flag defaults to its environment variable (PRISM_PROXY_ID, PRISM_ADMIN_ENDPOINTS, PRISM_LEASE_TTL,
PRISM_HEARTBEAT_INTERVAL, PRISM_RUNNER_ADDR, PRISM_ADVERTISE_ADDR, PRISM_HTTP_ADDR, PRISM_LOG_LEVEL,
PRISM_RUNNER_ID, PRISM_TLS_CA, PRISM_TLS_CERT, PRISM_TLS_KEY), as set by the injector.

The certificate (--tls-cert) must be proxy/<--proxy-id>'s, the same files the runner serves with: the
sidecar refuses to start with another identity, dials the admin and the runner's control API over mutual
TLS, and accepts only a runner presenting that same identity. --insecure dials in plaintext.`,
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
			if err := mesh.CheckName("--proxy-id", proxyID); err != nil {
				return err
			}
			if runnerID != "" {
				if err := mesh.CheckName("--runner-id", runnerID); err != nil {
					return err
				}
			}
			endpoints := splitBrokers(adminEndpoints)
			if len(endpoints) == 0 {
				return errors.New("--admin-endpoints: at least one admin host:port is required")
			}
			if retryMax <= 0 || attemptTimeout <= 0 {
				return errors.New("--retry-max and --admin-attempt-timeout must be positive")
			}
			mode := agent.LeaseMode(leaseMode)
			if mode != agent.LeaseModeSession && mode != agent.LeaseModeMailbox {
				return fmt.Errorf("--lease-mode %q: want session or mailbox", leaseMode)
			}
			if advertiseAddr == "" {
				return errors.New("--advertise-addr: the runner's MailboxQuery host:port, as Envoy and clients reach it, is required")
			}
			bounds, err := conn.bounds()
			if err != nil {
				return err
			}
			src, err := tls.load(log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return node.Run(ctx, node.Config{
				ProxyID: proxyID, RunnerID: runnerID, AdvertiseAddr: advertiseAddr, RunnerAddr: runnerAddr, HTTPAddr: httpAddr, Conn: bounds,
				AdminEndpoints: endpoints, Registration: &adminv1.ProxyRegistration{
					Version: version, Capabilities: []string{"mailbox"}, Labels: labels, Region: region, Zone: zone,
				},
				LeaseMode: mode, LeaseTTL: leaseTTL, HeartbeatInterval: heartbeat, RunnerDeadAfter: runnerDeadAfter, StopTimeout: stopTimeout, AttemptTimeout: attemptTimeout, RetryMax: retryMax,
				TLS: src, Logger: log,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&proxyID, "proxy-id", envOr(inject.EnvProxyID, agent.Hostname()), "proxy id to register; mailboxes are {namespace}@{proxy-id}")
	f.StringVar(&runnerID, "runner-id", envOr("PRISM_RUNNER_ID", ""), "runner id in leases (default: the proxy id)")
	f.StringVar(&adminEndpoints, "admin-endpoints", envOr(inject.EnvAdminEndpoints, ""), "admin gRPC endpoints, comma-separated host:port; list every node")
	f.StringVar(&leaseMode, "lease-mode", envOr("PRISM_LEASE_MODE", string(agent.LeaseModeSession)), "session: hold every lease in one session renewed by one keepalive (falls back to mailbox on an admin without sessions); mailbox: acquire and heartbeat each lease on its own")
	f.DurationVar(&leaseTTL, "lease-ttl", ttlDefault, "lease ttl to ask for (0: the namespace's); the granted ttl is what the sidecar fences by")
	f.DurationVar(&heartbeat, "heartbeat-interval", hbDefault, "time between heartbeats (jittered down by up to 20%; below --lease-ttl)")
	f.DurationVar(&runnerDeadAfter, "runner-dead-after", 0, "the runner failing the stats probe of each heartbeat this long (unreachable, or erring) has its leases given back (no more renewals, fence, release) and is reported not ready, so its proxy is routed around and its namespaces placed elsewhere until it answers again (0: three heartbeat intervals, at most half the lease ttl; below --lease-ttl)")
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
	tls.register(f)
	conn.register(f, "--http-addr")
	cmd.AddCommand(drainWaitCommand())
	return cmd
}

// drainWaitCommand is the runner container's preStop hook: the image has
// no curl, and the hook must block until the sidecar has handed the
// proxy's namespaces off (docs/architecture.md#kubernetes-stop-order).
func drainWaitCommand() *cobra.Command {
	var (
		addr    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "drain-wait",
		Short: "Ask the sidecar next to this runner to drain the proxy, and wait until it has (the runner's preStop hook)",
		Long: `drain-wait calls POST /drain on the sidecar's HTTP address (--addr): the sidecar cordons its proxy, so the
admin moves each of its namespaces to another proxy by handoff while this runner keeps serving, and answers
once the proxy serves and hands off nothing, or at --timeout. It exits 0 once drained, 1 otherwise (the
kubelet then stops the runner anyway), printing the sidecar's answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return errors.New("--timeout must be positive")
			}
			u := url.URL{Scheme: "http", Host: addr, Path: "/drain", RawQuery: url.Values{"timeout": {timeout.String()}}.Encode()}
			// The sidecar answers at its own deadline; the client's is only
			// for a sidecar that never answers.
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout+10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("drain %s: %w", u.Host, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if err != nil {
				return fmt.Errorf("drain %s: %w", u.Host, err)
			}
			if _, err := cmd.OutOrStdout().Write(body); err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("drain %s: %s", u.Host, resp.Status)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", fmt.Sprintf("127.0.0.1:%d", inject.SidecarHTTPPort), "the sidecar's HTTP host:port (its --http-addr)")
	f.DurationVar(&timeout, "timeout", 3*time.Minute, "how long the sidecar waits for the handoffs; keep it under the pod's terminationGracePeriodSeconds")
	return cmd
}
