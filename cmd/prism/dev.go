package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/audit"
	"github.com/prism-mesh/prism/admin/server"
	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	"github.com/prism-mesh/prism/mailbox/ingest"
	runnernode "github.com/prism-mesh/prism/mailbox/node"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	sidecarnode "github.com/prism-mesh/prism/sidecar/node"
)

// The demo mesh's fixed names: one proxy, one namespace, so its mailbox is
// always demo@proxy-01.
const (
	devProxyID   = "proxy-01"
	devNamespace = "demo"
	devAdminID   = "dev-admin"
	// devAuditTopic is the admin's audit trail, read by $admin@proxy-01.
	// Not audit.DefaultTopic: the demo producer writes admin.events, and
	// the trail's topic must hold the admin's events only (the leader
	// resumes from its last record's message id, a Raft index).
	devAuditTopic = "admin.audit"
	// devStartTimeout bounds each wait while starting (leader, namespace,
	// first events through the gateway) on a loaded machine.
	devStartTimeout = 90 * time.Second
)

type devFlags struct {
	dataDir         string
	kafka           string
	kafkaPort       int
	topics          []string
	gateway         string
	gatewayAddr     string
	gatewayGRPCAddr string
	envoyAdminAddr  string
	adminAddr       string
	adminHTTPAddr   string
	raftAddr        string
	runnerAddr      string
	runnerHTTPAddr  string
	controlAddr     string
	sidecarHTTPAddr string
	rate            float64
	demo            bool
	logLevel        string
	logFormat       string
	insecure        bool
}

// devEnv is what `prism dev` has started. Each component registers how to
// stop it; stop runs them in reverse start order, so the demo producer stops
// first, then the gateway, the sidecar (runner drains, leases released), the
// runner, the admin node and the broker.
type devEnv struct {
	f       *devFlags
	log     *slog.Logger
	dataDir string
	brokers []string
	// gatewayKind says which gateway serves gatewayURL.
	gatewayKind string
	gatewayURL  string
	// ids are the components' certificates; nil with --insecure.
	ids *devIdentities
	// failed reports a component that stopped on its own.
	failed chan error
	stops  []devStop
}

type devStop struct {
	name string
	fn   func() error
}

func (e *devEnv) onStop(name string, fn func() error) { e.stops = append(e.stops, devStop{name, fn}) }

func (e *devEnv) stop() error {
	var errs []error
	for i := len(e.stops) - 1; i >= 0; i-- {
		s := e.stops[i]
		start := time.Now()
		if err := s.fn(); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", s.name, err))
		}
		e.log.Info("stopped", "component", s.name, "took", time.Since(start).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// fail reports that a component ended by itself; the first one ends prism dev.
func (e *devEnv) fail(name string, err error) {
	if err == nil {
		err = errors.New("exited")
	}
	select {
	case e.failed <- fmt.Errorf("%s: %w", name, err):
	default:
	}
}

func devCommand() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole mesh on one machine with embedded defaults and demo traffic",
		Long: `dev starts the whole mesh in one process, on loopback:
  - an embedded Kafka broker (franz-go's kfake, the real Kafka protocol) unless --kafka is given,
  - a single-node admin (Raft bootstrapped on --data-dir, or a temporary directory) serving the
    ControlPlane and Admin gRPC APIs and xDS on --admin-addr,
  - a runner with its lease sidecar (proxy ` + devProxyID + `),
  - the gateway on --gateway-addr: Envoy when an envoy binary is on PATH (bootstrap from envoy/),
    otherwise prism gateway in-process (--gateway chooses),
  - namespace "` + devNamespace + `" (mailbox ` + devNamespace + `@` + devProxyID + `) on --topic, created through the ControlPlane,
  - a producer of demo envelopes on those topics unless --demo=false.
It prints the gateway URL, the admin address for prismctl and a curl line through the gateway,
and "prism dev: ready" once that curl line returns events. SIGINT or SIGTERM stops everything in
order: demo producer, gateway, sidecar (the runner drains, leases are released), runner, admin, broker.

Default ports (all 127.0.0.1): gateway 8080 (gRPC 8081), admin gRPC/xDS 7001, admin HTTP 7002,
raft 7000, runner query 9090, runner HTTP 9091, runner control 7071, sidecar HTTP 7072, Kafka 9092,
Envoy admin 9901.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer cancel()
			e := &devEnv{f: &f, log: log, failed: make(chan error, 1)}
			err = e.run(ctx, cmd.OutOrStdout())
			// A second signal during the stop kills the process as usual.
			cancel()
			log.Info("stopping prism dev")
			if stopErr := e.stop(); stopErr != nil {
				log.Error("stopping prism dev", "err", stopErr)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.dataDir, "data-dir", "", "keep admin and runner state here (default: a temporary directory, removed on exit)")
	fs.StringVar(&f.kafka, "kafka", "", "use these Kafka brokers (comma-separated host:port) instead of the embedded one")
	fs.IntVar(&f.kafkaPort, "kafka-port", 9092, "loopback port of the embedded broker (0: any free port)")
	fs.StringArrayVar(&f.topics, "topic", []string{"audit.events", "admin.events"}, "topic of the demo namespace and the demo producer (repeatable)")
	fs.StringVar(&f.gateway, "gateway", "auto", "gateway: auto (envoy if on PATH, else prism), envoy, or prism (prism gateway in-process)")
	fs.StringVar(&f.gatewayAddr, "gateway-addr", "127.0.0.1:8080", "gateway HTTP query API (the gateway URL)")
	fs.StringVar(&f.gatewayGRPCAddr, "gateway-grpc-addr", "127.0.0.1:8081", "prism gateway's MailboxQuery gRPC address")
	fs.StringVar(&f.envoyAdminAddr, "envoy-admin-addr", "127.0.0.1:9901", "Envoy's admin interface, when Envoy is the gateway")
	fs.StringVar(&f.adminAddr, "admin-addr", "127.0.0.1:7001", "admin gRPC address: ControlPlane, Admin and xDS (prismctl --admin)")
	fs.StringVar(&f.adminHTTPAddr, "admin-http-addr", "127.0.0.1:7002", "admin HTTP address (/metrics, /healthz, /readyz)")
	fs.StringVar(&f.raftAddr, "raft-addr", "127.0.0.1:7000", "admin raft transport address")
	fs.StringVar(&f.runnerAddr, "runner-addr", "127.0.0.1:9090", "runner query address (gRPC and HTTP), where routes point")
	fs.StringVar(&f.runnerHTTPAddr, "runner-http-addr", "127.0.0.1:9091", "runner HTTP address (query API, /metrics, /healthz, /readyz)")
	fs.StringVar(&f.controlAddr, "control-addr", defaultControlAddr, "runner control API, which the sidecar uses (loopback)")
	fs.StringVar(&f.sidecarHTTPAddr, "sidecar-http-addr", "127.0.0.1:7072", "sidecar HTTP address (/metrics, /healthz, /readyz)")
	fs.Float64Var(&f.rate, "rate", 20, "demo envelopes per second")
	fs.BoolVar(&f.demo, "demo", true, "produce demo envelopes")
	fs.StringVar(&f.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: json or text")
	fs.BoolVar(&f.insecure, "insecure", false, "run every component in plaintext, without the throwaway CA and mutual TLS")
	return cmd
}

func (e *devEnv) run(ctx context.Context, out io.Writer) error {
	f := e.f
	if f.demo && f.rate <= 0 {
		return errors.New("--rate must be positive")
	}
	if len(f.topics) == 0 {
		return errors.New("--topic: at least one is required")
	}
	kind, err := e.gatewayChoice()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "prism dev: starting kafka, admin, runner with sidecar, %s gateway on %s ...\n", kind, f.gatewayAddr)
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"data dir", e.prepareDataDir},
		// Kafka first: prismctl's config file, written with the
		// certificates, names its brokers.
		{"kafka", e.startKafka},
		{"certificates", e.preparePKI},
		{"admin", e.startAdmin},
		{"runner", e.startRunner},
		{"sidecar", e.startSidecar},
		{"demo namespace", e.createNamespace},
		{"gateway", func(ctx context.Context) error { return e.startGateway(ctx, kind) }},
		{"demo producer", e.startDemo},
		{"first query", e.awaitGateway},
	}
	for _, s := range steps {
		if err := s.fn(ctx); err != nil {
			if ctx.Err() != nil {
				return nil //nolint:nilerr // the step failed because dev is stopping (Ctrl-C): a clean stop
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	e.printReady(out)
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.failed:
		return err
	}
}

func (e *devEnv) gatewayChoice() (string, error) {
	switch e.f.gateway {
	case "prism":
		return "prism", nil
	case "envoy":
		if _, err := exec.LookPath("envoy"); err != nil {
			return "", fmt.Errorf("--gateway envoy: %w", err)
		}
		return "envoy", nil
	case "auto":
		if _, err := exec.LookPath("envoy"); err == nil {
			return "envoy", nil
		}
		return "prism", nil
	}
	return "", fmt.Errorf("--gateway %q: want auto, envoy or prism", e.f.gateway)
}

func (e *devEnv) prepareDataDir(context.Context) error {
	if e.f.dataDir != "" {
		e.dataDir = e.f.dataDir
		return os.MkdirAll(e.dataDir, 0o700)
	}
	dir, err := os.MkdirTemp("", "prism-dev-")
	if err != nil {
		return err
	}
	e.dataDir = dir
	e.onStop("data dir", func() error { return os.RemoveAll(dir) })
	return nil
}

// startKafka uses --kafka if given, or starts an embedded broker on loopback
// with the demo topics and their dead-letter topics. Other topics are created
// on first use, so a namespace made with prismctl can name a new one.
func (e *devEnv) startKafka(context.Context) error {
	if e.f.kafka != "" {
		e.brokers = splitBrokers(e.f.kafka)
		if len(e.brokers) == 0 {
			return errors.New("--kafka: no brokers")
		}
		return nil
	}
	topics := append([]string(nil), e.f.topics...)
	for _, t := range e.f.topics {
		topics = append(topics, t+ingest.DLQSuffix)
	}
	topics = append(topics, devAuditTopic)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(e.f.kafkaPort), kfake.SeedTopics(3, topics...), kfake.AllowAutoTopicCreation())
	if err != nil {
		return fmt.Errorf("embedded broker on port %d (--kafka-port): %w", e.f.kafkaPort, err)
	}
	e.onStop("kafka", func() error { c.Close(); return nil })
	e.brokers = c.ListenAddrs()
	e.log.Info("embedded kafka started", "addrs", e.brokers, "topics", topics)
	return nil
}

// startAdmin bootstraps a single admin node, as `prism admin --bootstrap`
// does, and waits for it to lead.
func (e *devEnv) startAdmin(ctx context.Context) error {
	af := adminFlags{
		nodeID: devAdminID, raftAddr: e.f.raftAddr, grpcAddr: e.f.adminAddr, httpAddr: e.f.adminHTTPAddr,
		dataDir: filepath.Join(e.dataDir, "admin"), bootstrap: true, timing: "fast",
		staleProxyAfter: 30 * time.Second, xds: true, gatewayAddr: e.f.gatewayAddr,
		// Envoy, like the prism gateway, listens on loopback for the machine's one user.
		gatewayNoAuth:  true,
		runnerNetworks: prefixes(server.DefaultRunnerNetworks),
		tls:            tlsFlags{insecure: e.f.insecure},
	}
	if e.ids != nil {
		af.tls = tlsFlags{files: e.ids.admin}
	}
	af.auditBrokers, af.auditTopic, af.auditBacklog = strings.Join(e.brokers, ","), devAuditTopic, 100000
	cfg, err := af.nodeConfig(e.log.With("component", "admin"))
	if err != nil {
		return err
	}
	n, err := server.Start(cfg)
	if err != nil {
		return err
	}
	e.onStop("admin", func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return n.Stop(sctx)
	})
	return poll(ctx, "admin node to lead", func() error {
		if !n.Raft.IsRaftLeader() {
			return errors.New("no leader yet")
		}
		return nil
	})
}

// startRunner serves a runner in control-API mode, as `prism runner`
// without --mailbox does: the sidecar opens its mailboxes.
func (e *devEnv) startRunner(context.Context) error {
	dir := filepath.Join(e.dataDir, "runner")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	src, err := e.source(e.ids.proxyFiles())
	if err != nil {
		return err
	}
	n, err := runnernode.Start(runnernode.Config{
		Runner:    runner.Config{DataDir: dir, Brokers: e.brokers},
		QueryAddr: e.f.runnerAddr, HTTPAddr: e.f.runnerHTTPAddr, ControlAddr: e.f.controlAddr,
		Logger: e.log.With("component", "runner"), TLS: src,
	})
	if err != nil {
		return err
	}
	e.onStop("runner", n.Close)
	return nil
}

// startSidecar runs the lease agent of `prism sidecar` next to the runner.
// Stopping it drains the runner and releases the leases.
func (e *devEnv) startSidecar(context.Context) error {
	src, err := e.source(e.ids.proxyFiles())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := sidecarnode.Run(ctx, sidecarnode.Config{
			ProxyID: devProxyID, AdvertiseAddr: e.f.runnerAddr, RunnerAddr: e.f.controlAddr, HTTPAddr: e.f.sidecarHTTPAddr,
			AdminEndpoints: []string{e.f.adminAddr},
			Registration:   &adminv1.ProxyRegistration{Version: version, Capabilities: []string{"mailbox"}},
			LeaseTTL:       15 * time.Second, HeartbeatInterval: 5 * time.Second, StopTimeout: 4500 * time.Millisecond,
			AttemptTimeout: 2 * time.Second, RetryMax: 2 * time.Second,
			Logger: e.log, TLS: src,
		})
		if ctx.Err() == nil {
			// Reported as the failure; not again as a stop error.
			e.fail("sidecar", err)
			err = nil
		}
		done <- err
	}()
	e.onStop("sidecar", func() error { cancel(); return <-done })
	return nil
}

// createNamespace creates the demo namespace through the ControlPlane, like
// `prismctl namespace create`; with the sidecar's proxy the only one, it is
// placed there. An existing one (a kept --data-dir) is left as it is.
func (e *devEnv) createNamespace(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if e.ids != nil {
		src, err := e.source(e.ids.operator)
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(src.ClientConfig(pki.RoleIs(identity.Admin)))
	}
	cc, err := grpc.NewClient(e.f.adminAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer cc.Close()
	cp := adminv1.NewControlPlaneClient(cc)
	req := &adminv1.CreateNamespaceRequest{Namespace: devNamespace, Config: &adminv1.NamespaceConfig{
		Topics: e.f.topics, ValidationMode: adminv1.ValidationMode_VALIDATION_MODE_STRICT,
	}}
	return poll(ctx, "namespace "+devNamespace, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cp.CreateNamespace(cctx, req)
		if status.Code(err) == codes.AlreadyExists {
			e.log.Warn("namespace exists with another config; keeping it", "namespace", devNamespace, "err", err)
			return nil
		}
		return err
	})
}

func (e *devEnv) startGateway(_ context.Context, kind string) error {
	e.gatewayURL = "http://" + e.f.gatewayAddr
	if kind == "envoy" {
		return e.startEnvoy()
	}
	e.gatewayKind = "prism gateway (in-process; no envoy on PATH)"
	if e.f.gateway == "prism" {
		e.gatewayKind = "prism gateway (in-process)"
	}
	src, err := e.source(e.ids.gatewayFiles())
	if err != nil {
		return err
	}
	gw, err := startGateway(e.log.With("component", "gateway"), gatewayFlags{
		admin: e.f.adminAddr, nodeID: devGatewayID, httpAddr: e.f.gatewayAddr, grpcAddr: e.f.gatewayGRPCAddr, identity: src,
		timeout: 10 * time.Second,
		// The dev gateway listens on loopback for the one user of the machine.
		noQueryAuth: true,
	})
	if err != nil {
		return fmt.Errorf("--gateway-addr %s, --gateway-grpc-addr %s: %w", e.f.gatewayAddr, e.f.gatewayGRPCAddr, err)
	}
	e.gatewayURL = gw.url
	e.onStop("gateway", gw.stop)
	return nil
}

// startEnvoy runs the envoy on PATH with the envoy/ bootstrap: its listener
// on --gateway-addr comes from the admin node over ADS.
func (e *devEnv) startEnvoy() error {
	path, err := exec.LookPath("envoy")
	if err != nil {
		return err
	}
	cfg := envoy.Config{NodeID: devGatewayID, AdminNodes: []string{e.f.adminAddr}, AdminAddress: e.f.envoyAdminAddr}
	if e.ids != nil {
		g := e.ids.gateway
		cfg.TLS = &envoy.TLS{CA: g.CA, Cert: g.Cert, Key: g.Key, TrustDomain: identity.DefaultTrustDomain}
	}
	y, err := envoy.YAML(cfg)
	if err != nil {
		return err
	}
	bootstrap := filepath.Join(e.dataDir, "envoy-bootstrap.yaml")
	if err := os.WriteFile(bootstrap, y, 0o600); err != nil {
		return err
	}
	level := e.f.logLevel
	if level == "warn" {
		level = "warning"
	}
	cmd := exec.Command(path, "-c", bootstrap, "--log-level", level)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", path, err)
	}
	e.gatewayKind = "envoy (" + path + ")"
	done := make(chan struct{})
	stopping := make(chan struct{})
	go func() {
		defer close(done)
		err := cmd.Wait()
		select {
		case <-stopping:
		default:
			e.fail("envoy", err)
		}
	}()
	e.onStop("gateway", func() error {
		close(stopping)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		// Envoy's exit status after our SIGTERM or kill says nothing about
		// the mesh; a failure while running was reported by e.fail above.
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		return nil
	})
	return nil
}

// startDemo produces demo envelopes round-robin over the topics at --rate.
func (e *devEnv) startDemo(context.Context) error {
	if !e.f.demo {
		return nil
	}
	// sarama, which the runners consume with, rather than franz-go's kgo:
	// kgo was 2.9 MB of the binary for this producer alone.
	conf := sarama.NewConfig()
	conf.ClientID = "prism-dev-demo"
	conf.Producer.Flush.Frequency = 5 * time.Millisecond
	p, err := sarama.NewAsyncProducer(e.brokers, conf)
	if err != nil {
		return fmt.Errorf("demo producer: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.onStop("demo producer", func() error { cancel(); <-done; return p.Close() })
	go func() {
		for err := range p.Errors() {
			if ctx.Err() == nil {
				e.log.Warn("demo produce failed", "err", err)
			}
		}
	}()
	gen := demo.New(demo.Options{Seed: uint64(time.Now().UnixNano()), Namespace: devNamespace, IDPrefix: fmt.Sprintf("demo-%x", time.Now().Unix())})
	topics := e.f.topics
	go func() {
		defer close(done)
		t := time.NewTicker(time.Duration(float64(time.Second) / e.f.rate))
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			topic := topics[i%len(topics)]
			id, b := gen.NextBytes(topic)
			select {
			case p.Input() <- &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(id), Value: sarama.ByteEncoder(b)}:
			case <-ctx.Done():
				return
			}
		}
	}()
	e.log.Info("demo producer started", "rate", e.f.rate, "topics", topics)
	return nil
}

func (e *devEnv) demoQueryURL() string {
	return e.gatewayURL + "/v1/mailboxes/" + url.PathEscape(mesh.MailboxID{Namespace: devNamespace, Proxy: devProxyID}.String()) + "/events?limit=5"
}

// awaitGateway waits until the printed curl line works through the gateway:
// it returns events (an answer, with --demo=false).
func (e *devEnv) awaitGateway(ctx context.Context) error {
	client := &http.Client{Timeout: 5 * time.Second}
	return poll(ctx, "events through the gateway at "+e.gatewayURL, func() error {
		select {
		case err := <-e.failed:
			e.failed <- err
			return pollStop{err}
		default:
		}
		resp, err := client.Get(e.demoQueryURL())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return fmt.Errorf("status %d: %w", resp.StatusCode, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		if e.f.demo && len(body.Items) == 0 {
			return errors.New("no events yet")
		}
		return nil
	})
}

func (e *devEnv) printReady(out io.Writer) {
	f := e.f
	kafka := strings.Join(e.brokers, ",")
	if f.kafka == "" {
		kafka += " (embedded)"
	}
	data := e.dataDir
	if f.dataDir == "" {
		data += " (removed on exit)"
	}
	fmt.Fprintf(out, "\nprism dev: the mesh is up on one machine\n")
	fmt.Fprintf(out, "  gateway   %s   %s\n", e.gatewayURL, e.gatewayKind)
	fmt.Fprintf(out, "  admin     %s   (prismctl --admin %s)\n", f.adminAddr, f.adminAddr)
	e.printIdentity(out)
	fmt.Fprintf(out, "  kafka     %s\n", kafka)
	fmt.Fprintf(out, "  runner    %s with sidecar for proxy %s; mailbox %s@%s on %s\n", f.runnerAddr, devProxyID, devNamespace, devProxyID, strings.Join(f.topics, ", "))
	if f.demo {
		fmt.Fprintf(out, "  demo      %g envelopes/s to %s\n", f.rate, strings.Join(f.topics, ", "))
	}
	fmt.Fprintf(out, "  data      %s\n", data)
	fmt.Fprintf(out, "query through the gateway (newest first):\n")
	fmt.Fprintf(out, "  curl -s '%s'\n", e.demoQueryURL())
	fmt.Fprintf(out, "  curl -s '%s/v1/mailboxes/%s@%s/stats'\n", e.gatewayURL, devNamespace, devProxyID)
	fmt.Fprintf(out, "who did what in the admin (namespaces, leases, moves, proxies, members), from %s:\n", devAuditTopic)
	fmt.Fprintf(out, "  curl -s '%s/v1/namespaces/%s/events?limit=5'\n", e.gatewayURL, url.PathEscape(audit.Namespace))
	fmt.Fprintf(out, "add a namespace on a demo topic; its mailbox is NAME@%s:\n", devProxyID)
	fmt.Fprintf(out, "  ./bin/prismctl %snamespace create audit-logs --topic %s\n", e.ctlFlags(), f.topics[0])
	fmt.Fprintf(out, "  curl -s '%s/v1/mailboxes/audit-logs@%s/events?limit=5'\n", e.gatewayURL, devProxyID)
	fmt.Fprintf(out, "prism dev: ready (Ctrl-C stops)\n")
}

// pollStop ends a poll at once with its error.
type pollStop struct{ err error }

func (b pollStop) Error() string { return b.err.Error() }

// poll calls try until it succeeds, returns a pollStop, ctx ends or
// devStartTimeout passes.
func poll(ctx context.Context, what string, try func() error) error {
	deadline := time.Now().Add(devStartTimeout)
	for {
		err := try()
		if err == nil {
			return nil
		}
		var stop pollStop
		if errors.As(err, &stop) {
			return stop.err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: gave up after %s: %w", what, devStartTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
