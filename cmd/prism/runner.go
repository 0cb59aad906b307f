package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/node"
	"github.com/prism-mesh/prism/mailbox/runner"
)

// runnerFlags are the settings of `prism runner`.
type runnerFlags struct {
	mailbox    string
	kafka      string
	topics     []string
	dataDir    string
	grpcAddr   string
	httpAddr   string
	validation string
	maxAge     time.Duration
	maxSize    string
	batchSize  int
	batchWait  time.Duration
	logLevel   string
	logFormat  string
	// controlAddr serves the sidecar's control API; runners without
	// --mailbox take their mailboxes from it.
	controlAddr string
	// tls is the runner's identity, proxy/<proxy-id> (its sidecar's too).
	tls tlsFlags
	// kafkaSec is how the runner reaches Kafka: its own Kafka credentials,
	// not the mesh identity.
	kafkaSec kafkaFlags
	disk     diskFlags
	mem      memoryFlags
	conn     connFlags
	// expectedMailboxes is --expected-mailboxes, deprecated and ignored.
	expectedMailboxes int
	// queryTarget is the query latency ingest gives way to.
	queryTarget time.Duration
	// enablePprof serves net/http/pprof and runtime/metrics on --http-addr;
	// blockRate and mutexFraction turn on the block and mutex profiles,
	// which cost time on every contended lock and channel, so only with it.
	enablePprof   bool
	blockRate     int
	mutexFraction int
	// recoveryRate and recoveryGiveUp bound peer recovery: the bytes per
	// second this runner sends copies at, and how long a mailbox seeding
	// from a copy goes on failing before it reads Kafka instead.
	recoveryRate   string
	recoveryGiveUp time.Duration
	peerRecovery   bool
}

// defaultControlAddr is where the injected sidecar looks for the runner
// (sidecar/inject DefaultOptions().RunnerAddr, helm sidecar.runnerAddr).
const defaultControlAddr = "127.0.0.1:7071"

func (f *runnerFlags) register(cmd *cobra.Command, defaults runnerFlags) {
	fs := cmd.Flags()
	fs.StringVar(&f.mailbox, "mailbox", defaults.mailbox, "mailbox id to host, {namespace}@{proxy_id}")
	fs.StringVar(&f.kafka, "kafka", defaults.kafka, "Kafka bootstrap brokers, comma-separated host:port")
	fs.StringArrayVar(&f.topics, "topic", defaults.topics, "topic to consume (repeatable)")
	fs.StringVar(&f.dataDir, "data-dir", defaults.dataDir, "directory for the runner's store (<data-dir>/store: one Badger database, every mailbox a key prefix in it)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", defaults.grpcAddr, "query listen address: gRPC (MailboxQuery, health) and the HTTP query API on one port, the address the sidecar advertises; mutual TLS (h2 and HTTP/1.1) for gateway, operator and reader identities, gRPC health for any identity (HTTP/1.1 and h2c in plaintext with --insecure)")
	fs.StringVar(&f.httpAddr, "http-addr", defaults.httpAddr, "plaintext HTTP listen address for probes and scrapers: /metrics, /healthz, /readyz (HTTP/1.1 and h2c); the HTTP query API only with --insecure, with TLS it is on --grpc-addr alone")
	fs.StringVar(&f.validation, "validation", "strict", "envelope validation: strict, warn or disabled")
	fs.DurationVar(&f.maxAge, "max-age", 0, "retention: delete events older than this (0 keeps them)")
	fs.StringVar(&f.maxSize, "max-size", "0", "retention: bound on stored envelope bytes, e.g. 10GiB (0 is unbounded)")
	fs.IntVar(&f.batchSize, "batch-size", 0, "records per durable store write (0: default)")
	fs.DurationVar(&f.batchWait, "batch-wait", 0, "longest a partial batch waits for more records (0: default)")
	fs.DurationVar(&f.queryTarget, "query-latency-target", 10*time.Millisecond, "query latency ingest gives way to: while queries are being answered (one within the last second), ingest's decodes and store writes keep to one core fewer than the machine's (at least one), and the runtime gets a P more than the cores unless GOMAXPROCS or a CPU limit sets it, so a query finds a P and a core free; while answers are slower than this, store writes also wait (each at most 250ms, so ingest never starves) and batches decode on one core; negative: ingest never gives way, on all cores")
	fs.BoolVar(&f.enablePprof, "enable-pprof", false, "also serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ and runtime/metrics under /debug/runtime-metrics on --http-addr, as prism admin --enable-pprof; that listener is plaintext and unauthenticated, so only where it is reachable by operators alone")
	fs.IntVar(&f.blockRate, "block-profile-rate", 0, "with --enable-pprof, record one blocking event per this many nanoseconds blocked in the block profile (runtime.SetBlockProfileRate; 1: every event; 0: off)")
	fs.IntVar(&f.mutexFraction, "mutex-profile-fraction", 0, "with --enable-pprof, record one in this many mutex contentions in the mutex profile (runtime.SetMutexProfileFraction; 0: off)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", defaults.logFormat, "log format: json or text")
	fs.StringVar(&f.controlAddr, "control-addr", defaults.controlAddr,
		"serve the sidecar's control API (prism.runner.v1.RunnerControl) here, loopback only, over mutual TLS to this runner's own identity (its sidecar's); without --mailbox it defaults to "+defaultControlAddr+" and the sidecar opens the mailboxes")
	f.tls.register(fs)
	f.kafkaSec.Register(fs)
	f.disk.register(fs, "every mailbox's ingest holds its next batch back, uncommitted, and /readyz answers 503 saying why")
	f.mem.register(fs)
	f.conn.register(fs, "--grpc-addr, --http-addr and --control-addr")
	// Kept so that a runner upgraded with its old command line still
	// starts: the budget no longer depends on how many mailboxes open.
	fs.StringVar(&f.recoveryRate, "recovery-rate", "100MiB", "peer recovery: bytes per second this runner sends, all copies of its mailboxes together, to runners seeding a moved mailbox from them, e.g. 50MiB")
	fs.DurationVar(&f.recoveryGiveUp, "recovery-give-up", 2*time.Minute, "peer recovery: how long a mailbox seeding from a copy of its namespace's previous mailbox goes on failing without progress before it reads its topics from the oldest offset Kafka holds and reports its history incomplete")
	fs.BoolVar(&f.peerRecovery, "peer-recovery", true, "peer recovery: seed a moved mailbox by copying its namespace's previous mailbox from that runner, and serve such copies of this runner's mailboxes; false builds a moved mailbox from Kafka alone (history older than the topics' retention is then missing, and the mailbox says so)")
	fs.IntVar(&f.expectedMailboxes, "expected-mailboxes", 0, "ignored")
	_ = fs.MarkDeprecated("expected-mailboxes", "it is ignored: the runner's mailboxes share one store, sized from --memory-budget alone")
}

func (f *runnerFlags) mailboxConfig() (runner.MailboxConfig, error) {
	mode, err := envelope.ParseMode(f.validation)
	if err != nil {
		return runner.MailboxConfig{}, fmt.Errorf("--validation: %w", err)
	}
	size, err := humanize.ParseBytes(f.maxSize)
	if err != nil {
		return runner.MailboxConfig{}, fmt.Errorf("--max-size: %w", err)
	}
	if f.mailbox == "" || len(f.topics) == 0 {
		return runner.MailboxConfig{}, fmt.Errorf("--mailbox and at least one --topic are required")
	}
	return runner.MailboxConfig{ID: f.mailbox, Topics: f.topics, Mode: mode, MaxAge: f.maxAge, MaxSize: int64(size)}, nil
}

// nodeConfig is the runner process the flags describe: with --mailbox one
// static mailbox, otherwise the control API on --control-addr.
func (f *runnerFlags) nodeConfig(log *slog.Logger, brokers []string) (node.Config, error) {
	cfg := node.Config{
		Runner: runner.Config{DataDir: f.dataDir, Brokers: brokers, BatchSize: f.batchSize, BatchWait: f.batchWait,
			QueryLatencyTarget: f.queryTarget, Pprof: f.enablePprof},
		QueryAddr: f.grpcAddr, HTTPAddr: f.httpAddr, ControlAddr: f.controlAddr, Logger: log,
	}
	if !f.enablePprof && (f.blockRate != 0 || f.mutexFraction != 0) {
		return cfg, errors.New("--block-profile-rate and --mutex-profile-fraction need --enable-pprof, which serves their profiles")
	}
	var err error
	if cfg.Runner.Conn, err = f.conn.bounds(); err != nil {
		return cfg, err
	}
	sc, err := f.kafkaSec.saramaConfig(log)
	if err != nil {
		return cfg, err
	}
	cfg.Runner.Sarama = sc
	if cfg.Runner.MinFree, err = f.disk.watermark(); err != nil {
		return cfg, err
	}
	if cfg.Runner.MemoryBudget, err = f.mem.bytes(); err != nil {
		return cfg, err
	}
	rate, err := humanize.ParseBytes(f.recoveryRate)
	if err != nil || rate == 0 || rate > 1<<62 {
		return cfg, fmt.Errorf("--recovery-rate %q: want a positive size per second, e.g. 100MiB", f.recoveryRate)
	}
	if f.recoveryGiveUp <= 0 {
		return cfg, fmt.Errorf("--recovery-give-up: want a positive duration, got %v", f.recoveryGiveUp)
	}
	cfg.Runner.RecoveryRate, cfg.Runner.RecoveryGiveUp, cfg.Runner.NoPeerRecovery = int64(rate), f.recoveryGiveUp, !f.peerRecovery
	if f.mailbox == "" {
		if cfg.ControlAddr == "" {
			cfg.ControlAddr = defaultControlAddr
		}
		return cfg, nil
	}
	if f.controlAddr != "" {
		return cfg, fmt.Errorf("--control-addr: not with --mailbox (a static mailbox has no lease); leave --mailbox out to let the sidecar open mailboxes")
	}
	mc, err := f.mailboxConfig()
	if err != nil {
		return cfg, err
	}
	cfg.Mailbox = &mc
	return cfg, nil
}

// queryProcs is the GOMAXPROCS prism runner runs with, given the runtime's
// default procs on a machine of cpus, and the lanes its ingest keeps to while
// queries are answered (0: the governor's default, GOMAXPROCS-1). Go's
// scheduler has no priorities: with a P per core, a query handler woken while
// ingest and Badger's own goroutines (its writer, memtable flushes,
// compactions) hold every P waits for one of them to be preempted, 10 ms,
// and the network poller is not looked at meanwhile. One P more than the
// cores, with ingest's decodes and writes kept to cores-1 lanes, leaves a P
// idle in the poller that takes the handler at once; the kernel then shares
// the cores among the threads, favouring the one just woken. Only with the
// governor on, GOMAXPROCS not set in the environment, and no CPU limit
// (cgroup quota) holding the runtime below the cores: under a quota a P
// beyond it spends the quota faster and the process is throttled for the
// rest of each period. Once set, the runtime no longer follows a CPU limit
// that changes while the runner runs; a restart picks the new one up.
func queryProcs(target time.Duration, envSet bool, procs, cpus int) (gomaxprocs, lanes int) {
	if target < 0 || envSet || procs != cpus {
		return procs, 0
	}
	return procs + 1, max(1, procs-1)
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func runnerCommand() *cobra.Command {
	var f runnerFlags
	cmd := &cobra.Command{
		Use:   "runner",
		Short: "Consume a mailbox's Kafka topics into its store and serve queries",
		Long: `runner hosts mailboxes: for each it consumes its topics from --kafka with consumer group = mailbox id,
stores envelopes in the runner's one Badger database under --data-dir (committing offsets only after
durable writes),
dead-letters invalid ones to <topic>.dlq, and serves the query API over gRPC and HTTP, both on
--grpc-addr (the address routes point at) and HTTP alone on --http-addr.

With --mailbox and --topic it hosts that one mailbox, without a lease. Without --mailbox it serves
the control API on --control-addr (default ` + defaultControlAddr + `) and hosts what the lease sidecar
(prism sidecar) opens there, consuming and serving each mailbox only under a held lease's epoch.
With --tls-ca, --tls-cert and --tls-key (the certificate of proxy/<proxy-id>, the same files as the
sidecar's) the query port serves mutual TLS to gateway, operator and reader identities and the control
API only to the runner's own identity; --http-addr then keeps only the probes and /metrics, in plaintext.
--insecure serves everything in plaintext without authentication.
SIGTERM or SIGINT stops fetching, flushes, commits and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			brokers := splitBrokers(f.kafka)
			if len(brokers) == 0 {
				return fmt.Errorf("--kafka: no brokers")
			}
			cfg, err := f.nodeConfig(log, brokers)
			if err != nil {
				return err
			}
			if cfg.TLS, err = f.tls.load(log); err != nil {
				return err
			}
			f.mem.apply(log, cfg.Runner.MemoryBudget)
			procs, lanes := queryProcs(cfg.Runner.QueryLatencyTarget, os.Getenv("GOMAXPROCS") != "", runtime.GOMAXPROCS(0), runtime.NumCPU())
			if lanes > 0 {
				runtime.GOMAXPROCS(procs)
				cfg.Runner.IngestLanes = lanes
				log.Info("a P more than the cores, so a query handler finds one idle beside ingest", "GOMAXPROCS", procs, "ingest_lanes", lanes)
			}
			runtime.SetBlockProfileRate(f.blockRate)
			runtime.SetMutexProfileFraction(f.mutexFraction)
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			n, err := node.Start(cfg)
			if err != nil {
				return err
			}
			<-ctx.Done()
			log.Info("signal received; draining every mailbox")
			return n.Close()
		},
	}
	f.register(cmd, runnerFlags{kafka: "127.0.0.1:9092", dataDir: "data", grpcAddr: ":9090", httpAddr: ":8080", logFormat: "json"})
	cmd.AddCommand(runnerRebuildCommand())
	return cmd
}

func runnerRebuildCommand() *cobra.Command {
	var (
		kafka, dataDir, logLevel, logFormat string
		mailboxes                           []string
		all, oldLayout                      bool
		kafkaSec                            kafkaFlags
	)
	cmd := &cobra.Command{
		Use:   "rebuild (--mailbox ID ... | --all | --old-layout)",
		Short: "Drop mailboxes' stored data and reset their consumer groups, so their next open re-ingests them from Kafka",
		Long: `rebuild repairs a mailbox that answers other than Kafka holds, or whose store an older version wrote: it
drops the mailbox's data under --data-dir and deletes its consumer group (its committed offsets), so the next
open of the mailbox, by prism runner --mailbox or by the sidecar, re-ingests it from the earliest offset
Kafka retains. Records already gone from Kafka by its retention are gone from the rebuilt mailbox too.

A mailbox in the runner's store (<data-dir>/store) is dropped from it, which needs the runner stopped: its
store open in a running runner is refused and left as it is. A mailbox whose store an older version left
(<data-dir>/mailboxes/<id>, one Badger per mailbox, which a runner refuses to open as old_layout) loses that
directory, and that works while the runner serves its other mailboxes: --old-layout does it for every such
directory, the upgrade's step. A consumer group with live members is refused either way. The group is reset
before the data is dropped, so an interrupted rebuild never leaves an empty mailbox that resumes past its
records.

A damaged runner store (every open failing with reason damaged) cannot be opened to drop anything: move
<data-dir>/store aside (never delete it before you know why) with the runner stopped, rebuild every mailbox
it held with --mailbox, and start the runner: it creates an empty store and re-ingests them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			if n := btoi(all) + btoi(oldLayout) + btoi(len(mailboxes) > 0); n != 1 {
				return errors.New("give one of --mailbox (repeatable), --all or --old-layout")
			}
			brokers := splitBrokers(kafka)
			if len(brokers) == 0 {
				return errors.New("--kafka: no brokers")
			}
			sc, err := kafkaSec.saramaConfig(log)
			if err != nil {
				return err
			}
			ids := mailboxes
			if all || oldLayout {
				list := runner.StoredIDs
				if oldLayout {
					list = runner.OldLayoutIDs
				}
				if ids, err = list(dataDir); err != nil {
					return err
				}
				if len(ids) == 0 {
					log.Info("no mailbox store to rebuild", "data_dir", dataDir)
					return nil
				}
			}
			done, err := runner.Rebuild(runner.RebuildConfig{DataDir: dataDir, Brokers: brokers, Sarama: sc, Logger: log}, ids)
			for _, id := range done {
				fmt.Fprintf(cmd.OutOrStdout(), "rebuilt %s: re-ingested from Kafka on its next open\n", id)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&mailboxes, "mailbox", nil, "mailbox id to rebuild (repeatable)")
	fs.BoolVar(&all, "all", false, "rebuild every mailbox with data under --data-dir: in the runner's store (the runner stopped) and in stores of an older version")
	fs.BoolVar(&oldLayout, "old-layout", false, "rebuild every mailbox whose store an older version left under --data-dir (<data-dir>/mailboxes); the runner may be running")
	fs.StringVar(&kafka, "kafka", "127.0.0.1:9092", "Kafka bootstrap brokers, comma-separated host:port")
	fs.StringVar(&dataDir, "data-dir", "data", "the runner's --data-dir")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&logFormat, "log-format", "text", "log format: json or text")
	kafkaSec.Register(fs)
	return cmd
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
