package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/sidecar/inject"
)

func injectCommand() *cobra.Command {
	defaults := inject.DefaultOptions()
	var (
		addr, certFile, keyFile string
		adminEndpoints          string
		cpu, memory             string
	)
	cmd := &cobra.Command{
		Use:   "inject",
		Short: "Run the mutating admission webhook that injects the prism sidecar into runner pods",
		Long: `inject serves admission.k8s.io/v1 AdmissionReviews over HTTPS and adds the
prism sidecar, as a native sidecar, to pods labelled prism.io/inject=true
(path ` + inject.PathInjectPod + `) or in namespaces so labelled (path ` + inject.PathInjectNamespace + `).
Pod annotations (prism.io/proxy-id, prism.io/admin-endpoints, prism.io/lease-ttl,
prism.io/heartbeat-interval, prism.io/runner-addr, prism.io/runner-query-port,
prism.io/sidecar-image, ...)
override the defaults given here.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "inject")
			opts := defaults
			for _, ep := range strings.Split(adminEndpoints, ",") {
				if ep = strings.TrimSpace(ep); ep != "" {
					opts.AdminEndpoints = append(opts.AdminEndpoints, ep)
				}
			}
			var err error
			if opts.CPU, err = resource.ParseQuantity(cpu); err != nil {
				return fmt.Errorf("--sidecar-cpu: %w", err)
			}
			if opts.Memory, err = resource.ParseQuantity(memory); err != nil {
				return fmt.Errorf("--sidecar-memory: %w", err)
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			wh, err := inject.NewWebhook(opts, log, reg, clock.RealClock{})
			if err != nil {
				return err
			}
			certs, err := inject.NewCertReloader(certFile, keyFile, log)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen %s: %w", addr, err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log.Info("injector listening", "addr", ln.Addr().String(), "image", opts.Image)
			return inject.Serve(ctx, ln, inject.NewHandler(wh, reg), certs, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", ":9443", "HTTPS listen address for reviews, /healthz, /readyz and /metrics")
	f.StringVar(&certFile, "tls-cert", "/etc/prism/inject-tls/tls.crt", "TLS certificate file (PEM); reloaded when it changes")
	f.StringVar(&keyFile, "tls-key", "/etc/prism/inject-tls/tls.key", "TLS private key file (PEM); reloaded when it changes")
	f.StringVar(&defaults.Image, "sidecar-image", "", "sidecar image (required unless every pod sets "+inject.AnnotationImage+")")
	f.StringVar(&adminEndpoints, "admin-endpoints", "", "default admin gRPC endpoints, comma-separated host:port")
	f.DurationVar(&defaults.LeaseTTL, "lease-ttl", defaults.LeaseTTL, "default lease TTL")
	f.DurationVar(&defaults.HeartbeatInterval, "heartbeat-interval", defaults.HeartbeatInterval, "default heartbeat interval (below the TTL)")
	f.StringVar(&defaults.RunnerAddr, "runner-addr", defaults.RunnerAddr, "default address of the runner's local control API")
	f.IntVar(&defaults.QueryPort, "runner-query-port", defaults.QueryPort, "default runner query port the sidecar advertises as podIP:port for Envoy")
	f.StringVar(&cpu, "sidecar-cpu", defaults.CPU.String(), "default sidecar CPU request")
	f.StringVar(&memory, "sidecar-memory", defaults.Memory.String(), "default sidecar memory request and limit")
	f.StringVar(&defaults.LogLevel, "sidecar-log-level", defaults.LogLevel, "default sidecar log level")
	return cmd
}
