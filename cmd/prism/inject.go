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
		tlsMode, tlsContainers  string
		conn                    connFlags
	)
	cmd := &cobra.Command{
		Use:   "inject",
		Short: "Run the mutating admission webhook that injects the prism sidecar into runner pods",
		Long: `inject serves admission.k8s.io/v1 AdmissionReviews over HTTPS and adds the
prism sidecar, as a native sidecar, to pods labelled prism.io/inject=true
(path ` + inject.PathInjectPod + `) or in namespaces so labelled (path ` + inject.PathInjectNamespace + `).
Pod annotations (prism.io/proxy-id, prism.io/admin-endpoints, prism.io/lease-ttl,
prism.io/heartbeat-interval, prism.io/runner-addr, prism.io/runner-query-port,
prism.io/sidecar-image, prism.io/tls-secret, prism.io/tls-containers, ...)
override the defaults given here.

--mesh-tls says how the sidecar and the pod's runner (the containers named by
--mesh-tls-containers) get their shared identity spiffe://<trust-domain>/proxy/<proxy-id>:
  csi       a cert-manager csi-driver volume (csi.cert-manager.io) per pod, signed by
            --mesh-issuer-name, renewed in place
  secret    a Secret (--mesh-tls-secret) holding ca.crt, <proxy-id>.crt and <proxy-id>.key
  insecure  the sidecar runs with --insecure
Both containers find the files through PRISM_TLS_CA, PRISM_TLS_CERT and PRISM_TLS_KEY.
--tls-cert and --tls-key are the webhook's own serving certificate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "inject")
			bounds, err := conn.bounds()
			if err != nil {
				return err
			}
			opts := defaults
			opts.TLS.Mode = inject.TLSMode(tlsMode)
			opts.TLS.Containers = nil
			for _, c := range strings.Split(tlsContainers, ",") {
				if c = strings.TrimSpace(c); c != "" {
					opts.TLS.Containers = append(opts.TLS.Containers, c)
				}
			}
			for _, ep := range strings.Split(adminEndpoints, ",") {
				if ep = strings.TrimSpace(ep); ep != "" {
					opts.AdminEndpoints = append(opts.AdminEndpoints, ep)
				}
			}
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
			return inject.Serve(ctx, ln, inject.NewHandler(wh, reg), certs, bounds, log)
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
	f.StringVar(&tlsMode, "mesh-tls", "", fmt.Sprintf("how injected pods get their proxy identity: one of %v (required)", inject.TLSModes))
	f.StringVar(&defaults.TLS.TrustDomain, "mesh-trust-domain", defaults.TLS.TrustDomain, "trust domain of the proxy identities (csi mode)")
	f.StringVar(&defaults.TLS.Issuer.Name, "mesh-issuer-name", "", "cert-manager issuer that signs the csi-driver certificates: a CA issuer, since csi-driver cannot use a SelfSigned one (csi mode)")
	f.StringVar(&defaults.TLS.Issuer.Kind, "mesh-issuer-kind", "Issuer", "kind of --mesh-issuer-name: Issuer or ClusterIssuer (csi mode)")
	f.StringVar(&defaults.TLS.Issuer.Group, "mesh-issuer-group", "cert-manager.io", "API group of --mesh-issuer-name (csi mode)")
	f.DurationVar(&defaults.TLS.Duration, "mesh-cert-duration", 0, "lifetime of each pod's certificate; csi-driver renews it at two thirds (0: the driver's default; csi mode)")
	f.StringVar(&defaults.TLS.Key.Algorithm, "mesh-key-algorithm", "", "key algorithm csi-driver makes each pod's key with: RSA, ECDSA or Ed25519 (empty: the driver's default, RSA; csi mode)")
	f.IntVar(&defaults.TLS.Key.Size, "mesh-key-size", 0, "key size in bits (0: the driver's default for the algorithm; csi mode)")
	f.StringVar(&defaults.TLS.Key.Encoding, "mesh-key-encoding", "", "key encoding csi-driver writes: PKCS1 or PKCS8 (empty: the driver's default, PKCS1; csi mode)")
	f.StringVar(&defaults.TLS.SecretName, "mesh-tls-secret", "", "default Secret of the proxy identities: ca.crt, <proxy-id>.crt, <proxy-id>.key (secret mode; annotation "+inject.AnnotationTLSSecret+")")
	f.StringVar(&tlsContainers, "mesh-tls-containers", strings.Join(defaults.TLS.Containers, ","), "default containers of a pod that share the sidecar's identity, comma-separated (annotation "+inject.AnnotationTLSContainers+")")
	conn.register(f, "--addr")
	return cmd
}
