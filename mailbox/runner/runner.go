// Package runner hosts a set of mailboxes (each a store, a key prefix of the
// runner's one Badger database, fed by its own ingest)
// and serves them: the query APIs, /metrics, /healthz, /readyz and gRPC health.
// Mailboxes are opened and closed by id while the runner runs, which is what
// the sidecar's control API drives; `prism runner` opens one from its flags.
package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/internal/debughttp"
	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/internal/lazy"
	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/query"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/recovery"
	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
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

// ErrDeadlinePassed refuses to move a mailbox's lease deadline once it has
// passed (SetValidFor).
var ErrDeadlinePassed = errors.New("lease deadline passed")

type mailbox struct {
	cfg MailboxConfig
	// store and ingest are swapped once, by a recovery that completes
	// (recovery.go): the copy's store replaces the empty one, and ingest,
	// nil until then, starts. Without recovery they are set before the
	// mailbox is published.
	store  atomic.Pointer[store.Store]
	reads  readGuard
	ingest atomic.Pointer[ingest.Ingester]
	epoch  atomic.Uint64
	// recovery is the peer recovery seeding the mailbox; nil when none
	// was asked or the mailbox held data of its own.
	recovery     *recovering
	stopRetain   context.CancelFunc
	retainExited chan struct{}
	// until is the deadline of the lease it is served under (SetValidFor);
	// nil: none, served until closed.
	until atomic.Pointer[time.Time]
}

// expired reports whether mb's lease deadline has passed at now.
func (mb *mailbox) expired(now time.Time) bool {
	until := mb.until.Load()
	return until != nil && !now.Before(*until)
}

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

	// mu guards the maps, never a store's opening or an ingest's start:
	// Open and Prepare do those outside it (see begin), so queries to every
	// mailbox answer while another opens.
	mu        sync.RWMutex
	mailboxes map[string]*mailbox
	prepared  map[string]*store.Store  // opened ahead of Open; not served
	opening   map[string]chan struct{} // ids Open or Prepare is opening; closed when done
	opens     sync.WaitGroup           // the Opens and Prepares in flight, which Close waits for
	closed    bool
	// failed holds why each mailbox's last store open failed, until one
	// succeeds or the mailbox is discarded: /readyz and a gauge report it.
	failed map[string]error

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

	// recoverySrv serves copies of the mailboxes held here (recovery.go);
	// allowed, guarded by mu, is who may fetch each (AllowRecovery).
	recoverySrv *recovery.Server
	allowed     map[string][]string
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
		cfg:       cfg,
		log:       cfg.Logger,
		reg:       cfg.Registry,
		ingestM:   ingest.NewMetrics(cfg.Registry),
		kafka:     ingest.NewKafka(cfg.Brokers, cfg.Sarama),
		queryM:    query.NewMetrics(cfg.Registry),
		health:    health.NewServer(),
		mailboxes: map[string]*mailbox{},
		prepared:  map[string]*store.Store{},
		opening:   map[string]chan struct{}{},
		failed:    map[string]error{},
		openDB:    store.OpenDB,
		openView:  (*store.DB).Open,
		allowed:   map[string][]string{},
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

// Prepare opens mailbox mc's store ahead of Open, which then only starts
// consuming and serving: a lease-driven mailbox waits for the disk before
// its lease is acquired, not after. A prepared mailbox is neither consumed
// nor served; preparing it again does nothing.
func (r *Runner) Prepare(mc MailboxConfig) error {
	if err := validID(mc.ID); err != nil {
		return err
	}
	r.mu.Lock()
	if err := r.begin(mc.ID); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("prepare %s: %w", mc.ID, err)
	}
	_, prepared := r.prepared[mc.ID]
	_, open := r.mailboxes[mc.ID]
	if prepared || open {
		r.end(mc.ID)
		r.mu.Unlock()
		if open {
			return fmt.Errorf("prepare %s: already open", mc.ID)
		}
		return nil
	}
	r.mu.Unlock()
	st, err := r.openMailboxStore(mc)
	r.mu.Lock()
	closed := r.closed
	if err == nil && !closed {
		r.prepared[mc.ID] = st
	}
	r.mu.Unlock()
	switch {
	case err != nil:
		err = fmt.Errorf("prepare %s: %w", mc.ID, err)
	case closed:
		// Before end: Close waits for this store too.
		err = errors.Join(fmt.Errorf("prepare %s: runner closed", mc.ID), st.Close())
	}
	r.mu.Lock()
	r.end(mc.ID)
	r.mu.Unlock()
	return err
}

// openMailboxStore opens mailbox mc in the runner's store, opening that
// first if no open has yet, and contains a failure to the mailboxes: a panic
// in the open is its error, never the process's, and a failure is recorded
// (failed, the metric, the log) for /readyz while the runner's other
// mailboxes go on serving. A failure of the runner's store is every
// mailbox's, each reported with it, so the sidecar reports them all
// open_failed and the admin moves them. The caller sees the error; the
// sidecar retries with backoff, and its next open tries the store again.
func (r *Runner) openMailboxStore(mc MailboxConfig) (st *store.Store, err error) {
	func() {
		defer func() {
			if p := recover(); p != nil {
				st, err = nil, fmt.Errorf("%w: panic opening mailbox %s: %v", store.ErrDamaged, mc.ID, p)
			}
		}()
		st, err = r.openInStore(mc)
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.failed, mc.ID)
		return st, nil
	}
	reason := openFailureReason(err)
	r.failed[mc.ID] = err
	r.openFailures.WithLabelValues(reason).Inc()
	r.log.Error("mailbox store failed to open", "mailbox_id", mc.ID, "reason", reason, "err", err)
	return nil, err
}

func (r *Runner) openInStore(mc MailboxConfig) (*store.Store, error) {
	old := OldDir(r.cfg.DataDir, mc.ID)
	switch _, err := os.Stat(old); {
	case err == nil:
		return nil, fmt.Errorf("%w: %s holds the mailbox's store of an older version (a Badger per mailbox), whose Kafka offsets are committed: "+
			"opened empty here it would never get its history back; drop it and re-ingest it with prism runner rebuild --mailbox %s (or --old-layout for every such store)",
			store.ErrOldLayout, old, mc.ID)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("look for an older store of the mailbox: %w", err)
	}
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		return nil, err
	}
	return r.openView(db, r.storeOptions(mc))
}

func (r *Runner) storeOptions(mc MailboxConfig) store.Options {
	return store.Options{ID: mc.ID, MaxAge: mc.MaxAge, MaxSize: mc.MaxSize, Logger: r.log.With("mailbox_id", mc.ID)}
}

// openStoreDB is r.db's open of the runner's store: a panic in it (a
// damaged store) is its error, and a failure is logged once a try, not once
// for each of the thousand mailbox opens that may take its answer.
func (r *Runner) openStoreDB() (*store.DB, error) {
	dir := StoreDir(r.cfg.DataDir)
	db, err := func() (db *store.DB, err error) {
		defer func() {
			if p := recover(); p != nil {
				db, err = nil, fmt.Errorf("%w: panic opening %s: %v", store.ErrDamaged, dir, p)
			}
		}()
		return r.openDB(store.DBOptions{Dir: dir, Memory: store.MemoryFor(r.cfg.MemoryBudget, 1), Logger: r.log})
	}()
	if err != nil {
		r.dbFailed = true
		r.log.Error("the runner's store failed to open: every mailbox's open fails with it until one opens it", "dir", dir, "reason", openFailureReason(err), "err", err)
		return nil, fmt.Errorf("runner store %s: %w", dir, err)
	}
	if r.dbFailed {
		r.log.Info("the runner's store opened after failing", "dir", dir)
	}
	r.dbFailed = false
	return db, nil
}

// openFailureReason is the reason label, /readyz's and the log's, of a
// store open that failed with err: each names what an operator does next
// (rebuild a damaged store or one of the old layout, free space).
func openFailureReason(err error) string {
	switch {
	case errors.Is(err, store.ErrDamaged):
		return "damaged"
	case errors.Is(err, store.ErrOldLayout):
		return "old_layout"
	case errors.Is(err, syscall.ENOSPC):
		return "no_space"
	}
	return "other"
}

// OpenFailures says, for each mailbox whose last store open failed, why.
func (r *Runner) OpenFailures() map[string]error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return maps.Clone(r.failed)
}

// errRunnerClosed refuses an Open or Prepare once Close has begun.
var errRunnerClosed = errors.New("runner closed")

// begin marks id as being opened (its store, its ingest) outside r.mu, first
// waiting for an Open or Prepare of id already in flight, so that the calls
// for one id still take turns as they did under r.mu. r.mu is held on entry
// and on return; end unmarks id. Close waits for every id begun.
func (r *Runner) begin(id string) error {
	r.settle(id)
	if r.closed {
		return errRunnerClosed
	}
	r.opening[id] = make(chan struct{})
	r.opens.Add(1)
	return nil
}

// settle waits, r.mu held on entry and on return, until no Open or Prepare
// of id is in flight, so a call about id (close, drain, epoch) acts on what
// the one in flight leaves rather than on nothing.
func (r *Runner) settle(id string) {
	for {
		ch, busy := r.opening[id]
		if !busy {
			return
		}
		r.mu.Unlock()
		<-ch
		r.mu.Lock()
	}
}

// end unmarks id, r.mu held.
func (r *Runner) end(id string) {
	close(r.opening[id])
	delete(r.opening, id)
	r.opens.Done()
}

// Discard closes the store of a prepared mailbox that will not be opened.
// Its data stays in the runner's store, as its consumer group's offsets stay
// in Kafka: a later open of the mailbox resumes where they both are.
func (r *Runner) Discard(id string) error {
	r.mu.Lock()
	r.settle(id)
	st, ok := r.prepared[id]
	delete(r.prepared, id)
	delete(r.failed, id)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	if err := st.Close(); err != nil {
		return fmt.Errorf("discard %s: %w", id, err)
	}
	return nil
}

// Open starts consuming mailbox mc's topics into its store (opening the
// store unless Prepare did) and serves it. Opening a mailbox that is already
// open is an error: its config might differ.
func (r *Runner) Open(mc MailboxConfig) error {
	if err := validID(mc.ID); err != nil {
		return err
	}
	if len(mc.Topics) == 0 {
		return fmt.Errorf("open %s: no topics", mc.ID)
	}
	r.mu.Lock()
	if err := r.begin(mc.ID); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("open %s: %w", mc.ID, err)
	}
	if _, ok := r.mailboxes[mc.ID]; ok {
		r.end(mc.ID)
		r.mu.Unlock()
		return fmt.Errorf("open %s: already open", mc.ID)
	}
	st := r.prepared[mc.ID]
	delete(r.prepared, mc.ID)
	r.mu.Unlock()
	mb, err := r.start(mc, st)
	r.mu.Lock()
	closed := r.closed
	if err == nil && !closed {
		r.mailboxes[mc.ID] = mb
	}
	r.mu.Unlock()
	if err == nil && closed {
		// Before end: Close waits for this mailbox too.
		err = errors.Join(fmt.Errorf("open %s: runner closed", mc.ID), r.closeMailbox(mb))
	}
	r.mu.Lock()
	r.end(mc.ID)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	r.log.Info("mailbox opened", "mailbox_id", mc.ID, "epoch", mc.Epoch, "topics", mc.Topics, "max_age", mc.MaxAge, "max_size", mc.MaxSize)
	return nil
}

// start opens mailbox mc's store unless st is the prepared one, starts its
// ingest and retention, and returns it unpublished.
func (r *Runner) start(mc MailboxConfig, st *store.Store) (*mailbox, error) {
	if st == nil {
		var err error
		if st, err = r.openMailboxStore(mc); err != nil {
			return nil, fmt.Errorf("open %s: %w", mc.ID, err)
		}
	}
	icfg := ingest.Config{
		MailboxID: mc.ID, Kafka: r.kafka, Topics: mc.Topics, Mode: mc.Mode, DeadLetterTopic: mc.DeadLetterTopic,
		BatchSize: r.cfg.BatchSize, BatchWait: r.cfg.BatchWait,
		DrainTimeout: r.cfg.ShutdownTimeout, Logger: r.log, Metrics: r.ingestM, Governor: r.governor,
	}
	if r.disk != nil {
		icfg.Space = r.disk
	}
	ctx, cancel := context.WithCancel(context.Background())
	mb := &mailbox{cfg: mc, stopRetain: cancel, retainExited: make(chan struct{})}
	mb.store.Store(st)
	mb.epoch.Store(mc.Epoch)
	rec, err := r.recoveryFor(mc, st)
	if err != nil {
		cancel()
		_ = st.Close()
		return nil, fmt.Errorf("open %s: %w", mc.ID, err)
	}
	if rec != nil {
		// Consumed only once the copy is in: recover starts ingest and
		// retention on the copy's store.
		mb.recovery = rec
		go func() {
			defer close(mb.retainExited)
			r.recover(ctx, mb, icfg)
		}()
		return mb, nil
	}
	if err := r.markHistoryBefore(mc, st); err != nil {
		cancel()
		_ = st.Close()
		return nil, fmt.Errorf("open %s: %w", mc.ID, err)
	}
	icfg.Start = seedPositions(st)
	ing, err := ingest.Start(icfg, leaseWriter{mb: mb, clock: r.cfg.Clock})
	if err != nil {
		cancel()
		_ = st.Close()
		return nil, fmt.Errorf("open %s: %w", mc.ID, err)
	}
	mb.ingest.Store(ing)
	go func() {
		defer close(mb.retainExited)
		r.retain(ctx, mb)
	}()
	return mb, nil
}

// retain runs mb's retention until ctx is done.
func (r *Runner) retain(ctx context.Context, mb *mailbox) {
	if mb.cfg.MaxAge > 0 || mb.cfg.MaxSize > 0 {
		mb.store.Load().RunRetention(ctx, r.cfg.RetentionInterval, r.cfg.Clock)
	}
}

// closeIngest stops mb's ingest, if it has one: a mailbox being recovered
// first ends its recovery, which may start one meanwhile (an import cut
// there resumes on the next open).
func (mb *mailbox) closeIngest() error {
	if mb.recovery != nil {
		mb.stopRetain()
		<-mb.retainExited
	}
	if ing := mb.ingest.Load(); ing != nil {
		return ing.Close()
	}
	return nil
}

// consuming reports whether mb's ingest is in a group session.
func (mb *mailbox) consuming() bool {
	ing := mb.ingest.Load()
	return ing != nil && ing.Consuming()
}

// CloseMailbox stops serving mailbox id at once (queries get NotFound from
// the moment it returns from the map), then stops consuming it, flushing and
// committing what was fetched, and closes its store. Serving stops first so a
// sidecar fencing a lost lease never has this runner answer for it again.
func (r *Runner) CloseMailbox(id string) error {
	r.mu.Lock()
	r.settle(id)
	mb, ok := r.mailboxes[id]
	delete(r.mailboxes, id)
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("close %s: %w", id, ErrNotOpen)
	}
	return r.closeMailbox(mb)
}

func (r *Runner) closeMailbox(mb *mailbox) error {
	errIngest := mb.closeIngest()
	mb.stopRetain()
	<-mb.retainExited
	mb.reads.close()
	errStore := mb.store.Load().Close()
	r.queryM.Forget(mb.cfg.ID)
	r.log.Info("mailbox closed", "mailbox_id", mb.cfg.ID, "epoch", mb.epoch.Load())
	if err := errors.Join(errIngest, errStore); err != nil {
		return fmt.Errorf("close %s: %w", mb.cfg.ID, err)
	}
	return nil
}

// Drain stops consuming mailbox id (stop fetching, flush, commit offsets, leave
// the consumer group) but keeps serving its queries; CloseMailbox ends it.
// A graceful shutdown drains before the lease is released.
func (r *Runner) Drain(id string) error {
	r.mu.Lock()
	r.settle(id)
	mb, ok := r.mailboxes[id]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("drain %s: %w", id, ErrNotOpen)
	}
	if err := mb.closeIngest(); err != nil {
		return fmt.Errorf("drain %s: %w", id, err)
	}
	return nil
}

// SetEpoch records the lease epoch mailbox id is served under; queries and
// stats then report it.
func (r *Runner) SetEpoch(id string, epoch uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settle(id)
	mb, ok := r.mailboxes[id]
	if !ok {
		return fmt.Errorf("set epoch %s: %w", id, ErrNotOpen)
	}
	mb.epoch.Store(epoch)
	return nil
}

// leaseWriter is a mailbox's store as its ingest writes it: refused once the
// lease deadline has passed (SetValidFor), so that a runner paused past it
// stores, marks and commits nothing it fetched after: the next holder
// consumes that from the committed offsets. The refusal wraps
// context.DeadlineExceeded, which ingest takes for the store's failure, not
// the records' (never dead-lettered): the batch is retried until the fence
// closes the ingest, and left uncommitted.
type leaseWriter struct {
	mb    *mailbox
	clock clock.PassiveClock
}

func (w leaseWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	if w.mb.expired(w.clock.Now()) {
		return store.WriteResult{}, fmt.Errorf("mailbox %s: %w, nothing stored past it: %w", w.mb.cfg.ID, ErrDeadlinePassed, context.DeadlineExceeded)
	}
	return w.mb.store.Load().Write(ctx, items)
}

// SetValidFor has mailbox id served only for d from now, on the runner's
// clock: past that, queries find it not open and its ingest stores nothing
// more (leaseWriter), whether or not the fence that should follow has run.
// A process paused past the deadline (SIGSTOP, a frozen container) serves
// the requests queued meanwhile, and writes what it had fetched, before its
// timers run, so the deadline is checked at each request and each write. A deadline that
// has passed is final (ErrDeadlinePassed): a call that would move it was
// late, perhaps queued across such a pause, and only a new Open serves the
// mailbox again.
func (r *Runner) SetValidFor(id string, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settle(id)
	mb, ok := r.mailboxes[id]
	if !ok {
		return fmt.Errorf("set valid for %s: %w", id, ErrNotOpen)
	}
	now := r.cfg.Clock.Now()
	if mb.expired(now) {
		return fmt.Errorf("set valid for %s: %w at %s", id, ErrDeadlinePassed, mb.until.Load().Format(time.RFC3339Nano))
	}
	until := now.Add(d)
	mb.until.Store(&until)
	return nil
}

// Mailbox implements query.Mailboxes. A mailbox past its lease deadline is
// not served (SetValidFor).
func (r *Runner) Mailbox(id string) (query.Source, uint64, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	mb, ok := r.mailboxes[id]
	if !ok || mb.expired(r.cfg.Clock.Now()) {
		return nil, 0, false
	}
	return guarded{mb}, mb.epoch.Load(), true
}

// readGuard lets a store close only once the reads that found it open are
// done; reads that come later get query.ErrClosed instead of a closed DB.
type readGuard struct {
	mu     sync.RWMutex
	closed bool
}

func (g *readGuard) acquire() error {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return query.ErrClosed
	}
	return nil
}

func (g *readGuard) release() { g.mu.RUnlock() }

func (g *readGuard) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// reopen serves reads again after close, once the store is swapped.
func (g *readGuard) reopen() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
}

// guarded is a mailbox's store as the query servers see it.
type guarded struct{ mb *mailbox }

func (g guarded) Query(ctx context.Context, f *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error) {
	if err := g.mb.reads.acquire(); err != nil {
		return nil, err
	}
	defer g.mb.reads.release()
	return g.mb.store.Load().Query(ctx, f)
}

func (g guarded) Get(ctx context.Context, id string) (*mailboxv1.MailboxItem, error) {
	if err := g.mb.reads.acquire(); err != nil {
		return nil, err
	}
	defer g.mb.reads.release()
	return g.mb.store.Load().Get(ctx, id)
}

func (g guarded) Stats(ctx context.Context) (*mailboxv1.MailboxStats, error) {
	if err := g.mb.reads.acquire(); err != nil {
		return nil, err
	}
	defer g.mb.reads.release()
	st, err := g.mb.store.Load().Stats(ctx)
	if err != nil {
		return nil, err
	}
	setHistory(st, g.mb.recoveryStatus())
	return st, nil
}

// Stats returns mailbox id's store totals with id and epoch filled in.
func (r *Runner) Stats(ctx context.Context, id string) (*mailboxv1.MailboxStats, error) {
	src, epoch, ok := r.Mailbox(id)
	if !ok {
		return nil, fmt.Errorf("stats %s: %w", id, ErrNotOpen)
	}
	st, err := src.Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("stats %s: %w", id, err)
	}
	st.MailboxId, st.Epoch = id, epoch
	return st, nil
}

// Consuming reports whether mailbox id is open and in an active consumer
// group session.
func (r *Runner) Consuming(id string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	mb, ok := r.mailboxes[id]
	return ok && mb.consuming()
}

// IDs lists the mailboxes served, sorted: open and within their lease
// deadline (SetValidFor), as Mailbox finds them.
func (r *Runner) IDs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	now := r.cfg.Clock.Now()
	ids := make([]string, 0, len(r.mailboxes))
	for id, mb := range r.mailboxes {
		if !mb.expired(now) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Ready reports whether the runner hosts at least one mailbox and every one
// of them is in an active consumer group session.
func (r *Runner) Ready() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return errors.New("runner closing")
	}
	if len(r.mailboxes) == 0 {
		return errors.New("no mailbox open")
	}
	var notConsuming []string
	for id, mb := range r.mailboxes {
		if !mb.consuming() {
			notConsuming = append(notConsuming, id)
		}
	}
	if len(notConsuming) > 0 {
		slices.Sort(notConsuming)
		return fmt.Errorf("not consuming yet: %s", strings.Join(notConsuming, ", "))
	}
	return nil
}

// DiskPressure says why ingest is held back while the data dir's filesystem
// is below its free-space watermark (Config.MinFree), and is nil otherwise.
func (r *Runner) DiskPressure() error {
	if err := r.disk.Err(); err != nil {
		return fmt.Errorf("ingest paused: %w", err)
	}
	return nil
}

// Registry is where the runner's metrics live.
func (r *Runner) Registry() *prometheus.Registry { return r.reg }

// HTTPHandler serves the query API, /metrics, /healthz and /readyz.
func (r *Runner) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/", query.NewHTTPHandler(r, r.queryM))
	r.probes(mux)
	return mux
}

// probes adds /metrics, /healthz, /readyz and the query API's description,
// /openapi.json, to mux: a TLS runner serves them on its plaintext port too.
func (r *Runner) probes(mux *http.ServeMux) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /openapi.json", httpapi.ServeOpenAPI)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		// A mailbox whose store failed to open is named, but does not
		// make the runner unready: that would take its other mailboxes
		// out of routing too.
		var failed strings.Builder
		fs := r.OpenFailures()
		for _, id := range slices.Sorted(maps.Keys(fs)) {
			fmt.Fprintf(&failed, "mailbox %s: store failed to open (%s): %v\n", mesh.Echo(id), openFailureReason(fs[id]), fs[id])
		}
		if err := r.cfg.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error()+"\n"+failed.String(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n" + failed.String()))
	})
}

// probeHandler is the plaintext HTTP port of a TLS runner: the probes, and
// a JSON 404 saying where the query API went instead of a bare one.
func (r *Runner) probeHandler() http.Handler {
	mux := http.NewServeMux()
	r.probes(mux)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteError(w, http.StatusNotFound, "the query API is served over mutual TLS on the query port, not on this plaintext port")
	})
	return mux
}

// RegisterGRPC adds MailboxQuery and the gRPC health service to s.
func (r *Runner) RegisterGRPC(s *grpc.Server) {
	query.NewGRPCServer(r, r.queryM).Register(s)
	r.recoverySrv.Register(s)
	healthpb.RegisterHealthServer(s, r.health)
}

// queryRoles are the identities that may query mailboxes on a TLS query
// port: the gateway routing clients' queries, and operators and readers
// reaching a runner directly.
var queryRoles = []identity.Role{identity.Gateway, identity.Operator, identity.Reader}

// queryPolicy is who may call what on the query port's gRPC: MailboxQuery
// for queryRoles, health for any identity of the trust domain (Envoy's
// health checks, a kubelet gRPC probe through a client certificate).
func queryPolicy() identity.Policy {
	queries := identity.AnyOf(queryRoles...)
	anyone := func(identity.Identity, any) error { return nil }
	return identity.Policy{
		mailboxv1.MailboxQuery_QueryEvents_FullMethodName: queries,
		mailboxv1.MailboxQuery_GetEvent_FullMethodName:    queries,
		mailboxv1.MailboxQuery_GetStats_FullMethodName:    queries,
		// Any proxy's runner may ask; the server lets through only those
		// the mailbox's placement allows (RecoveryAllowed).
		runnerv1.MailboxRecovery_FetchMailbox_FullMethodName: identity.AnyOf(identity.Proxy),
		healthpb.Health_Check_FullMethodName:                 anyone,
		healthpb.Health_List_FullMethodName:                  anyone,
		healthpb.Health_Watch_FullMethodName:                 anyone,
	}
}

// authorizeHTTP lets through requests whose client certificate names one of
// queryRoles, and answers the others as the query API answers every refusal:
// 401 without a certificate, 403 naming the caller and the allowed roles.
func authorizeHTTP(h http.Handler) http.Handler {
	allowed := identity.AnyOf(queryRoles...)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		caller, err := identity.FromRequest(req)
		if err != nil {
			httpapi.WriteError(w, http.StatusUnauthorized, "a client certificate is required: "+err.Error())
			return
		}
		if err := allowed(caller, nil); err != nil {
			httpapi.WriteError(w, http.StatusForbidden, grpcstatus.Convert(err).Message())
			return
		}
		h.ServeHTTP(w, req.WithContext(identity.WithCaller(req.Context(), caller)))
	})
}

// Serve answers on queryLis both gRPC and the HTTP API, telling them apart
// per request by content type, and on httpLis the HTTP API (without TLS) or
// only the probes (with TLS), until Close; it keeps the gRPC health status
// in line with Ready. queryLis is the address the sidecar advertises: Envoy
// has one endpoint per runner and sends it gRPC calls and /v1/mailboxes
// requests alike, multiplexed on one HTTP/2 connection, so one port must
// answer both. Without TLS that port speaks HTTP/1.1 and h2c; with TLS it
// offers h2 and http/1.1 by ALPN and requires a client certificate.
func (r *Runner) Serve(queryLis, httpLis net.Listener) {
	var opts []grpc.ServerOption
	if r.cfg.TLS != nil {
		p := queryPolicy()
		opts = append(opts, grpc.ChainUnaryInterceptor(p.UnaryInterceptor()), grpc.ChainStreamInterceptor(p.StreamInterceptor()))
	}
	// gRPC is served through net/http here, so grpc-go's transport limits
	// (MaxConcurrentStreams, keepalive) do not apply: the http.Servers' do,
	// with cfg.Conn's handshake and idle bounds, and cfg.Conn's listener
	// (plaintext) or HTTP/2 server (TLS) holds clients to gRPC's ping
	// policy, which net/http's HTTP/2 lacks. The size bound does apply.
	opts = append(opts, grpc.MaxSendMsgSize(query.MaxResponseBytes))
	r.grpc = grpc.NewServer(opts...)
	r.RegisterGRPC(r.grpc)
	api := r.HTTPHandler()
	var plain http.Protocols
	plain.SetHTTP1(true)
	plain.SetUnencryptedHTTP2(true)
	limited := func(h http.Handler) *http.Server {
		return r.cfg.Conn.HTTP(&http.Server{
			Handler: h, Protocols: &plain,
			HTTP2: &http.HTTP2Config{MaxConcurrentStreams: int(r.cfg.MaxStreams)},
		})
	}
	r.query = limited(grpcOr(r.grpc, api))
	r.http = limited(api)
	if r.cfg.TLS != nil {
		var secure http.Protocols
		secure.SetHTTP1(true)
		secure.SetHTTP2(true)
		r.query.Handler = grpcOr(r.grpc, authorizeHTTP(api))
		r.query.Protocols = &secure
		// Any identity of the trust domain may connect: health is open to
		// all, and a refused query is a PermissionDenied or 403 naming
		// the caller rather than a failed handshake.
		r.query.TLSConfig = r.cfg.TLS.ServerConfig(pki.Any)
		// HTTP/2 over TLS held to the ping bound too; it fails only for a
		// TLS 1.2 cipher list without HTTP/2's, and ServerConfig is TLS 1.3.
		if err := r.cfg.Conn.HTTP2(r.query); err != nil {
			r.log.Error("query port serves HTTP/2 without the ping bound", "err", err)
		}
		r.http.Handler = r.probeHandler()
	}
	if r.cfg.Pprof {
		r.http.Handler = debughttp.With(r.http.Handler)
	}
	for _, s := range []struct {
		srv *http.Server
		lis net.Listener
	}{{r.query, queryLis}, {r.http, httpLis}} {
		go func() {
			var err error
			if s.srv.TLSConfig != nil {
				err = s.srv.ServeTLS(s.lis, "", "")
			} else {
				err = s.srv.Serve(r.cfg.Conn.Listener(s.lis))
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("server stopped", "addr", s.lis.Addr().String(), "err", err)
			}
		}()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopWatch, r.watchDone = cancel, make(chan struct{})
	go r.watchHealth(ctx)
	r.log.Info("runner serving", "query_addr", queryLis.Addr().String(), "http_addr", httpLis.Addr().String(), "tls", r.cfg.TLS != nil)
}

// grpcOr sends gRPC requests (HTTP/2, content type application/grpc[+...])
// to g and every other request to h.
func grpcOr(g *grpc.Server, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, req)
			return
		}
		h.ServeHTTP(w, req)
	})
}

func (r *Runner) watchHealth(ctx context.Context) {
	defer close(r.watchDone)
	t := r.cfg.Clock.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if r.cfg.Ready() != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		r.health.SetServingStatus("", st)
		r.health.SetServingStatus(mailboxv1.MailboxQuery_ServiceDesc.ServiceName, st)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
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
