// Package control is the runner's local control API
// (prism.runner.v1.RunnerControl): the lease sidecar of the same pod tells
// the runner which mailboxes to open, under which lease epoch to consume and
// serve them, when to stop at once (fence) and when to drain.
//
// The one rule it enforces is that a mailbox is consumed and served only
// under a lease epoch: OpenMailbox without an epoch merely records the
// mailbox, the store is opened and the consumer started by ActivateMailbox,
// and the runner publishes the mailbox with its epoch already set
// (runner.MailboxConfig.Epoch). Epochs only grow per mailbox, so a stale
// sidecar incarnation cannot move a mailbox back to an older lease.
//
// The runner also fences a mailbox by itself when the sidecar's valid_for
// runs out without an ExtendMailbox: the sidecar may be dead, and the admin
// will grant the lease elsewhere after ttl + grace. valid_for counts from
// receipt, so a call that waited in the socket of a paused runner would
// stretch it; the call's bound on the host's boot clock, shared with the
// sidecar, cuts it back to what the sidecar meant (validity).
//
// Fencing closes the mailbox in the runner (queries stop at the first
// instruction, the consumer stops fetching and commits what it has made
// durable) but keeps the record and the data, so re-activation after a
// re-acquire reopens the same store.
//
// Each mailbox's lifecycle is the state machine in lifecycle.go: every call
// asks next whether its event is allowed in the mailbox's state, does the
// work on the runner, then stores the new state.
//
// A Drain of every mailbox (the sidecar shutting down) makes the runner not
// ready, but is no one-way door: the next OpenMailbox or ActivateMailbox comes
// from a new sidecar (the old one stops its workers before it drains), so it
// ends the drain, and a drained mailbox it activates consumes again. Either
// container of the pod can then restart alone.
//
// Locks: the Server's mu guards the map of mailboxes and the draining flag;
// each entry's mu guards that mailbox's state and is held across the work on
// the runner (opening a store, draining a consumer), which may take long,
// so mailboxes move independently. The order is entry first, then Server:
// s.mu may be taken while holding an entry's mu, never the reverse, and
// s.mu is never held across a call to the runner. Every transition
// publishes the entry's lifecycle (pub) before it unlocks, marked busy
// while such work is in progress:
// GetStats and Ready read only that and the runner's own record of what it
// serves (Host.Statuses, read at once), never an entry's lock, so a probe of
// the whole runner costs the same with a thousand mailboxes, hundreds of
// them opening or starting, as with one (a sidecar judges its runner dead by
// that probe's timeout).
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/internal/boottime"
	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Host is the part of *runner.Runner the control API drives.
type Host interface {
	Prepare(runner.MailboxConfig) error
	Discard(id string) error
	Open(runner.MailboxConfig) error
	CloseMailbox(id string) error
	Drain(id string) error
	SetEpoch(id string, epoch uint64) error
	// SetValidFor has the runner serve id only for d from now, checked at
	// every request, and refuses once the deadline it holds has passed.
	SetValidFor(id string, d time.Duration) error
	// Status is what the runner's goroutines last recorded of mailbox id
	// (its consumer, store and queries); false if the runner does not
	// serve id. Neither waits for a store opening or a consumer starting
	// or stopping.
	Status(id string) (runner.Status, bool)
	// Statuses is Status of every mailbox the runner serves, read at once.
	Statuses() map[string]runner.Status
	// AllowRecovery sets which proxies may copy mailbox id (nil: none).
	AllowRecovery(id string, proxies []string)
	// UpdateRecovery gives a mailbox being seeded its source's new address.
	UpdateRecovery(id string, src runner.RecoverySource)
}

// Config of a Server. Host is required.
type Config struct {
	Host Host
	// Registerer gets the control metrics; nil registers nothing.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Clock runs the activation deadlines; nil is the real clock.
	Clock clock.WithDelayedExecution
	// Boottime reads the host's boot clock, against which a call's
	// BoottimeBound is checked; nil is boottime.Read.
	Boottime boottime.Reader
}

// Server implements runnerv1.RunnerControlServer. Lock order: see the
// package documentation.
type Server struct {
	runnerv1.UnimplementedRunnerControlServer

	host    Host
	clock   clock.WithDelayedExecution
	boot    boottime.Reader
	log     *slog.Logger
	fences  *prometheus.CounterVec
	actions *prometheus.CounterVec

	mu        sync.Mutex
	mailboxes map[string]*entry
	draining  bool // Drain of every mailbox, until the next open or activate
}

// New makes a server hosting no mailbox.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Boottime == nil {
		cfg.Boottime = boottime.Read
	}
	s := &Server{
		host:  cfg.Host,
		clock: cfg.Clock,
		boot:  cfg.Boottime,
		log:   cfg.Logger,
		fences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_runner_fences_total",
			Help: "Mailboxes fenced on the sidecar's order, by reason.",
		}, []string{"reason"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_runner_control_calls_total",
			Help: "Control API calls by method and gRPC code.",
		}, []string{"method", "code"}),
		mailboxes: map[string]*entry{},
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.fences, s.actions)
	}
	return s
}

// Register adds the RunnerControl service to g.
func (s *Server) Register(g *grpc.Server) { runnerv1.RegisterRunnerControlServer(g, s) }

// Ready is the runner's readiness under the control API: not draining, and
// every mailbox the sidecar asked for is active and consuming. A runner with
// no mailbox is ready: it is waiting for assignments, which is normal.
func (s *Server) Ready() error {
	s.mu.Lock()
	draining := s.draining
	pubs := s.publishedLocked()
	s.mu.Unlock()
	if draining {
		return errors.New("draining")
	}
	hosted := s.host.Statuses()
	var waiting []string
	for id, p := range pubs {
		ws, _ := p.state.wire()
		switch {
		case p.busy:
			// Its store opening, or its consumer starting or stopping.
			waiting = append(waiting, id+" busy")
		case p.state == stateClosed:
			// Closed since the map was read: no longer asked for.
		case ws != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE:
			waiting = append(waiting, id+" "+strings.ToLower(strings.TrimPrefix(ws.String(), "MAILBOX_STATE_")))
		case !hosted[id].Consuming:
			waiting = append(waiting, id+" not consuming yet")
		}
	}
	if len(waiting) > 0 {
		slices.Sort(waiting)
		return fmt.Errorf("mailboxes not serving: %s", strings.Join(waiting, ", "))
	}
	return nil
}

// OpenMailbox implements RunnerControl.
func (s *Server) OpenMailbox(_ context.Context, req *runnerv1.OpenMailboxRequest) (*runnerv1.OpenMailboxResponse, error) {
	st, err := s.open(req)
	s.count("OpenMailbox", err)
	if err != nil {
		return nil, err
	}
	return &runnerv1.OpenMailboxResponse{Status: st}, nil
}

func (s *Server) open(req *runnerv1.OpenMailboxRequest) (*runnerv1.MailboxStatus, error) {
	id := req.GetMailboxId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	mc, err := toRunnerConfig(id, req.GetConfig(), 0)
	if err != nil {
		return nil, err
	}
	if req.GetEpoch() != 0 {
		if _, err := validFor(id, req.GetValidFor()); err != nil {
			return nil, err
		}
	}
	if src := req.GetRecoverFrom(); src != nil {
		if err := mesh.ValidateID("recover_from.mailbox_id", src.GetMailboxId()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "open %s: %v", id, err)
		}
		if src.GetMailboxId() == id || src.GetAddress() == "" {
			return nil, status.Errorf(codes.InvalidArgument, "open %s: recover_from: another mailbox and its runner's address are required", id)
		}
	}
	if before := req.GetHistoryBefore(); before != "" {
		if _, err := mesh.ParseMailboxID(before); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "open %s: history_before: %v", id, err)
		}
		if before == id {
			return nil, status.Errorf(codes.InvalidArgument, "open %s: history_before: another mailbox is required", id)
		}
	}
	// Locked before it is published, and held while opening: nobody sees
	// it in stateOpening.
	fresh := &entry{id: id, cfg: proto.CloneOf(req.GetConfig()), recover: proto.CloneOf(req.GetRecoverFrom()), historyBefore: req.GetHistoryBefore(), state: stateOpening}
	fresh.mu.Lock()
	opened := fresh.slowLocked()
	s.mu.Lock()
	s.endDrainLocked("open", id)
	e, ok := s.mailboxes[id]
	if !ok {
		e = fresh
		s.mailboxes[id] = e
	}
	s.mu.Unlock()
	if !ok {
		start := s.clock.Now()
		err := s.host.Prepare(mc)
		on := evPrepared
		if err != nil {
			on = evPrepareFailed
		}
		e.state, _ = next(e.state, on) // opening accepts either outcome
		opened()
		if err != nil {
			s.mu.Lock()
			delete(s.mailboxes, id)
			s.mu.Unlock()
		}
		e.mu.Unlock()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "open %s: %v", id, err)
		}
		s.log.Info("mailbox store opened; waiting for a lease epoch", "mailbox_id", id, "topics", req.GetConfig().GetTopics(), "took", s.clock.Since(start))
	} else {
		fresh.mu.Unlock()
		e.mu.Lock()
		same := proto.Equal(e.cfg, req.GetConfig())
		_, refused := next(e.state, evOpen)
		if same && refused == nil {
			// The placement may name a source later than the first open, or
			// the source's runner at a new address while the copy runs.
			e.recover = proto.CloneOf(req.GetRecoverFrom())
			e.historyBefore = req.GetHistoryBefore()
			if src := e.recover; src != nil && e.state.serving() {
				s.host.UpdateRecovery(id, runner.RecoverySource{MailboxID: src.GetMailboxId(), Address: src.GetAddress()})
			}
		}
		e.mu.Unlock()
		if refused != nil {
			return nil, status.Errorf(codes.Unavailable, "open %s: closed or failed meanwhile; retry: %v", id, refused)
		}
		if !same {
			return nil, status.Errorf(codes.FailedPrecondition, "open %s: already open with a different config; close it first", id)
		}
	}
	if req.GetEpoch() == 0 {
		hs, ok := s.host.Status(id)
		return statusOf(id, e.pub.Load(), hs, ok, s.clock.Now()), nil
	}
	return s.activate(id, req.GetEpoch(), req.GetValidFor(), req.GetBound())
}

// ActivateMailbox implements RunnerControl.
func (s *Server) ActivateMailbox(_ context.Context, req *runnerv1.ActivateMailboxRequest) (*runnerv1.ActivateMailboxResponse, error) {
	st, err := s.activate(req.GetMailboxId(), req.GetEpoch(), req.GetValidFor(), req.GetBound())
	s.count("ActivateMailbox", err)
	if err != nil {
		return nil, err
	}
	return &runnerv1.ActivateMailboxResponse{Status: st}, nil
}

func (s *Server) activate(id string, epoch uint64, vf *durationpb.Duration, bound *runnerv1.BoottimeBound) (*runnerv1.MailboxStatus, error) {
	if epoch == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "activate %s: epoch: must be non-zero (a lease epoch)", id)
	}
	d, err := validFor(id, vf)
	if err != nil {
		return nil, err
	}
	e, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	to, err := next(e.state, evActivate)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "activate %s: %v", id, err)
	}
	if epoch < e.epoch {
		return nil, status.Errorf(codes.FailedPrecondition, "activate %s: epoch %d is older than the last one, %d", id, epoch, e.epoch)
	}
	s.mu.Lock()
	s.endDrainLocked("activate", id)
	s.mu.Unlock()
	log := s.log.With("mailbox_id", id, "epoch", epoch)
	if e.state == stateActive {
		if epoch != e.epoch {
			// Same holder, new grant (a reconnect): queries report the
			// new epoch from now on.
			if err := s.host.SetEpoch(id, epoch); err != nil {
				return nil, status.Errorf(codes.Internal, "activate %s: %v", id, err)
			}
			log.Info("mailbox epoch advanced", "previous_epoch", e.epoch)
			e.epoch = epoch
		}
		defer e.publishLocked(false)
	} else {
		mc, err := toRunnerConfig(id, e.cfg, epoch)
		if err != nil {
			return nil, err
		}
		if src := e.recover; src != nil {
			mc.Recover = &runner.RecoverySource{MailboxID: src.GetMailboxId(), Address: src.GetAddress()}
		}
		mc.HistoryBefore = e.historyBefore
		defer e.slowLocked()()
		start := s.clock.Now()
		if e.state == stateDrained {
			// The runner cannot restart a drained consumer in place: the
			// mailbox closes (its offsets are committed) and the same
			// store reopens, so queries miss it only meanwhile.
			if err := s.host.CloseMailbox(id); err != nil {
				log.Warn("drained mailbox closed with errors before consuming again", "err", err)
			}
			e.state, _ = next(e.state, evFence) // drained accepts fence
			e.fenceReason = "reactivate_failed" // cleared once it opens
		}
		if err := s.host.Open(mc); err != nil {
			return nil, status.Errorf(codes.Internal, "activate %s: %v", id, err)
		}
		e.epoch, e.fenceReason = epoch, ""
		log.Info("mailbox active: consuming and serving", "valid_for", d, "took", s.clock.Since(start))
	}
	e.state = to
	if err := s.setDeadlineLocked(e, d, bound); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "activate %s: %v; activate it again", id, err)
	}
	return s.statusLocked(e), nil
}

// ExtendMailbox implements RunnerControl.
func (s *Server) ExtendMailbox(_ context.Context, req *runnerv1.ExtendMailboxRequest) (*runnerv1.ExtendMailboxResponse, error) {
	p, err := s.extend(req)
	s.count("ExtendMailbox", err)
	if err != nil {
		return nil, err
	}
	hs, ok := s.host.Status(req.GetMailboxId())
	return &runnerv1.ExtendMailboxResponse{Status: statusOf(req.GetMailboxId(), p, hs, ok, s.clock.Now())}, nil
}

// maxExtendBatch bounds one ExtendMailboxes: the admin's bulk bound, a
// proxy's whole share of mailboxes.
const maxExtendBatch = 10_000

// ExtendMailboxes implements RunnerControl: ExtendMailbox for each listed
// mailbox, each answered on its own, so that a sidecar extends every
// mailbox of its session in one call after a keepalive. Each mailbox is
// counted as an ExtendMailbox too. The runner's record of the mailboxes is
// read once for the batch, as GetStats reads it.
func (s *Server) ExtendMailboxes(_ context.Context, req *runnerv1.ExtendMailboxesRequest) (*runnerv1.ExtendMailboxesResponse, error) {
	if n := len(req.GetMailboxes()); n > maxExtendBatch {
		err := status.Errorf(codes.InvalidArgument, "extend: %d mailboxes in one call, at most %d", n, maxExtendBatch)
		s.count("ExtendMailboxes", err)
		return nil, err
	}
	out := &runnerv1.ExtendMailboxesResponse{Results: make([]*runnerv1.ExtendMailboxResult, len(req.GetMailboxes()))}
	hosted := s.host.Statuses()
	for i, m := range req.GetMailboxes() {
		r := &runnerv1.ExtendMailboxResult{MailboxId: m.GetMailboxId()}
		p, err := s.extend(m)
		s.count("ExtendMailbox", err)
		if err != nil {
			se := status.Convert(err)
			r.Code, r.Message = uint32(se.Code()), se.Message()
		} else {
			hs, ok := hosted[m.GetMailboxId()]
			r.Status = statusOf(m.GetMailboxId(), p, hs, ok, s.clock.Now())
		}
		out.Results[i] = r
	}
	s.count("ExtendMailboxes", nil)
	return out, nil
}

// extend moves mailbox req's deadline and returns the lifecycle it
// published.
func (s *Server) extend(req *runnerv1.ExtendMailboxRequest) (*published, error) {
	id := req.GetMailboxId()
	d, err := validFor(id, req.GetValidFor())
	if err != nil {
		return nil, err
	}
	e, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := next(e.state, evExtend); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "extend %s: not active (%v); activate it again", id, err)
	}
	if req.GetEpoch() != e.epoch {
		return nil, status.Errorf(codes.FailedPrecondition, "extend %s: epoch %d is not the active epoch %d", id, req.GetEpoch(), e.epoch)
	}
	if err := s.setDeadlineLocked(e, d, req.GetBound()); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "extend %s: %v; activate it again", id, err)
	}
	return e.publishLocked(false), nil
}

// FenceMailbox implements RunnerControl.
func (s *Server) FenceMailbox(_ context.Context, req *runnerv1.FenceMailboxRequest) (*runnerv1.FenceMailboxResponse, error) {
	st, err := s.fence(req.GetMailboxId(), req.GetReason())
	s.count("FenceMailbox", err)
	if err != nil {
		return nil, err
	}
	return &runnerv1.FenceMailboxResponse{Status: st}, nil
}

func (s *Server) fence(id, reason string) (*runnerv1.MailboxStatus, error) {
	if reason == "" {
		reason = "unspecified"
	}
	e, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := s.fenceLocked(e, reason); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "fence %s: %v", id, err)
	}
	return s.statusLocked(e), nil
}

// CloseMailbox implements RunnerControl.
func (s *Server) CloseMailbox(_ context.Context, req *runnerv1.CloseMailboxRequest) (*runnerv1.CloseMailboxResponse, error) {
	closed, err := s.close(req.GetMailboxId())
	s.count("CloseMailbox", err)
	if err != nil {
		return nil, err
	}
	return &runnerv1.CloseMailboxResponse{Closed: closed}, nil
}

func (s *Server) close(id string) (bool, error) {
	if err := validateID(id); err != nil {
		return false, err
	}
	s.mu.Lock()
	e, ok := s.mailboxes[id]
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	from := e.state
	to, err := next(from, evClose)
	if err != nil {
		return false, status.Errorf(codes.FailedPrecondition, "close %s: %v", id, err)
	}
	if from == to {
		return false, nil
	}
	defer e.slowLocked()()
	switch {
	case from.serving():
		e.timer.Stop()
		err = s.host.CloseMailbox(id)
	case from == stateOpen:
		err = s.host.Discard(id)
	}
	e.state = to
	s.mu.Lock()
	delete(s.mailboxes, id)
	s.mu.Unlock()
	s.host.AllowRecovery(id, nil)
	if err != nil {
		s.log.Error("mailbox closed with errors", "mailbox_id", id, "epoch", e.epoch, "err", err)
		return true, status.Errorf(codes.Internal, "close %s: %v", id, err)
	}
	s.log.Info("mailbox closed: drained, offsets committed", "mailbox_id", id, "epoch", e.epoch)
	return true, nil
}

// Drain implements RunnerControl: the mailboxes drain in parallel.
func (s *Server) Drain(_ context.Context, req *runnerv1.DrainRequest) (*runnerv1.DrainResponse, error) {
	ids := req.GetMailboxIds()
	for _, id := range ids {
		if err := validateID(id); err != nil {
			s.count("Drain", err)
			return nil, err
		}
	}
	s.mu.Lock()
	if len(ids) == 0 {
		s.draining = true
		for id := range s.mailboxes {
			ids = append(ids, id)
		}
	}
	entries := make([]*entry, 0, len(ids))
	for _, id := range ids {
		if e, ok := s.mailboxes[id]; ok {
			entries = append(entries, e)
		}
	}
	s.mu.Unlock()
	drained := make([]string, len(entries))
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	for i, e := range entries {
		wg.Go(func() { drained[i], errs[i] = s.drain(e) })
	}
	wg.Wait()
	err := errors.Join(errs...)
	s.count("Drain", err)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "drain: %v", err)
	}
	out := &runnerv1.DrainResponse{}
	for _, id := range drained {
		if id != "" {
			out.Drained = append(out.Drained, id)
		}
	}
	slices.Sort(out.Drained)
	s.log.Info("mailboxes drained: offsets committed, still serving until closed", "mailboxes", out.Drained)
	return out, nil
}

// drain stops e consuming; it returns e's id if it was consuming.
func (s *Server) drain(e *entry) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	to, err := next(e.state, evDrain)
	if err != nil {
		return "", fmt.Errorf("%s: %w", e.id, err)
	}
	if to == e.state {
		return "", nil
	}
	defer e.slowLocked()()
	if err := s.host.Drain(e.id); err != nil {
		return "", fmt.Errorf("%s: %w", e.id, err)
	}
	e.state = to
	s.log.Info("mailbox drained", "mailbox_id", e.id, "epoch", e.epoch)
	return e.id, nil
}

// GetStats implements RunnerControl. It reads the mailboxes' published
// lifecycles and the runner's record of what it serves, never a mailbox's
// lock (see the package documentation).
func (s *Server) GetStats(_ context.Context, req *runnerv1.GetStatsRequest) (*runnerv1.GetStatsResponse, error) {
	// The runner's record is read after the lifecycles: a mailbox
	// published active was opened on the runner before, so it is there.
	var pubs map[string]*published
	var hosted map[string]runner.Status
	if id := req.GetMailboxId(); id != "" {
		e, err := s.lookup(id)
		if err != nil {
			s.count("GetStats", err)
			return nil, err
		}
		pubs = map[string]*published{id: e.pub.Load()}
		if hs, ok := s.host.Status(id); ok {
			hosted = map[string]runner.Status{id: hs}
		}
	} else {
		s.mu.Lock()
		pubs = s.publishedLocked()
		s.mu.Unlock()
		hosted = s.host.Statuses()
	}
	now := s.clock.Now()
	out := &runnerv1.GetStatsResponse{Mailboxes: make([]*runnerv1.MailboxStatus, 0, len(pubs))}
	for id, p := range pubs {
		hs, ok := hosted[id]
		st := statusOf(id, p, hs, ok, now)
		st.QueriesServed = hs.QueriesServed
		out.Mailboxes = append(out.Mailboxes, st)
	}
	slices.SortFunc(out.Mailboxes, func(a, b *runnerv1.MailboxStatus) int { return strings.Compare(a.GetMailboxId(), b.GetMailboxId()) })
	s.count("GetStats", nil)
	return out, nil
}

// publishedLocked is every mailbox's published lifecycle; s.mu must be held.
func (s *Server) publishedLocked() map[string]*published {
	pubs := make(map[string]*published, len(s.mailboxes))
	for id, e := range s.mailboxes {
		pubs[id] = e.pub.Load()
	}
	return pubs
}

// statusLocked is e's status now; e.mu must be held.
func (s *Server) statusLocked(e *entry) *runnerv1.MailboxStatus {
	hs, ok := s.host.Status(e.id)
	p := published{state: e.state, epoch: e.epoch, fenceReason: e.fenceReason, deadline: e.deadline}
	return statusOf(e.id, &p, hs, ok, s.clock.Now())
}

// statusOf is mailbox id's status at now from its lifecycle p and hs, the
// runner's record of it (hosted: the runner serves it). A busy mailbox
// reports only its lifecycle from before its slow call.
func statusOf(id string, p *published, hs runner.Status, hosted bool, now time.Time) *runnerv1.MailboxStatus {
	ws, drained := p.state.wire()
	st := &runnerv1.MailboxStatus{MailboxId: id, State: ws, Epoch: p.epoch, FenceReason: p.fenceReason, Drained: drained}
	if p.busy || !p.state.serving() {
		return st
	}
	st.ValidFor = durationpb.New(max(0, p.deadline.Sub(now)))
	if !hosted {
		return st
	}
	st.Consuming = hs.Consuming
	if hs.LagKnown {
		st.Lag = proto.Int64(hs.Lag)
	}
	for _, pos := range hs.Positions {
		st.StoredPositions = append(st.StoredPositions, &runnerv1.StoredPosition{Topic: pos.Topic, Partition: pos.Partition, NextOffset: pos.Next})
	}
	if hs.StoreKnown {
		st.EventsStored, st.StorageBytes = hs.Events, hs.Bytes
	}
	st.Recovery = recoveryOf(hs.Recovery)
	return st
}

// recoveryOf is a mailbox's recovery on the wire.
func recoveryOf(rs runner.RecoveryStatus) *runnerv1.RecoveryStatus {
	out := &runnerv1.RecoveryStatus{
		SourceMailboxId: rs.Source, BytesCopied: rs.Bytes, EventsCopied: rs.Events,
		HistoryComplete: rs.HistoryComplete, Error: rs.Err,
	}
	switch rs.State {
	case runner.RecoveryCopying:
		out.State = runnerv1.RecoveryState_RECOVERY_STATE_COPYING
	case runner.RecoveryCopied:
		out.State = runnerv1.RecoveryState_RECOVERY_STATE_COPIED
	case runner.RecoveryIncomplete:
		out.State = runnerv1.RecoveryState_RECOVERY_STATE_INCOMPLETE
	default:
		out.State = runnerv1.RecoveryState_RECOVERY_STATE_NONE
	}
	for _, ts := range []struct {
		t  time.Time
		to **timestamppb.Timestamp
	}{{rs.Started, &out.StartedAt}, {rs.Finished, &out.FinishedAt}, {rs.HistoryStartsAt, &out.HistoryStartsAt}} {
		if !ts.t.IsZero() {
			*ts.to = timestamppb.New(ts.t)
		}
	}
	return out
}

// AllowRecovery implements RunnerControl.
func (s *Server) AllowRecovery(_ context.Context, req *runnerv1.AllowRecoveryRequest) (*runnerv1.AllowRecoveryResponse, error) {
	err := s.allowRecovery(req)
	s.count("AllowRecovery", err)
	if err != nil {
		return nil, err
	}
	return &runnerv1.AllowRecoveryResponse{}, nil
}

func (s *Server) allowRecovery(req *runnerv1.AllowRecoveryRequest) error {
	id := req.GetMailboxId()
	for i, p := range req.GetProxyIds() {
		if err := mesh.ValidateProxyID(p); err != nil {
			return status.Errorf(codes.InvalidArgument, "allow recovery of %s: proxy_ids[%d]: %v", id, i, err)
		}
	}
	e, err := s.lookup(id)
	if err != nil {
		return err
	}
	// Under the entry's lock, so a close (which clears the set) is not undone.
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	known := s.mailboxes[id] == e
	s.mu.Unlock()
	if !known {
		return status.Errorf(codes.NotFound, "mailbox %s: not open (OpenMailbox first)", id)
	}
	s.host.AllowRecovery(id, req.GetProxyIds())
	s.log.Info("recovery peers set", "mailbox_id", id, "proxy_ids", req.GetProxyIds())
	return nil
}

func (s *Server) lookup(id string) (*entry, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.mailboxes[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "mailbox %s: not open (OpenMailbox first)", id)
	}
	return e, nil
}

// endDrainLocked ends a Drain of every mailbox: only a new sidecar opens or
// activates after one. s.mu must be held.
func (s *Server) endDrainLocked(call, id string) {
	if s.draining {
		s.draining = false
		s.log.Info("runner drain ended: a sidecar takes mailboxes again", "call", call, "mailbox_id", id)
	}
}

func (s *Server) count(method string, err error) {
	s.actions.WithLabelValues(method, status.Code(err).String()).Inc()
}

const maxIDBytes = 512

// reasonLabel keeps the fence metric's label set small and valid: reasons
// are short snake_case words (ttl_elapsed, expired, deadline_passed); any
// other text counts as "other" and is only logged.
func reasonLabel(r string) string {
	if len(r) == 0 || len(r) > 32 {
		return "other"
	}
	for _, c := range r {
		if (c < 'a' || c > 'z') && c != '_' {
			return "other"
		}
	}
	return r
}

func validFor(id string, d *durationpb.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 {
		return 0, status.Errorf(codes.InvalidArgument, "activate %s: valid_for: must be a positive duration (the time left on the lease)", id)
	}
	return d.AsDuration(), nil
}

func validateID(id string) error {
	switch {
	case id == "":
		return status.Error(codes.InvalidArgument, "mailbox_id: required")
	case len(id) > maxIDBytes:
		return status.Errorf(codes.InvalidArgument, "mailbox_id: longer than %d bytes", maxIDBytes)
	case !mesh.PathSafe(id):
		return status.Errorf(codes.InvalidArgument, "mailbox_id %q: must not be . or .. or contain / \\ or NUL", id)
	}
	return nil
}

func toRunnerConfig(id string, c *runnerv1.MailboxConfig, epoch uint64) (runner.MailboxConfig, error) {
	if len(c.GetTopics()) == 0 {
		return runner.MailboxConfig{}, status.Errorf(codes.InvalidArgument, "open %s: config.topics: at least one topic is required", id)
	}
	for i, t := range c.GetTopics() {
		if t == "" {
			return runner.MailboxConfig{}, status.Errorf(codes.InvalidArgument, "open %s: config.topics[%d]: empty", id, i)
		}
	}
	if d := c.GetDeadLetterTopic(); d != "" && slices.Contains(c.GetTopics(), d) {
		return runner.MailboxConfig{}, status.Errorf(codes.InvalidArgument, "open %s: config.dead_letter_topic: %q is also consumed: its dead letters would be consumed again", id, d)
	}
	if c.GetMaxAgeMillis() < 0 || c.GetMaxSizeBytes() < 0 {
		return runner.MailboxConfig{}, status.Errorf(codes.InvalidArgument, "open %s: config: max_age_millis and max_size_bytes must not be negative", id)
	}
	var mode envelope.Mode
	switch c.GetValidationMode() {
	case runnerv1.ValidationMode_VALIDATION_MODE_UNSPECIFIED, runnerv1.ValidationMode_VALIDATION_MODE_STRICT:
		mode = envelope.Strict
	case runnerv1.ValidationMode_VALIDATION_MODE_WARN:
		mode = envelope.Warn
	case runnerv1.ValidationMode_VALIDATION_MODE_DISABLED:
		mode = envelope.Disabled
	default:
		return runner.MailboxConfig{}, status.Errorf(codes.InvalidArgument, "open %s: config.validation_mode: unknown value %d", id, c.GetValidationMode())
	}
	return runner.MailboxConfig{
		ID: id, Topics: slices.Clone(c.GetTopics()), Mode: mode,
		MaxAge:  time.Duration(c.GetMaxAgeMillis()) * time.Millisecond,
		MaxSize: c.GetMaxSizeBytes(), DeadLetterTopic: c.GetDeadLetterTopic(), Epoch: epoch,
	}, nil
}
