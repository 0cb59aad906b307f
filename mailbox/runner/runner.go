// Package runner hosts a set of mailboxes, each a store (a key prefix of
// the runner's one Badger database) fed by its own ingest, and serves them:
// the query APIs, /metrics, /healthz, /readyz and gRPC health. Mailboxes are
// opened and closed by id while the runner runs, which is what the sidecar's
// control API (mailbox/control) drives; `prism runner` opens one from its
// flags.
//
// The runner is a host, not a lifecycle: which state each mailbox is in and
// which call it may take is mailbox/control's (its lifecycle.go), and the
// runner does what it is told, refusing only what does not fit what it
// holds. The files, one part each:
//   - runner.go: the configuration, New and Close.
//   - registry.go: what is hosted by id (served mailboxes, prepared stores,
//     open failures, recovery peers) and the turns the calls about one id take.
//   - host.go: a mailbox's store and ingest: Prepare, Open, Drain, CloseMailbox.
//   - stores.go: opening the runner's store and a mailbox's view of it.
//   - lease.go: the lease guard, the epoch and deadline a mailbox is served
//     and written under.
//   - serve.go, authz.go: the query port, the HTTP port and health, and who
//     may call what on them.
//   - recovery.go, status.go, metrics.go, rebuild.go: peer recovery, what the
//     runner reports of each mailbox, and the offline rebuild.
package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/internal/lazy"
	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/query"
	"github.com/prism-mesh/prism/mailbox/recovery"
	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/pki"
)

// Config of a runner. Brokers and DataDir are shared by its mailboxes.
type Config struct {
	DataDir string
	Brokers []string

	BatchSize int            // ingest records per durable write; 0 = ingest default
	BatchWait time.Duration  // 0 = ingest default
	Sarama    *sarama.Config // nil = ingest.SaramaConfig()

	RetentionInterval time.Duration // default 1m
	// MinFree is the free-space watermark of DataDir's filesystem (zero:
	// none). Below it every mailbox's ingest holds its next batch back,
	// uncommitted, and /readyz answers 503 saying so, until space returns
	// (diskfree.Guard); DiskCheckInterval is how often a held ingest looks
	// again (default 1s).
	MinFree           diskfree.Watermark
	DiskCheckInterval time.Duration
	ShutdownTimeout   time.Duration // bound on draining ingest and in-flight queries; default 10s
	// MemoryBudget is the bytes the runner may use (0: no budget). Half of
	// it is for the Badger memtables and caches of the runner's store, one
	// database every mailbox shares (store.MemoryFor(budget, 1)), so it does
	// not depend on how many mailboxes open or in what order.
	MemoryBudget int64

	Registry *prometheus.Registry // nil = a new one with Go and process collectors
	Logger   *slog.Logger         // nil = slog.Default()
	Clock    clock.WithTicker     // retention's time and ticks, and the health ticks; nil = clock.RealClock{}
	// Ready, when set, replaces the runner's own readiness check (/readyz,
	// gRPC health): a runner driven by the sidecar's control API is ready
	// by that API's rules, not by hosting at least one mailbox.
	Ready func() error
	// TLS, when set, makes the query port serve mutual TLS to gateway,
	// operator and reader identities (gRPC health: any identity of the
	// trust domain), and takes the query API off the plaintext HTTP port,
	// which keeps /metrics, /healthz and /readyz for probes and scrapers.
	// nil serves both ports in plaintext, unauthenticated.
	TLS *pki.Source
	// MaxStreams bounds the concurrent requests and gRPC calls on one
	// HTTP/2 connection (default 1000).
	MaxStreams uint32
	// Conn bounds every connection to the query and HTTP ports, and to the
	// control API (mailbox/node): the handshake, the idle time without a
	// request (clients reconnect when they next call) and the ping rate
	// (internal/connlimit; zero fields take its defaults). Envoy
	// health-checks every runner every few seconds, so its connections
	// never idle out.
	Conn connlimit.Bounds
	// QueryLatencyTarget is the query latency every mailbox's ingest gives
	// way to (ingest.Governor): while queries are answered, ingest's decodes
	// and store writes keep to GOMAXPROCS-1 cores (at least one); while
	// answers are slower, store writes also wait (at most QueryHoldMax each,
	// the floor) and batches decode on one core. 0 = 10ms; negative: ingest
	// never gives way.
	QueryLatencyTarget time.Duration
	// QueryHoldMax is the longest one store write waits for queries to be
	// fast again; 0 = the ingest default (250ms).
	QueryHoldMax time.Duration
	// IngestLanes is how many of ingest's decodes and store writes run at
	// once while queries are answered (ingest.GovernorConfig.Lanes);
	// 0 = GOMAXPROCS-1, at least one. prism runner sets it to one fewer than
	// the cores when it gives the runtime a P more than the cores, so that a
	// woken query handler finds an idle P.
	IngestLanes int
	// RecoveryRate bounds the bytes per second this runner sends, all
	// copies together, to runners seeding mailboxes from its own by peer
	// recovery (0: recovery.DefaultRate, 100 MiB/s).
	RecoveryRate int64
	// RecoveryGiveUp is how long a mailbox seeding from a copy goes on
	// failing without progress before it falls back to Kafka
	// (0: recovery.DefaultGiveUp).
	RecoveryGiveUp time.Duration
	// NoPeerRecovery turns peer recovery off: the runner serves no copy, and
	// a mailbox opened with a source reads its topics from Kafka at once
	// (and reports its history incomplete, since a copy existed).
	NoPeerRecovery bool
	// Pprof also serves Go's runtime profiles and runtime/metrics under
	// /debug/ on the plaintext HTTP port (debughttp.With).
	Pprof bool
}

// MailboxConfig names a mailbox, its topics and its store limits.
type MailboxConfig struct {
	ID      string
	Topics  []string
	Mode    envelope.Mode // "" = strict
	MaxAge  time.Duration // 0 = keep forever
	MaxSize int64         // bytes of envelopes; 0 = unbounded
	// DeadLetterTopic receives every poison record; "" = each record's
	// topic with ingest.DLQSuffix.
	DeadLetterTopic string
	// Epoch is the lease epoch the mailbox is served under from its first
	// query on, so a lease-driven mailbox is never visible without one.
	Epoch uint64
	// Recover, when set, is the live mailbox to seed this one from by peer
	// recovery (recovery.go), taken only while this one holds nothing.
	Recover *RecoverySource
	// HistoryBefore, when set, is the mailbox that held the namespace's
	// history before this one: opened with nothing stored and no copy, this
	// one records its history incomplete (recovery.go).
	HistoryBefore string
}

// ErrNotOpen is returned for a mailbox id the runner does not host.
var ErrNotOpen = errors.New("mailbox not open")

// Runner hosts mailboxes by id.
type Runner struct {
	cfg       Config
	log       *slog.Logger
	reg       *prometheus.Registry
	ingestM   *ingest.Metrics
	queryM    *query.Metrics
	governor  *ingest.Governor // nil: ingest never gives way to queries
	health    *health.Server
	grpc      *grpc.Server
	query     *http.Server // gRPC and HTTP on the advertised address
	http      *http.Server
	stopWatch context.CancelFunc
	disk      *diskfree.Guard // nil: no watermark
	watchDone chan struct{}

	// kafka is the Kafka side every mailbox's ingest shares (one client,
	// the dead-letter topics checked once): the mailboxes all reach
	// cfg.Brokers with cfg.Sarama. Closed after every ingest.
	kafka *ingest.Kafka

	// registry is what the runner hosts, by id (registry.go).
	registry

	openFailures *prometheus.CounterVec

	// db is the runner's one store, every mailbox a prefix in it, opened
	// by the first Open or Prepare and again by a later one while it fails
	// (each mailbox's open failing with it): the Opens and Prepares that
	// waited on a failing try take its error rather than each trying again.
	db lazy.Value[*store.DB]
	// dbFailed says the last try to open db failed; only openStoreDB uses
	// it, which db runs one try at a time.
	dbFailed bool

	// openDB opens the runner's store (store.OpenDB) and openView a
	// mailbox in it (DB.Open); tests hold them.
	openDB   func(store.DBOptions) (*store.DB, error)
	openView func(*store.DB, store.Options) (*store.Store, error)

	// recoverySrv serves copies of the mailboxes held here (recovery.go).
	recoverySrv *recovery.Server
}

// New makes a runner hosting no mailbox yet.
func New(cfg Config) (*Runner, error) {
	if cfg.DataDir == "" || len(cfg.Brokers) == 0 {
		return nil, errors.New("runner: data dir and brokers are required")
	}
	if cfg.RetentionInterval <= 0 {
		cfg.RetentionInterval = time.Minute
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = 1000
	}
	cfg.Conn = cfg.Conn.WithDefaults()
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	r := &Runner{
		cfg:      cfg,
		log:      cfg.Logger,
		reg:      cfg.Registry,
		ingestM:  ingest.NewMetrics(cfg.Registry),
		kafka:    ingest.NewKafka(cfg.Brokers, cfg.Sarama),
		queryM:   query.NewMetrics(cfg.Registry),
		health:   health.NewServer(),
		registry: newRegistry(),
		openDB:   store.OpenDB,
		openView: (*store.DB).Open,
		openFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_open_failures_total",
			Help: "Mailbox store opens that failed, by reason: damaged (a file of the runner's store is unreadable: every mailbox's open fails; move the store aside), old_layout (a mailbox's store written by an older version; rebuild it with prism runner rebuild), no_space, other.",
		}, []string{"reason"}),
	}
	r.recoverySrv = recovery.NewServer(recovery.ServerConfig{Source: r, Rate: cfg.RecoveryRate, Clock: cfg.Clock, Logger: cfg.Logger})
	for _, reason := range []string{"damaged", "old_layout", "no_space", "other"} {
		r.openFailures.WithLabelValues(reason)
	}
	cfg.Registry.MustRegister(storeCollector{r}, r.openFailures)
	if cfg.QueryLatencyTarget >= 0 {
		r.governor = ingest.NewGovernor(ingest.GovernorConfig{Target: cfg.QueryLatencyTarget, MaxHold: cfg.QueryHoldMax, Lanes: cfg.IngestLanes}, cfg.Registry)
		r.queryM.ReportTo(r.governor)
	}
	disk, err := diskfree.New(diskfree.Config{Name: "runner data dir", Dir: cfg.DataDir, Watermark: cfg.MinFree,
		Interval: cfg.DiskCheckInterval, Clock: cfg.Clock, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	if r.cfg.Ready == nil {
		r.cfg.Ready = r.Ready
	}
	if disk != nil {
		r.disk = disk
		cfg.Registry.MustRegister(disk.Collector("prism_mailbox"))
		// A runner short of space is not ready whoever judges the rest:
		// its mailboxes serve what they hold but stored nothing since.
		ready := r.cfg.Ready
		r.cfg.Ready = func() error {
			if err := r.DiskPressure(); err != nil {
				return err
			}
			return ready()
		}
	}
	r.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return r, nil
}

// validID keeps a mailbox id usable as one directory name (OldDir).
func validID(id string) error {
	if !mesh.PathSafe(id) {
		return fmt.Errorf("mailbox id %q: must be non-empty, not . or .., without / \\ or NUL", id)
	}
	return nil
}

// StoreDir is where the runner's store lives under dataDir: one Badger
// database holding every mailbox of the runner, each under a key prefix.
func StoreDir(dataDir string) string { return filepath.Join(dataDir, "store") }

// maxDirName is the longest file name Linux file systems take (NAME_MAX).
const maxDirName = 255

// idFile, in the store directory of a mailbox whose id is too long to be
// its directory's name, holds the id, so OldLayoutIDs still finds it.
const idFile = "prism-mailbox-id"

// OldDir is where versions before the runner's one store kept the store of
// mailbox id under dataDir, a Badger database per mailbox: the id, escaped,
// as the directory's name. A namespace and a proxy id may each be 253
// bytes, so an id can be longer than a file name may be; such a directory
// is named by the id's start and a hash of the whole id. A runner refuses
// to open a mailbox that still has one (ErrOldLayout): its Kafka offsets
// are committed, so opening it empty in the runner's store would lose its
// history; prism runner rebuild drops the directory and the offsets.
func OldDir(dataDir, id string) string {
	return filepath.Join(dataDir, "mailboxes", dirName(id))
}

func dirName(id string) string {
	name := url.PathEscape(id)
	if len(name) <= maxDirName {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	tag := hex.EncodeToString(sum[:16])
	return name[:maxDirName-len(tag)-1] + "~" + tag
}

// Close stops every mailbox's ingest (flush, commit), then the servers, then
// the mailboxes' stores, then the runner's Kafka client and store.
func (r *Runner) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	mbs := make([]*mailbox, 0, len(r.mailboxes))
	for _, mb := range r.mailboxes {
		mbs = append(mbs, mb)
	}
	prepared := r.prepared
	r.prepared = map[string]*store.Store{}
	r.mu.Unlock()
	// An Open or Prepare in flight sees closed when it ends and closes what it opened.
	r.opens.Wait()
	if r.stopWatch != nil {
		r.stopWatch()
		<-r.watchDone
	}
	r.health.Shutdown()

	var wg sync.WaitGroup
	ingestErrs := make([]error, len(mbs))
	for i, mb := range mbs {
		wg.Go(func() { ingestErrs[i] = mb.closeIngest() })
	}
	wg.Wait()
	errs := ingestErrs
	if r.http != nil {
		// Shutting the HTTP servers down waits for in-flight RPCs too: gRPC
		// is served through them, and GracefulStop would cut those streams.
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
		var wg sync.WaitGroup
		shutdownErrs := make([]error, 2)
		for i, s := range []*http.Server{r.query, r.http} {
			wg.Go(func() { shutdownErrs[i] = s.Shutdown(ctx) })
		}
		wg.Wait()
		cancel()
		errs = append(errs, shutdownErrs...)
		r.grpc.Stop()
	}
	r.mu.Lock()
	r.mailboxes = map[string]*mailbox{}
	r.mu.Unlock()
	for _, mb := range mbs {
		errs = append(errs, r.closeMailbox(mb))
	}
	// Before the store: the snapshots held for copies read it.
	r.recoverySrv.Close()
	for id, st := range prepared {
		if err := st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close prepared %s: %w", id, err))
		}
	}
	// Every ingest is closed, and no Open can start one (closed, and opens waited for).
	errs = append(errs, r.kafka.Close())
	// Last: every mailbox's Store is closed, so no read or write is left on
	// it; no Open or Prepare can open it again (closed, and opens waited for).
	if err := r.db.Close((*store.DB).Close); err != nil {
		errs = append(errs, fmt.Errorf("close the runner store: %w", err))
	}
	return errors.Join(errs...)
}
