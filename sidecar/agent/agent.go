// Package agent is the lease sidecar, the client side of
// docs/architecture.md#lease-semantics. It runs next to one runner, registers
// its proxy with the admin cluster, watches the proxy's namespace assignments
// and, per assigned namespace, has the runner open mailbox
// "{namespace}@{proxy_id}", acquires its lease, and only then lets the
// runner consume and serve it under the lease's epoch.
//
// # One session, one worker per mailbox
//
// By default (LeaseModeSession) the sidecar holds every lease in one
// session (docs/architecture.md#sessions): it opens the session at start
// (proxy id, runner id, advertise address, ttl) and renews only the
// session, one keepalive per heartbeat interval (jittered, at most one in
// flight) whatever the number of mailboxes. The mailboxes assigned together
// are acquired in one AcquireLeases call, later ones in batches of whatever
// is waiting; each lease keeps its own epoch. A lease's validity is its
// session's: ttl after the send of the last acknowledged keepalive (or the
// open), exactly as a lease's is after its heartbeat below. A refused
// keepalive, or the validity running out, loses the session: every mailbox
// is fenced, a new session is opened and the mailboxes are acquired again
// under new epochs. An admin cluster without the Sessions service
// (Unimplemented, not upgraded yet) turns the sidecar to LeaseModeMailbox,
// which is today's per-mailbox path: AcquireLease, a MailboxHeartbeat per
// lease, ReleaseLease.
//
// Each mailbox has one goroutine owning its lease: it alone asks for it,
// (in mailbox mode) heartbeats it with at most one heartbeat in flight,
// fences, and releases it, so there is no second path that could keep a
// lease alive, or drop it, behind the worker's back; in session mode the
// session's keepalive loop is the one renewal every worker follows.
// Heartbeats carry the runner's stats; keepalives carry none.
//
// # Self-fencing
//
// The worker stops the runner (FenceMailbox) once ttl has passed since it
// *sent* the last heartbeat (or acquire; in session mode, keepalive or
// open) the admin acknowledged: the leader
// renewed at or after that moment, so it cannot expire the lease before
// ttl + grace later, and the runner is always stopped first. The deadline is
// a timer on the injected clock, independent of the RPC in flight, so a
// blackholed admin cannot delay it. An explicit refusal (expired, not the
// holder, stale epoch, unknown lease) fences at once. After a fence the
// worker tries to acquire again; the runner resumes only under the new
// epoch. Every loss is logged with its reason and counted.
//
// The runner does not depend on the sidecar being alive either: each
// activation and each acknowledged heartbeat hands it the time left on this
// clock (valid_for), and the runner fences by itself when it runs out.
//
// # A dead runner gives its lease back
//
// Each heartbeat (in session mode, each worker every interval) first asks
// the runner for its stats, which doubles as a probe of the runner's
// control API. Once the probes have failed (the
// runner unreachable, or answering with an error other than NotFound) for
// RunnerDeadAfter since it last answered, the worker renews no more, fences
// the runner, and releases the lease with its epoch: at once if the runner
// confirms the fence, else once the deadline the runner was last handed has
// passed (a paused runner that resumes fences itself by then, so it cannot
// serve beside the next holder). It then opens the mailbox in the runner
// again, retrying until the runner answers, and acquires as at start. A
// runner that is only slow (failing probes for less than the bound) keeps
// the lease. Probes ride on heartbeats, so a dead runner is noticed within
// RunnerDeadAfter plus one interval and one probe timeout of its last
// answer, and the lease is released at the latest ttl after that answer.
// The silence is counted only over time the sidecar was running to see it
// (silence.go): a probe that failed because the sidecar was stopped while
// it was in flight (SIGSTOP, a GC or a stalled machine: it took more than
// twice its timeout) counts for nothing, a failed probe for at most its
// timeout, and the wait before one for at most the interval, however late
// the sidecar's timer fired. So a pause of the sidecar, wherever it falls,
// adds nothing to the runner's silence, and a pause shorter than ttl keeps
// every lease. The runner's answer to any other call (an open, an extend)
// ends its silence as a probe's answer does: a runner too busy to answer
// its stats in time, opening a thousand stores at once, is alive.
//
// A runner that is gone, not only silent, is given up on at once: when a
// call to it fails and its control port refuses connections
// (runnerconn.go), it serves nothing, so the lease is released without
// waiting out the bound or the deadline it was handed (reason
// runner_gone), in the probe paths of both lease modes, the activation,
// the fence, and the close of an unassignment or the stop. A paused runner
// keeps its listening socket and is never taken for gone. Once a dial to
// the runner connects again, the mailbox is opened and acquired at once.
//
// The proxy heartbeat judges the runner the same way for the proxy as a
// whole (runner.go): it probes the runner's control API before each proxy
// heartbeat and, once the runner has failed for the bound, reports it not
// ready (ProxyHeartbeatRequest.runner_not_ready, also on RegisterProxy). The
// admin then leaves the proxy out of placement, as it does a stale one, so
// its namespaces move to other proxies, and serves its endpoint unhealthy;
// the first answer after that reports it ready and the namespaces come
// back. A runner slow for less than the bound is reported ready throughout.
//
// # Moves and the drain
//
// An assignment carries a role (issue 15): a namespace the proxy serves, one
// it catches up on as a move's destination, or one it hands off as the
// source during the handoff tail. The worker treats all three alike (open,
// acquire, serve), and a change of role alone touches neither the lease nor
// the runner; only leaving the set closes and releases. Each proxy
// heartbeat reports every namespace's lag from the runner's stats probe, so
// the admin can switch a move once its destination has caught up. POST
// /drain (drain.go, the runner's preStop hook) cordons the proxy and waits
// until it serves and hands off nothing
// (docs/architecture.md#kubernetes-stop-order).
//
// # Graceful stop
//
// On stop the workers halt (no new acquires or heartbeats), the runner
// drains (stop fetching, flush, commit offsets; queries still answered),
// then closes every mailbox (queries in flight answered first), and only
// then is each lease released (in session mode: one CloseSession ends them
// all), in parallel, within StopTimeout, so that all of it ends within 5 s
// of SIGTERM (docs/architecture.md#release). An unassigned mailbox goes the
// same way, its lease released on its own.
//
// The rule is that of the dead runner: routes are per proxy, so the
// runner alone decides what it serves, and a lease is released only once
// its runner cannot serve under it, lest it answer beside the next holder
// (a standby runner of the same proxy, say). The runner confirms the close
// (or, when the close fails, a fence), or else the deadline it was last
// handed (valid_for) must have passed. A stop that ends first releases
// nothing the runner may still serve: that lease, and in session mode the
// whole unclosed session, expire on the admin after ttl + grace instead,
// counted with result "expiring"; so does the lease of an unassigned
// mailbox still waiting out its runner when the sidecar stops.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/internal/boottime"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Config of an Agent. ProxyID, AdvertiseAddr, Admin and Runner are required.
type Config struct {
	// ProxyID is the proxy this sidecar registers (the pod name in
	// Kubernetes); mailboxes are "{namespace}@{ProxyID}".
	ProxyID string
	// RunnerID names the runner in leases; empty means ProxyID (one runner
	// per proxy), so a restarted sidecar of the same pod reconnects to its
	// lease instead of waiting for it to expire.
	RunnerID string
	// AdvertiseAddr is the runner's MailboxQuery address, which routes send
	// queries to; also the proxy's registered address.
	AdvertiseAddr string
	// Registration carries the optional registration fields (version,
	// capabilities, labels, region, zone); proxy id, address and runner id are
	// filled in.
	Registration *adminv1.ProxyRegistration
	// Instance names this sidecar process in its registration
	// (ProxyRegistration.instance): the proxy's own drain lasts only as
	// long as the instance that asked for it. "" takes a random one.
	Instance string
	// LeaseTTL is the ttl asked for on acquire; 0 takes the namespace's.
	// The ttl the admin grants is what the sidecar fences by.
	LeaseTTL time.Duration
	// HeartbeatInterval between heartbeats (jittered down by up to 20%);
	// the lease's own interval wins when shorter. Default 5s.
	HeartbeatInterval time.Duration
	// RunnerDeadAfter is how long the runner may fail the stats probe each
	// heartbeat makes before the lease is given back (see the package
	// doc). 0 means three heartbeat intervals of the lease, at most half
	// its ttl.
	RunnerDeadAfter time.Duration
	// StopTimeout bounds the graceful stop (drain + release). Default 4.5s.
	StopTimeout time.Duration
	// RPCTimeout bounds one call to the runner, and one whole admin call
	// (across failover). Default 5s.
	RPCTimeout time.Duration
	// Backoff between retries; zero value means 100ms doubling to 5s, 20%
	// jitter.
	Backoff wait.Backoff

	// LeaseMode is how the leases are held; "" is LeaseModeSession, which
	// falls back to LeaseModeMailbox by itself when the admin cluster has
	// no Sessions service.
	LeaseMode LeaseMode

	Admin adminv1.ControlPlaneClient
	// Cordon cordons the proxy for POST /drain (ControlPlane DrainProxy);
	// nil makes a drain wait without cordoning.
	Cordon Cordon
	// Sessions is the admin's Sessions service; nil takes Admin when it
	// serves both (as Endpoints does). Unused in LeaseModeMailbox.
	Sessions adminv1.SessionsClient
	Runner   runnerv1.RunnerControlClient
	// RunnerConn tells a runner that is gone (its control API refuses
	// connections) from one that only does not answer (runnerconn.go): a
	// gone runner's leases are released at once instead of after the
	// deadline it was handed. nil knows nothing, and every runner that
	// does not answer is waited out.
	RunnerConn RunnerConn

	Clock clock.Clock // nil = real clock
	// Boottime reads the host's boot clock, shared with the runner of the
	// pod, to bound each valid_for the runner is handed (runnerBound);
	// nil is boottime.Read.
	Boottime boottime.Reader
	// Jitter shortens a heartbeat interval; nil takes 80-100% at random.
	Jitter     func(time.Duration) time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() error {
	if c.ProxyID == "" {
		return errors.New("agent: proxy id is required")
	}
	if strings.Contains(c.ProxyID, "@") {
		return fmt.Errorf("agent: proxy id %q must not contain '@'", c.ProxyID)
	}
	if c.AdvertiseAddr == "" {
		return errors.New("agent: advertise address (the runner's MailboxQuery host:port) is required")
	}
	if c.Admin == nil || c.Runner == nil {
		return errors.New("agent: admin and runner clients are required")
	}
	if c.RunnerID == "" {
		c.RunnerID = c.ProxyID
	}
	if c.Instance == "" {
		c.Instance = NewInstance()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 5 * time.Second
	}
	if c.LeaseTTL < 0 {
		return fmt.Errorf("agent: lease ttl %v must not be negative", c.LeaseTTL)
	}
	if c.LeaseTTL > 0 && c.HeartbeatInterval >= c.LeaseTTL {
		return fmt.Errorf("agent: heartbeat interval %v must be below the lease ttl %v", c.HeartbeatInterval, c.LeaseTTL)
	}
	if c.RunnerDeadAfter < 0 {
		return fmt.Errorf("agent: runner-dead bound %v must not be negative", c.RunnerDeadAfter)
	}
	if c.RunnerDeadAfter > 0 && c.LeaseTTL > 0 && c.RunnerDeadAfter >= c.LeaseTTL {
		return fmt.Errorf("agent: runner-dead bound %v must be below the lease ttl %v", c.RunnerDeadAfter, c.LeaseTTL)
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 4500 * time.Millisecond
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = 5 * time.Second
	}
	if c.Backoff.Duration <= 0 {
		c.Backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Boottime == nil {
		c.Boottime = boottime.Read
	}
	if c.Jitter == nil {
		c.Jitter = func(d time.Duration) time.Duration { return time.Duration(float64(d) * (0.8 + 0.2*rand.Float64())) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.LeaseMode {
	case "":
		c.LeaseMode = LeaseModeSession
	case LeaseModeSession, LeaseModeMailbox:
	default:
		return fmt.Errorf("agent: lease mode %q: want %q or %q", c.LeaseMode, LeaseModeSession, LeaseModeMailbox)
	}
	if c.LeaseMode == LeaseModeSession && c.Sessions == nil {
		sc, ok := c.Admin.(adminv1.SessionsClient)
		if !ok {
			return errors.New("agent: session lease mode needs a Sessions client")
		}
		c.Sessions = sc
	}
	return nil
}

// Agent is the sidecar.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	reg  prometheus.Gatherer
	sess *sessions

	// heardAt is when the runner last answered any call (heardRunner).
	heardAt atomic.Pointer[time.Time]

	registered atomic.Bool
	// runnerNotReady is the proxy's judgment of its runner (runner.go),
	// reported with every registration and proxy heartbeat.
	runnerNotReady atomic.Bool
	synced         atomic.Bool
	stopping       atomic.Bool
	// halt ends when Shutdown begins: an unassigned mailbox waiting out
	// its runner's deadline stops waiting and leaves its lease to expire.
	halt   context.Context
	halted context.CancelFunc

	// starts holds a token per call in flight that opens a store or starts
	// a consumer in the runner (startSlot).
	starts chan struct{}
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
		starts:  make(chan struct{}, maxRunnerStarts),
		allow:   newAllower(),
	}
	a.halt, a.halted = context.WithCancel(context.Background())
	if g, ok := cfg.Registerer.(prometheus.Gatherer); ok {
		a.reg = g
	}
	a.cfg.Runner = heardRunner{RunnerControlClient: cfg.Runner, a: a}
	a.sess = newSessions(a)
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

func (a *Agent) registration() *adminv1.ProxyRegistration {
	r := proto.CloneOf(a.cfg.Registration)
	if r == nil {
		r = &adminv1.ProxyRegistration{}
	}
	// The admin grants this proxy's mailboxes only to the runner named here.
	r.ProxyId, r.Address, r.RunnerId, r.Instance = a.cfg.ProxyID, a.cfg.AdvertiseAddr, a.cfg.RunnerID, a.cfg.Instance
	if len(r.Capabilities) == 0 {
		r.Capabilities = []string{"mailbox"}
	}
	return r
}

// register retries RegisterProxy until it succeeds; false if ctx ended.
func (a *Agent) register(ctx context.Context) bool {
	bo := a.cfg.Backoff
	for {
		cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
		resp, err := a.cfg.Admin.RegisterProxy(cctx, &adminv1.RegisterProxyRequest{Registration: a.registration(), RunnerNotReady: a.runnerNotReady.Load()})
		cancel()
		if err == nil {
			if !a.registered.Swap(true) {
				a.log.Info("proxy registered", "index", resp.GetIndex(), "assignments", len(resp.GetAssignments()))
			}
			return true
		}
		retry := a.retryWait("register", err, &bo)
		a.log.Warn("register proxy failed; retrying", "err", err, "retry_in", retry)
		if !sleep(ctx, a.cfg.Clock, retry) {
			return false
		}
	}
}

// proxyHeartbeats keeps the proxy live for placement, re-registering when
// the admin has forgotten it. Each heartbeat first probes the runner and
// carries the verdict (runner.go), in either lease mode: the proxy
// heartbeat, not the session keepalive, is what keeps a proxy in placement.
func (a *Agent) proxyHeartbeats(ctx context.Context) {
	// Each probe follows the last heartbeat by one interval, jittered.
	sil := newSilence(a.cfg.Clock.Now(), a.probeTimeout(a.cfg.HeartbeatInterval), a.cfg.HeartbeatInterval)
	for sleep(ctx, a.cfg.Clock, a.cfg.Jitter(a.cfg.HeartbeatInterval)) {
		stats := a.judgeRunner(ctx, &sil)
		if ctx.Err() != nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
		_, err := a.cfg.Admin.ProxyHeartbeat(cctx, &adminv1.ProxyHeartbeatRequest{
			ProxyId: a.cfg.ProxyID, NamespaceHealth: a.namespaceHealth(stats),
			RunnerId: a.cfg.RunnerID, RunnerNotReady: a.runnerNotReady.Load(),
		})
		cancel()
		switch {
		case err == nil:
		case status.Code(err) == codes.NotFound:
			a.log.Warn("admin does not know this proxy; registering again", "err", err)
			a.register(ctx)
		default:
			a.log.Warn("proxy heartbeat failed", "err", err)
		}
	}
}

// namespaceHealth reports every assigned namespace, with its mailbox's lag
// and stored positions from stats, the runner's answer to this heartbeat's
// probe (nil if it did not answer): the admin switches a move once the
// destination's positions reach the source's, or by lag from runners that
// report no positions (issue 15). A mailbox the runner does not report, or
// reports without a lag, is sent with lag_known false; without positions,
// with none. A mailbox the runner failed to open OpenFailuresReported times
// in a row is reported open_failed with the runner's error, so the admin
// places the namespace on another proxy (issue 12).
func (a *Agent) namespaceHealth(stats *runnerv1.GetStatsResponse) []*adminv1.NamespaceHealth {
	lags := map[string]int64{}
	positions := map[string][]*adminv1.StoredPosition{}
	recovery := map[string]*runnerv1.RecoveryStatus{}
	for _, st := range stats.GetMailboxes() {
		recovery[st.GetMailboxId()] = st.GetRecovery()
		if st.Lag != nil {
			lags[st.GetMailboxId()] = st.GetLag()
		}
		for _, p := range st.GetStoredPositions() {
			positions[st.GetMailboxId()] = append(positions[st.GetMailboxId()], &adminv1.StoredPosition{
				Topic: p.GetTopic(), Partition: p.GetPartition(), NextOffset: p.GetNextOffset()})
		}
	}
	var out []*adminv1.NamespaceHealth
	for _, v := range a.Leases() {
		h := adminv1.HealthStatus_HEALTH_STATUS_HEALTHY
		if v.State != StateActive {
			h = adminv1.HealthStatus_HEALTH_STATUS_UNHEALTHY
		}
		lag, known := lags[v.MailboxID]
		nh := &adminv1.NamespaceHealth{Namespace: v.Namespace, Status: h, Lag: lag, LagKnown: known,
			StoredPositions: positions[v.MailboxID]}
		if v.OpenFailures >= OpenFailuresReported {
			nh.OpenFailed, nh.OpenFailure = true, v.OpenError
		}
		reportRecovery(nh, recovery[v.MailboxID])
		out = append(out, nh)
	}
	return out
}

// watch follows WatchAssignments, reconnecting with backoff across the
// admin endpoints.
func (a *Agent) watch(ctx context.Context) {
	bo := a.cfg.Backoff
	for ctx.Err() == nil {
		a.m.watchConns.Inc()
		stream, err := a.cfg.Admin.WatchAssignments(ctx, &adminv1.WatchAssignmentsRequest{ProxyId: a.cfg.ProxyID})
		for err == nil {
			var msg *adminv1.WatchAssignmentsResponse
			if msg, err = stream.Recv(); err == nil {
				a.apply(msg)
				bo = a.cfg.Backoff
			}
		}
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("assignment watch broken; reconnecting", "err", err)
		if !sleep(ctx, a.cfg.Clock, bo.Step()) {
			return
		}
	}
}

// apply makes the workers match an assignment set. A set older than one
// already applied (from a lagging node after a reconnect) is ignored.
func (a *Agent) apply(msg *adminv1.WatchAssignmentsResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopping.Load() {
		return
	}
	if msg.GetIndex() < a.lastIndex {
		a.log.Info("ignoring an older assignment set", "index", msg.GetIndex(), "applied_index", a.lastIndex)
		return
	}
	a.lastIndex = msg.GetIndex()
	a.nowhere = msg.GetNoPlaceableProxy()
	want := map[string]*adminv1.NamespaceAssignment{}
	for _, as := range msg.GetAssignments() {
		id := as.GetMailboxId()
		if id == "" {
			id = mesh.MailboxID{Namespace: as.GetNamespace(), Proxy: a.cfg.ProxyID}.String()
		}
		want[id] = as
	}
	a.allow.set(peersOf(want))
	for id, w := range a.workers {
		as, ok := want[id]
		if !ok || !proto.Equal(as.GetConfig(), w.assignment.GetConfig()) {
			a.log.Info("mailbox unassigned", "mailbox_id", id, "epoch", w.view().Epoch, "index", msg.GetIndex(), "reassigned_with_new_config", ok)
			w.stop(stopUnassign)
			delete(a.workers, id)
			a.closing[id] = w
			continue
		}
		// A role change alone (catching up to serving at a move's switch,
		// serving to handing off, back when a move is abandoned) keeps the
		// lease and the runner serving: the mailbox is what moves make
		// before they break.
		if prev := w.setRole(as.GetRole()); prev != as.GetRole() {
			a.log.Info("mailbox role changed", "mailbox_id", id, "from", roleName(prev), "to", roleName(as.GetRole()), "index", msg.GetIndex())
		}
	}
	var started []*worker
	for id, as := range want {
		if _, ok := a.workers[id]; ok {
			continue
		}
		a.log.Info("mailbox assigned", "mailbox_id", id, "namespace", as.GetNamespace(), "role", roleName(as.GetRole()), "index", msg.GetIndex())
		w := newWorker(a, id, as)
		// A worker still closing the same mailbox goes first: its close
		// and release must not land after this one's open and acquire.
		w.prev = a.closing[id]
		a.workers[id] = w
		started = append(started, w)
	}
	// The mailboxes assigned together are acquired together: one batch
	// waits for all of them but those still waiting for a close.
	for _, w := range started {
		if w.prev == nil {
			a.sess.expect(w.id)
		}
	}
	for _, w := range started {
		a.all.Go(w.run)
	}
	a.synced.Store(true)
	a.notifyLocked()
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

// Shutdown halts every worker, drains the runner, has it stop serving each
// mailbox and then releases every lease the workers held; Run calls it when
// its context ends.
func (a *Agent) Shutdown(ctx context.Context) error {
	start := a.cfg.Clock.Now()
	a.stopping.Store(true)
	a.halted()
	a.mu.Lock()
	for _, w := range a.workers {
		w.stop(stopShutdown)
		a.stopped = append(a.stopped, w)
	}
	a.workers = map[string]*worker{}
	stopped := a.stopped
	a.mu.Unlock()
	done := make(chan struct{})
	go func() { a.all.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		a.log.Error("workers did not halt in time; draining anyway", "err", ctx.Err())
	}

	var errs []error
	// The runner stops consuming and commits before any lease goes, and
	// keeps answering queries until each mailbox is closed. With nothing
	// held there is nothing to drain: after the preStop hook's drain has
	// handed every namespace off, the kubelet stops a native sidecar only
	// once the runner has exited, so asking it would only fail.
	if len(stopped) > 0 {
		dctx, cancel := context.WithTimeout(ctx, remaining(ctx)*2/3)
		resp, err := a.cfg.Runner.Drain(dctx, &runnerv1.DrainRequest{})
		cancel()
		switch {
		case a.gone(err):
			// It stopped consuming as it stopped (a runner's own stop
			// drains and commits; a killed one committed only what it
			// stored), and serves nothing: its leases go at once.
			a.log.Info("runner gone (its control API refuses connections): nothing to drain; releasing its leases", "err", err)
		case err != nil:
			a.log.Warn("runner drain failed; closing and releasing anyway", "err", err)
			errs = append(errs, fmt.Errorf("drain runner: %w", err))
		default:
			a.log.Info("runner drained", "mailboxes", resp.GetDrained())
		}
	}
	// The runner alone decides what it serves, so a lease goes only once
	// the runner stopped serving its mailbox: it closed (or fenced) it, or
	// the deadline it was handed has passed. A lease on its own (or of a
	// session already lost) is released right after its mailbox; the
	// leases of the current session wait for every mailbox of it, then one
	// CloseSession ends them all.
	cur := a.sess.current()
	inSession := func(v LeaseView) bool { return cur != nil && v.SessionID == cur.id }
	settled := make([]bool, len(stopped))
	relErrs := make([]error, len(stopped))
	var wg sync.WaitGroup
	for i, w := range stopped {
		wg.Go(func() {
			closed := w.closeInRunner(ctx, "shutdown")
			v := w.view()
			if v.Epoch == 0 {
				return
			}
			switch settled[i] = closed || w.outwait(ctx, "shutdown", v.Epoch); {
			case !settled[i]:
				relErrs[i] = fmt.Errorf("lease of %s not released: the runner did not confirm it stopped serving, and its deadline is past the stop: %w", w.id, ctx.Err())
			case !inSession(v):
				relErrs[i] = w.release(ctx, "shutdown", v.Epoch)
			}
		})
	}
	wg.Wait()
	var unsettled []string
	for i, w := range stopped {
		if v := w.view(); inSession(v) && !settled[i] {
			unsettled = append(unsettled, w.id)
		}
	}
	a.mu.Lock()
	for _, w := range a.closing {
		if inSession(w.view()) {
			unsettled = append(unsettled, w.id)
		}
	}
	a.mu.Unlock()
	if len(unsettled) == 0 {
		if err := a.closeSession(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if cur != nil {
		a.log.Error("session not closed: the runner may still serve some of its mailboxes; the other leases are released, the session expires after ttl + grace",
			"session_id", cur.id, "mailboxes", unsettled)
	}
	for i, w := range stopped {
		if v := w.view(); inSession(v) && settled[i] {
			if len(unsettled) == 0 {
				w.update(func(v *LeaseView) { v.State = StateFenced })
			} else {
				wg.Go(func() { relErrs[i] = w.release(ctx, "shutdown", v.Epoch) })
			}
		}
	}
	wg.Wait()
	errs = append(errs, relErrs...)
	a.log.Info("sidecar stopped", "took", a.cfg.Clock.Since(start), "leases", len(stopped))
	return errors.Join(errs...)
}

// closeSession closes the current session, if any: its leases end with
// it, or expire after ttl + grace if the close failed.
func (a *Agent) closeSession(ctx context.Context) error {
	id, n, err := a.sess.close(ctx)
	switch {
	case id == 0:
	case err != nil:
		a.log.Error("session close failed; its leases expire after ttl + grace", "session_id", id, "err", err)
		a.m.releases.WithLabelValues("shutdown", "error").Inc()
	default:
		a.m.releases.WithLabelValues("shutdown", "released").Add(float64(n))
	}
	return err
}

// sessionLeases counts the leases active in the current session.
func (a *Agent) sessionLeases() float64 {
	st := a.sess.current()
	if st == nil {
		return 0
	}
	n := 0
	for _, v := range a.Leases() {
		if v.SessionID == st.id && v.State == StateActive {
			n++
		}
	}
	return float64(n)
}

func remaining(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return 5 * time.Second
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
	if a.stopping.Load() {
		return errors.New("stopping")
	}
	if !a.synced.Load() {
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
	if !a.registered.Load() {
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

// maxRunnerStarts bounds the calls that open a mailbox's store or start
// its consumer in the runner at once. The runner does each on its own
// goroutine: a proxy's whole share at once (1,000 mailboxes assigned
// together) took it 20 s of CPU-bound store opens all told, with every
// other call, the stats probe included, waiting for a core behind them
// for longer than the runner-dead bound; and each call queued there would
// time out (RPCTimeout) and be retried, where here it only waits its turn.
const maxRunnerStarts = 32

// startSlot waits for a turn to open or start a mailbox in the runner and
// returns its release; false if ctx ended first.
func (a *Agent) startSlot(ctx context.Context) (func(), bool) {
	select {
	case a.starts <- struct{}{}:
		return func() { <-a.starts }, true
	case <-ctx.Done():
		return nil, false
	}
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

// Hostname is the default proxy id outside Kubernetes.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
