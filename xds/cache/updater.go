package cache

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
)

// Defaults for UpdaterConfig. A burst of lease changes (a runner restarting
// releases and re-acquires all its mailboxes) lands within a few
// milliseconds; MaxDelay bounds how long a steady stream can hold a push back.
const (
	DefaultDebounce = 10 * time.Millisecond
	DefaultMaxDelay = 100 * time.Millisecond
)

// UpdaterConfig configures NewUpdater; zero fields take defaults.
type UpdaterConfig struct {
	// Debounce is how long the updater waits for the state to settle after
	// an update before it translates.
	Debounce time.Duration
	// MaxDelay bounds the wait from the first update of a burst.
	MaxDelay time.Duration
	// Clock is what the updater debounces with (default the real clock).
	Clock clock.Clock
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Registerer receives the updater's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Updater feeds IR states into a Cache: it coalesces bursts, skips states
// equal to the one served, translates, and sets the snapshot.
type Updater struct {
	cache    *Cache
	debounce time.Duration
	maxDelay time.Duration
	clock    clock.Clock
	log      *slog.Logger
	wake     chan struct{}

	mu           sync.Mutex
	pending      *ir.IR
	pendingSince time.Time
	// gen numbers the updates handed over; done is the latest one Run has
	// finished with (served, skipped as unchanged, or refused), and
	// doneCh is closed and replaced each time done moves.
	gen, pendingGen, done uint64
	doneCh                chan struct{}
	stamps                map[string]time.Time
	stampOrder            []string

	// last is the state served, lastRes its resources when it translated
	// without error (what patch builds on); only touched by Run.
	last    *ir.IR
	lastRes *translator.Resources

	version      prometheus.Gauge
	translations *prometheus.CounterVec
	translateDur prometheus.Histogram
	coalesced    prometheus.Counter
}

// stampsKept bounds the version → update time map used for push latency.
const stampsKept = 64

// NewUpdater returns an updater for c; call Run to start it.
func NewUpdater(c *Cache, cfg UpdaterConfig) *Updater {
	u := &Updater{
		cache:    c,
		debounce: cfg.Debounce,
		maxDelay: cfg.MaxDelay,
		clock:    cfg.Clock,
		log:      cfg.Log,
		wake:     make(chan struct{}, 1),
		doneCh:   make(chan struct{}),
		stamps:   map[string]time.Time{},
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prism_xds_snapshot_version", Help: "IR version (Raft applied index) of the snapshot being served.",
		}),
		translations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_xds_translations_total", Help: "IR states processed, by result: ok, error (partial snapshot served), unchanged (skipped).",
		}, []string{"result"}),
		translateDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prism_xds_translate_seconds", Help: "Time to translate an IR and set the snapshot.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_xds_coalesced_updates_total", Help: "IR updates replaced by a newer one before they were translated.",
		}),
	}
	if u.debounce <= 0 {
		u.debounce = DefaultDebounce
	}
	if u.maxDelay <= 0 {
		u.maxDelay = DefaultMaxDelay
	}
	if u.clock == nil {
		u.clock = clock.RealClock{}
	}
	if u.log == nil {
		u.log = slog.Default()
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(u.version, u.translations, u.translateDur, u.coalesced)
	}
	return u
}

// Update hands the updater a new state. It never blocks; a state not yet
// translated is replaced. x must not be modified afterwards. The returned
// generation is what Processed waits for.
func (u *Updater) Update(x *ir.IR) uint64 {
	now := u.clock.Now()
	u.mu.Lock()
	if u.pending == nil {
		u.pendingSince = now
	} else {
		u.coalesced.Inc()
	}
	u.pending = x
	u.gen++
	u.pendingGen = u.gen
	gen := u.gen
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
	return gen
}

// Processed waits until Run is done with the update of generation gen, or
// with a later one that replaced it, whatever the outcome: an unchanged or
// refused state is never served under its own version, so waiting for a
// version string could wait for nothing.
func (u *Updater) Processed(ctx context.Context, gen uint64) error {
	for {
		u.mu.Lock()
		done, ch := u.done, u.doneCh
		u.mu.Unlock()
		if done >= gen {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// StampedAt is when the first update that led to the snapshot version was
// handed to the updater; the xDS server measures push latency from it.
func (u *Updater) StampedAt(version string) (time.Time, bool) {
	if i := strings.IndexByte(version, '.'); i >= 0 {
		version = version[:i] // "N.1": a later state under the same IR version
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.stamps[version]
	return t, ok
}

// Run processes updates until ctx ends.
func (u *Updater) Run(ctx context.Context) error {
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-u.wake:
			u.mu.Lock()
			since, pending := u.pendingSince, u.pending != nil
			u.mu.Unlock()
			if !pending {
				continue
			}
			now := u.clock.Now()
			wait := min(u.debounce, since.Add(u.maxDelay).Sub(now))
			timer = u.clock.After(max(wait, 0))
		case <-timer:
			timer = nil
			u.flush(ctx)
		}
	}
}

func (u *Updater) flush(ctx context.Context) {
	u.mu.Lock()
	x, since, gen := u.pending, u.pendingSince, u.pendingGen
	u.pending = nil
	u.mu.Unlock()
	if x == nil {
		return
	}
	defer u.markDone(gen)
	log := u.log.With("version", x.Version)
	if u.last != nil && x.Equal(u.last) {
		u.translations.WithLabelValues("unchanged").Inc()
		return
	}
	start := u.clock.Now()
	res, patched := patch(u.last, u.lastRes, x)
	var err error
	if !patched {
		res, err = translator.Translate(x)
	}
	result := "ok"
	if err != nil {
		result = "error"
		// The bad objects are left out; everything else is still served.
		log.Error("xds translation dropped invalid objects", "err", err)
	}
	if res == nil {
		u.translations.WithLabelValues(result).Inc()
		return
	}
	if u.last != nil && x.Version == u.last.Version {
		log.Warn("xds routing state changed without a new version; served under a suffixed one, which other admin nodes may label differently")
	}
	// Stamped before the snapshot is set: the server measures push latency
	// as the responses go out, which can be before Set returns.
	u.stamp(strconv.FormatUint(x.Version, 10), since)
	if err := u.cache.Set(ctx, x.Version, res); err != nil {
		log.Error("xds set snapshot", "err", err)
		u.translations.WithLabelValues("error").Inc()
		return
	}
	u.translateDur.Observe(u.clock.Now().Sub(start).Seconds())
	u.translations.WithLabelValues(result).Inc()
	u.version.Set(float64(x.Version))
	u.last, u.lastRes = x, res
	if err != nil {
		u.lastRes = nil
	}
	log.Debug("xds snapshot set", "routes", len(res.Routes), "clusters", len(res.Clusters), "endpoints", len(res.Endpoints), "patched", patched)
}

func (u *Updater) markDone(gen uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.done = gen
	close(u.doneCh)
	u.doneCh = make(chan struct{})
}

func (u *Updater) stamp(version string, at time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.stamps[version]; !ok {
		u.stampOrder = append(u.stampOrder, version)
	}
	u.stamps[version] = at
	for len(u.stampOrder) > stampsKept {
		delete(u.stamps, u.stampOrder[0])
		u.stampOrder = u.stampOrder[1:]
	}
}
