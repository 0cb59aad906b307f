package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"
)

// Agent is the sidecar.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	reg  prometheus.Gatherer
	sess *sessions

	// rn is the runner's control client every part of the agent calls.
	rn *runnerClient

	life *lifecycle
	// runnerNotReady is the proxy's judgment of its runner (proxy.go),
	// reported with every registration and proxy heartbeat.
	runnerNotReady atomic.Bool

	// allow keeps the runner's recovery peers in line with the
	// assignments (recovery.go).
	allow *allower

	mu        sync.Mutex
	workers   map[string]*worker // assigned now, by mailbox id
	closing   map[string]*worker // unassigned, still closing and releasing
	changed   chan struct{}      // closed and replaced when workers or closing change
	all       sync.WaitGroup     // every worker, unassigned ones included
	lastIndex uint64
	// nowhere is the last assignment set's no_placeable_proxy: no proxy
	// can take a namespace from this one, so a drain waits only for what
	// is already leaving.
	nowhere bool
	stopped []*worker // workers that halted for the graceful stop
}

// New validates cfg and makes an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:     cfg,
		log:     cfg.Logger.With("proxy_id", cfg.ProxyID, "runner_id", cfg.RunnerID),
		m:       newMetrics(cfg.Registerer),
		workers: map[string]*worker{},
		closing: map[string]*worker{},
		changed: make(chan struct{}),
		allow:   newAllower(),
		life:    newLifecycle(),
	}
	if g, ok := cfg.Registerer.(prometheus.Gatherer); ok {
		a.reg = g
	}
	a.rn = newRunnerClient(&a.cfg, a.allow.opened)
	a.cfg.Runner = a.rn.RunnerControlClient
	a.sess = newSessions(&a.cfg, a.log, a.m, a.rn)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prism_sidecar_session_leases",
			Help: "Leases held in the current session with the runner active on them (0 in mailbox mode).",
		}, a.sessionLeases))
	}
	return a, nil
}

// Run registers the proxy, follows its assignments and keeps the leases
// until ctx ends, then stops gracefully: the runner drains and every lease
// is released, within StopTimeout. It returns the stop's errors.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("sidecar starting", "advertise_addr", a.cfg.AdvertiseAddr, "lease_ttl", a.cfg.LeaseTTL, "heartbeat_interval", a.cfg.HeartbeatInterval, "lease_mode", a.cfg.LeaseMode)
	loops, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if a.register(loops) {
			wg.Go(func() { a.proxyHeartbeats(loops) })
			wg.Go(func() { a.allowRecovery(loops) })
			wg.Go(func() { a.sess.run(loops) })
			a.watch(loops)
		}
	})
	<-ctx.Done()
	cancel()
	wg.Wait()
	stopCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.StopTimeout)
	defer stop()
	return a.Shutdown(stopCtx)
}

// notifyLocked wakes whoever waits for the workers to change (Drain);
// a.mu must be held.
func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// closed forgets a worker that finished closing: its runner no longer
// serves the mailbox, or the deadline it was handed has passed. A worker
// stopped before that stays in closing, and Shutdown then leaves the
// session, which holds its lease, to expire.
func (a *Agent) closed(w *worker) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing[w.id] == w {
		delete(a.closing, w.id)
		a.notifyLocked()
	}
}

// Leases reports every assigned mailbox's lease state, sorted by id.
func (a *Agent) Leases() []LeaseView {
	a.mu.Lock()
	ws := make([]*worker, 0, len(a.workers))
	for _, w := range a.workers {
		ws = append(ws, w)
	}
	a.mu.Unlock()
	out := make([]LeaseView, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.view())
	}
	slices.SortFunc(out, func(x, y LeaseView) int { return strings.Compare(x.MailboxID, y.MailboxID) })
	return out
}

// Ready is nil only while the sidecar has its assignments and holds the
// lease of every one of them with the runner serving it.
func (a *Agent) Ready() error {
	if a.life.stopping() {
		return errors.New("stopping")
	}
	if !a.life.has(phaseSynced) {
		return errors.New("no assignment set received yet")
	}
	var missing []string
	for _, v := range a.Leases() {
		if v.State != StateActive {
			missing = append(missing, v.MailboxID+" "+string(v.State))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("leases not held: %s", strings.Join(missing, ", "))
	}
	return nil
}

// Healthy is nil once the proxy has registered: a sidecar cut off from the
// admin later is still alive (and fences by itself), so liveness must not
// restart it.
func (a *Agent) Healthy() error {
	if !a.life.has(phaseRegistered) {
		return errors.New("proxy not registered yet")
	}
	return nil
}

// Handler serves /healthz, /readyz, POST /drain (the runner's preStop
// hook, drain.go) and /metrics (when the registerer is a gatherer).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if err := check(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ok\n"))
		}
	}
	mux.HandleFunc("GET /healthz", probe(a.Healthy))
	mux.HandleFunc("GET /readyz", probe(a.Ready))
	mux.HandleFunc("POST /drain", a.serveDrain)
	if a.reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	}
	return mux
}

// sleep waits d on clk; false if ctx ended first.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
