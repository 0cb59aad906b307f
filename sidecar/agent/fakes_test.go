package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// events is the ordered record of every call both fakes saw, stamped with
// the fake clock, so tests can assert ordering across admin and runner.
type events struct {
	clk *clocktesting.FakeClock
	mu  sync.Mutex
	log []event
}

type event struct {
	at   time.Time
	what string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, event{e.clk.Now(), fmt.Sprintf(format, args...)})
}

func (e *events) all() []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.log)
}

// find returns the first event with prefix at or after index from.
func (e *events) find(from int, prefix string) (int, event, bool) {
	all := e.all()
	for i := from; i < len(all); i++ {
		if strings.HasPrefix(all[i].what, prefix) {
			return i, all[i], true
		}
	}
	return -1, event{}, false
}

func (e *events) count(prefix string) int {
	n := 0
	for _, ev := range e.all() {
		if strings.HasPrefix(ev.what, prefix) {
			n++
		}
	}
	return n
}

func (e *events) String() string {
	var b strings.Builder
	for _, ev := range e.all() {
		fmt.Fprintf(&b, "  %s %s\n", ev.at.Format("15:04:05.000"), ev.what)
	}
	return b.String()
}

// fakeAdmin is a ControlPlane with scripted lease answers.
type fakeAdmin struct {
	adminv1.ControlPlaneClient // unused methods panic
	ev                         *events
	assign                     chan *adminv1.WatchAssignmentsResponse

	mu        sync.Mutex
	epoch     uint64
	ttl       time.Duration
	acquireFn func(*adminv1.AcquireLeaseRequest) (*adminv1.AcquireLeaseResponse, error)
	hbFn      func(*adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error)
	// releaseHangs makes ReleaseLease wait for its context, like a
	// blackholed admin.
	releaseHangs bool
	s            fakeSessions
	// proxyHBs and registers are every ProxyHeartbeat and RegisterProxy
	// request, in order; forgetProxy answers the next proxy heartbeat
	// NotFound, as an admin that lost the registration.
	proxyHBs    []*adminv1.ProxyHeartbeatRequest
	registers   []*adminv1.RegisterProxyRequest
	forgetProxy bool
}

func newFakeAdmin(ev *events) *fakeAdmin {
	return &fakeAdmin{ev: ev, assign: make(chan *adminv1.WatchAssignmentsResponse, 16), epoch: 4, ttl: 10 * time.Second}
}

func (f *fakeAdmin) RegisterProxy(_ context.Context, in *adminv1.RegisterProxyRequest, _ ...grpc.CallOption) (*adminv1.RegisterProxyResponse, error) {
	f.ev.add("admin register %s %s", in.GetRegistration().GetProxyId(), in.GetRegistration().GetAddress())
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registers = append(f.registers, proto.CloneOf(in))
	return &adminv1.RegisterProxyResponse{}, nil
}

func (f *fakeAdmin) ProxyHeartbeat(_ context.Context, in *adminv1.ProxyHeartbeatRequest, _ ...grpc.CallOption) (*adminv1.ProxyHeartbeatResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxyHBs = append(f.proxyHBs, proto.CloneOf(in))
	if f.forgetProxy {
		f.forgetProxy = false
		return nil, status.Error(codes.NotFound, "proxy not registered")
	}
	return &adminv1.ProxyHeartbeatResponse{}, nil
}

// proxyReports are the proxy heartbeats and registrations seen so far.
func (f *fakeAdmin) proxyReports() ([]*adminv1.ProxyHeartbeatRequest, []*adminv1.RegisterProxyRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.proxyHBs), slices.Clone(f.registers)
}

func (f *fakeAdmin) grant(req *adminv1.AcquireLeaseRequest) *adminv1.AcquireLeaseResponse {
	f.epoch++
	return &adminv1.AcquireLeaseResponse{Granted: true, Lease: &adminv1.Lease{
		MailboxId: req.GetMailboxId(), RunnerId: req.GetRunnerId(), RunnerAddress: req.GetRunnerAddress(),
		Epoch: f.epoch, Ttl: durationpb.New(f.ttl),
	}}
}

func (f *fakeAdmin) AcquireLease(_ context.Context, in *adminv1.AcquireLeaseRequest, _ ...grpc.CallOption) (*adminv1.AcquireLeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ev.add("admin acquire %s %s %s", in.GetMailboxId(), in.GetRunnerId(), in.GetRunnerAddress())
	if f.acquireFn != nil {
		if resp, err := f.acquireFn(in); resp != nil || err != nil {
			return resp, err
		}
	}
	return f.grant(in), nil
}

func (f *fakeAdmin) MailboxHeartbeat(_ context.Context, in *adminv1.MailboxHeartbeatRequest, _ ...grpc.CallOption) (*adminv1.MailboxHeartbeatResponse, error) {
	f.mu.Lock()
	fn, ttl := f.hbFn, f.ttl
	f.mu.Unlock()
	f.ev.add("admin heartbeat %s %d events=%d", in.GetMailboxId(), in.GetEpoch(), in.GetStats().GetEventsStored())
	if fn != nil {
		return fn(in)
	}
	return &adminv1.MailboxHeartbeatResponse{Renewed: true, Epoch: in.GetEpoch(), Ttl: durationpb.New(ttl)}, nil
}

func (f *fakeAdmin) ReleaseLease(ctx context.Context, in *adminv1.ReleaseLeaseRequest, _ ...grpc.CallOption) (*adminv1.ReleaseLeaseResponse, error) {
	f.ev.add("admin release %s %d", in.GetMailboxId(), in.GetEpoch())
	f.mu.Lock()
	hang := f.releaseHangs
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &adminv1.ReleaseLeaseResponse{Released: true}, nil
}

func (f *fakeAdmin) setHeartbeat(fn func(*adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hbFn = fn
}

func (f *fakeAdmin) setAcquire(fn func(*adminv1.AcquireLeaseRequest) (*adminv1.AcquireLeaseResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acquireFn = fn
}

func (f *fakeAdmin) WatchAssignments(ctx context.Context, _ *adminv1.WatchAssignmentsRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[adminv1.WatchAssignmentsResponse], error) {
	return &fakeStream{ctx: ctx, ch: f.assign}, nil
}

type fakeStream struct {
	grpc.ClientStream
	ctx context.Context
	ch  chan *adminv1.WatchAssignmentsResponse
}

func (s *fakeStream) Recv() (*adminv1.WatchAssignmentsResponse, error) {
	select {
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	case m, ok := <-s.ch:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	}
}

// fakeRunner keeps mailbox states the way mailbox/control does.
type fakeRunner struct {
	ev *events
	mu sync.Mutex
	mb map[string]*runnerv1.MailboxStatus
	// closeGate, when set, holds CloseMailbox until closed: a slow drain.
	closeGate chan struct{}
	// down makes every call fail Unavailable, like a runner that cannot
	// be told gone: a broken connection, a runner that does not accept.
	down bool
	// refused makes every call fail Unavailable and Refusing true, like a
	// runner that exited (its control port refuses connections); dialed
	// is closed when it starts again (start).
	refused bool
	dialed  chan struct{}
	// paused makes every call time out (DeadlineExceeded), like a runner
	// stopped (SIGSTOP) that may or may not have taken the call before.
	paused bool
	// openGate, when set, holds OpenMailbox of openGated until closed: a
	// slow runner.
	openGate  chan struct{}
	openGated string
	// stuck names a mailbox whose close and fence fail Unavailable, as
	// when the call times out.
	stuck string
	// noBulk answers ExtendMailboxes Unimplemented, as an older runner.
	noBulk bool
	// openErr fails the open of a mailbox with its error, as a runner
	// whose store for it is damaged.
	openErr map[string]error
	// activateGate, when set, holds every ActivateMailbox until closed: a
	// runner starting many consumers at once.
	activateGate chan struct{}
	// stall, when set, makes the next GetStats advance the clock by it and
	// fail DeadlineExceeded: the sidecar stopped (SIGSTOP) while its probe
	// was in flight, and its timeout fired before it read the answer.
	stall time.Duration
	// stallID, when set, keeps the stall for a probe of that mailbox.
	stallID string
	// statsErr, when set, fails every GetStats with it, the runner
	// answering its other calls: too busy to answer its stats in time.
	statsErr error
	// granted records every validity the runner was handed.
	granted []grant
	// allowed is each mailbox's recovery peers as AllowRecovery last set them.
	allowed map[string][]string
}

// grant is a validity handed to the runner: by call ("activate", "open",
// "extend"), received at (the fake clock), with its boot clock bound.
type grant struct {
	call, id string
	at       time.Time
	validFor time.Duration
	bound    *runnerv1.BoottimeBound
}

// grantLocked records a validity handed to the runner; r.mu is held.
func (r *fakeRunner) grantLocked(call, id string, validFor time.Duration, bound *runnerv1.BoottimeBound) {
	r.granted = append(r.granted, grant{call: call, id: id, at: r.ev.clk.Now(), validFor: validFor, bound: bound})
}

// grants is what grantLocked recorded.
func (r *fakeRunner) grants() []grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.granted)
}

// failOpen makes every open of mailbox id fail with err (nil: succeed).
func (r *fakeRunner) failOpen(id string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.openErr == nil {
		r.openErr = map[string]error{}
	}
	r.openErr[id] = err
}

// setDown kills (true) or restarts (false) the runner's control API; its
// mailboxes are kept, as after a pause.
func (r *fakeRunner) setDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
}

// exit stops the runner as a process that exited: its control port
// refuses connections.
func (r *fakeRunner) exit() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = true
}

// start starts the runner again after exit: it listens, knows no mailbox
// (a new process has none until its sidecar opens them), and the next dial
// connects.
func (r *fakeRunner) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = false
	r.mb = map[string]*runnerv1.MailboxStatus{}
	close(r.dialed)
	r.dialed = make(chan struct{})
}

// Refusing implements RunnerConn.
func (r *fakeRunner) Refusing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused
}

// Dialed implements RunnerConn.
func (r *fakeRunner) Dialed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dialed
}

// unreachable is the error every call gets while the runner is down;
// callers hold r.mu.
func (r *fakeRunner) unreachable(call string) error {
	if r.refused {
		r.ev.add("runner refused %s", call)
		return status.Error(codes.Unavailable, "connection error: dial tcp 127.0.0.1:7071: connect: connection refused")
	}
	if r.paused {
		r.ev.add("runner paused %s", call)
		return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	if !r.down {
		return nil
	}
	r.ev.add("runner down %s", call)
	return status.Error(codes.Unavailable, "connection refused")
}

func newFakeRunner(ev *events) *fakeRunner {
	return &fakeRunner{ev: ev, mb: map[string]*runnerv1.MailboxStatus{}, dialed: make(chan struct{})}
}

func (r *fakeRunner) OpenMailbox(_ context.Context, in *runnerv1.OpenMailboxRequest, _ ...grpc.CallOption) (*runnerv1.OpenMailboxResponse, error) {
	r.mu.Lock()
	if gate := r.openGate; gate != nil && in.GetMailboxId() == r.openGated {
		r.ev.add("runner open held %s", in.GetMailboxId())
		r.mu.Unlock()
		<-gate
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	if err := r.unreachable("open"); err != nil {
		return nil, err
	}
	if err := r.openErr[in.GetMailboxId()]; err != nil {
		r.ev.add("runner open failed %s", in.GetMailboxId())
		return nil, err
	}
	r.ev.add("runner open %s %d", in.GetMailboxId(), in.GetEpoch())
	st, ok := r.mb[in.GetMailboxId()]
	if !ok {
		st = &runnerv1.MailboxStatus{MailboxId: in.GetMailboxId(), State: runnerv1.MailboxState_MAILBOX_STATE_OPEN}
		r.mb[in.GetMailboxId()] = st
	}
	if in.GetEpoch() != 0 {
		r.grantLocked("open", in.GetMailboxId(), in.GetValidFor().AsDuration(), in.GetBound())
		st.State, st.Epoch = runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, in.GetEpoch()
	}
	return &runnerv1.OpenMailboxResponse{Status: st}, nil
}

func (r *fakeRunner) ActivateMailbox(_ context.Context, in *runnerv1.ActivateMailboxRequest, _ ...grpc.CallOption) (*runnerv1.ActivateMailboxResponse, error) {
	r.mu.Lock()
	gate := r.activateGate
	r.mu.Unlock()
	if gate != nil {
		r.ev.add("runner activate held %s", in.GetMailboxId())
		<-gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("activate"); err != nil {
		return nil, err
	}
	r.ev.add("runner activate %s %d valid_for=%v", in.GetMailboxId(), in.GetEpoch(), in.GetValidFor().AsDuration())
	st, ok := r.mb[in.GetMailboxId()]
	if !ok {
		return nil, status.Error(codes.NotFound, "not open")
	}
	r.grantLocked("activate", in.GetMailboxId(), in.GetValidFor().AsDuration(), in.GetBound())
	st.State, st.Epoch, st.Drained = runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, in.GetEpoch(), false
	return &runnerv1.ActivateMailboxResponse{Status: st}, nil
}

func (r *fakeRunner) ExtendMailbox(_ context.Context, in *runnerv1.ExtendMailboxRequest, _ ...grpc.CallOption) (*runnerv1.ExtendMailboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("extend"); err != nil {
		return nil, err
	}
	r.ev.add("runner extend %s %d valid_for=%v", in.GetMailboxId(), in.GetEpoch(), in.GetValidFor().AsDuration())
	r.grantLocked("extend", in.GetMailboxId(), in.GetValidFor().AsDuration(), in.GetBound())
	return &runnerv1.ExtendMailboxResponse{}, nil
}

// ExtendMailboxes records "runner bulk-extend N" and then each mailbox as
// ExtendMailbox does; Unimplemented while noBulk, as an older runner.
func (r *fakeRunner) ExtendMailboxes(_ context.Context, in *runnerv1.ExtendMailboxesRequest, _ ...grpc.CallOption) (*runnerv1.ExtendMailboxesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noBulk {
		r.ev.add("runner bulk-extend unimplemented")
		return nil, status.Error(codes.Unimplemented, "unknown method ExtendMailboxes")
	}
	if err := r.unreachable("bulk-extend"); err != nil {
		return nil, err
	}
	r.ev.add("runner bulk-extend %d", len(in.GetMailboxes()))
	resp := &runnerv1.ExtendMailboxesResponse{}
	for _, m := range in.GetMailboxes() {
		r.ev.add("runner extend %s %d valid_for=%v", m.GetMailboxId(), m.GetEpoch(), m.GetValidFor().AsDuration())
		r.grantLocked("extend", m.GetMailboxId(), m.GetValidFor().AsDuration(), m.GetBound())
		resp.Results = append(resp.Results, &runnerv1.ExtendMailboxResult{MailboxId: m.GetMailboxId(), Status: &runnerv1.MailboxStatus{}})
	}
	return resp, nil
}

func (r *fakeRunner) FenceMailbox(_ context.Context, in *runnerv1.FenceMailboxRequest, _ ...grpc.CallOption) (*runnerv1.FenceMailboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("fence"); err != nil {
		return nil, err
	}
	if in.GetMailboxId() == r.stuck {
		r.ev.add("runner stuck fence %s", in.GetMailboxId())
		return nil, status.Error(codes.Unavailable, "timed out")
	}
	r.ev.add("runner fence %s %s", in.GetMailboxId(), in.GetReason())
	if st, ok := r.mb[in.GetMailboxId()]; ok {
		st.State = runnerv1.MailboxState_MAILBOX_STATE_FENCED
	}
	return &runnerv1.FenceMailboxResponse{}, nil
}

func (r *fakeRunner) CloseMailbox(_ context.Context, in *runnerv1.CloseMailboxRequest, _ ...grpc.CallOption) (*runnerv1.CloseMailboxResponse, error) {
	r.mu.Lock()
	gate := r.closeGate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("close"); err != nil {
		return nil, err
	}
	if in.GetMailboxId() == r.stuck {
		r.ev.add("runner stuck close %s", in.GetMailboxId())
		return nil, status.Error(codes.Unavailable, "timed out")
	}
	r.ev.add("runner close %s", in.GetMailboxId())
	_, ok := r.mb[in.GetMailboxId()]
	delete(r.mb, in.GetMailboxId())
	return &runnerv1.CloseMailboxResponse{Closed: ok}, nil
}

func (r *fakeRunner) Drain(_ context.Context, in *runnerv1.DrainRequest, _ ...grpc.CallOption) (*runnerv1.DrainResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("drain"); err != nil {
		return nil, err
	}
	r.ev.add("runner drain %s", strings.Join(in.GetMailboxIds(), ","))
	ids := in.GetMailboxIds()
	if len(ids) == 0 {
		for id := range r.mb {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var drained []string
	for _, id := range ids {
		if st, ok := r.mb[id]; ok && st.GetState() == runnerv1.MailboxState_MAILBOX_STATE_ACTIVE {
			st.Drained = true
			drained = append(drained, id)
		}
	}
	return &runnerv1.DrainResponse{Drained: drained}, nil
}

func (r *fakeRunner) AllowRecovery(_ context.Context, in *runnerv1.AllowRecoveryRequest, _ ...grpc.CallOption) (*runnerv1.AllowRecoveryResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("allow-recovery"); err != nil {
		return nil, err
	}
	if _, ok := r.mb[in.GetMailboxId()]; !ok {
		return nil, status.Errorf(codes.NotFound, "mailbox %q is not open", in.GetMailboxId())
	}
	if r.allowed == nil {
		r.allowed = map[string][]string{}
	}
	r.allowed[in.GetMailboxId()] = slices.Clone(in.GetProxyIds())
	return &runnerv1.AllowRecoveryResponse{}, nil
}

func (r *fakeRunner) GetStats(_ context.Context, in *runnerv1.GetStatsRequest, _ ...grpc.CallOption) (*runnerv1.GetStatsResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unreachable("stats"); err != nil {
		return nil, err
	}
	if r.statsErr != nil {
		r.ev.add("runner stats failed")
		return nil, r.statsErr
	}
	if d := r.stall; d > 0 && (r.stallID == "" || r.stallID == in.GetMailboxId()) {
		r.stall = 0
		r.ev.add("runner stats stalled %v", d)
		r.ev.clk.Step(d)
		return nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	if in.GetMailboxId() == "" {
		resp := &runnerv1.GetStatsResponse{}
		for _, id := range slices.Sorted(maps.Keys(r.mb)) {
			resp.Mailboxes = append(resp.Mailboxes, proto.CloneOf(r.mb[id]))
		}
		return resp, nil
	}
	st, ok := r.mb[in.GetMailboxId()]
	if !ok {
		return nil, status.Error(codes.NotFound, "not open")
	}
	c := proto.CloneOf(st)
	c.EventsStored, c.Consuming = 42, true
	return &runnerv1.GetStatsResponse{Mailboxes: []*runnerv1.MailboxStatus{c}}, nil
}

// harness is an agent over the fakes with a fake clock.
type harness struct {
	t      *testing.T
	clk    *clocktesting.FakeClock
	ev     *events
	admin  *fakeAdmin
	runner *fakeRunner
	agent  *Agent
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	t0     time.Time

	stopOnce sync.Once
	stopErr  error
}

// stop ends Run (the SIGTERM path) and returns its error.
func (h *harness) stop() error {
	h.stopOnce.Do(func() {
		h.cancel()
		select {
		case h.stopErr = <-h.done:
		case <-time.After(20 * time.Second):
			h.stopErr = fmt.Errorf("agent did not stop")
		}
	})
	return h.stopErr
}

const (
	testTTL      = 10 * time.Second
	testInterval = 3 * time.Second
)

func newHarness(t *testing.T, opts ...func(*Config)) *harness {
	t.Helper()
	t0 := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	ev := &events{clk: clk}
	h := &harness{t: t, clk: clk, ev: ev, admin: newFakeAdmin(ev), runner: newFakeRunner(ev), reg: prometheus.NewRegistry(), t0: t0}
	cfg := Config{
		ProxyID: "p1", AdvertiseAddr: "10.0.0.1:9090",
		LeaseTTL: testTTL, HeartbeatInterval: testInterval, StopTimeout: 4 * time.Second, RPCTimeout: 30 * time.Second,
		Backoff: wait.Backoff{Duration: time.Second, Factor: 1, Steps: 1 << 30},
		// The per-mailbox path unless a test asks for sessions.
		LeaseMode: LeaseModeMailbox,
		Admin:     h.admin, Runner: h.runner, RunnerConn: h.runner, Clock: clk,
		Jitter:     func(d time.Duration) time.Duration { return d },
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: h.reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.agent = a
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		if err := h.stop(); err != nil && strings.Contains(err.Error(), "did not stop") {
			t.Error(err)
		}
	})
	return h
}

func (h *harness) assign(index uint64, namespaces ...string) {
	msg := &adminv1.WatchAssignmentsResponse{ProxyId: "p1", Index: index}
	for _, ns := range namespaces {
		msg.Assignments = append(msg.Assignments, &adminv1.NamespaceAssignment{
			Namespace: ns, MailboxId: ns + "@p1", Config: &adminv1.NamespaceConfig{Topics: []string{ns + ".events"}},
		})
	}
	h.admin.assign <- msg
}

// waitFor polls cond in real time: the agent's goroutines run on their own.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s; events:\n%s", what, h.ev)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (h *harness) waitEvent(from int, prefix string) (int, event) {
	h.t.Helper()
	var i int
	var e event
	h.waitFor(prefix, func() bool {
		var ok bool
		i, e, ok = h.ev.find(from, prefix)
		return ok
	})
	return i, e
}

// settle waits until n timers are armed on the fake clock: the proxy
// heartbeat loop's and one per idle mailbox worker, so that a Step lands on
// goroutines that are all waiting.
func (h *harness) settle(n int) {
	h.t.Helper()
	h.waitFor(fmt.Sprintf("%d clock waiters", n), func() bool { return h.clk.Waiters() == n })
}

func (h *harness) lease(id string) LeaseView {
	for _, v := range h.agent.Leases() {
		if v.MailboxID == id {
			return v
		}
	}
	return LeaseView{}
}

// forget drops a mailbox as a restarted runner would.
func (r *fakeRunner) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.mb, id)
}

// The fake admin's Sessions service: one session at a time, scripted
// keepalive and open answers.
type fakeSessions struct {
	nextSession uint64
	sessions    map[uint64]bool
	openFn      func(*adminv1.OpenSessionRequest) (*adminv1.OpenSessionResponse, error)
	keepAliveFn func(*adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error)
	// acquireLeasesFn, when it returns an error, fails the whole call.
	acquireLeasesFn func(*adminv1.AcquireLeasesRequest) error
}

func (f *fakeAdmin) OpenSession(_ context.Context, in *adminv1.OpenSessionRequest, _ ...grpc.CallOption) (*adminv1.OpenSessionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ev.add("admin open-session %s %s %s", in.GetProxyId(), in.GetRunnerId(), in.GetRunnerAddress())
	if f.s.openFn != nil {
		if resp, err := f.s.openFn(in); resp != nil || err != nil {
			return resp, err
		}
	}
	if f.s.sessions == nil {
		f.s.sessions = map[uint64]bool{}
	}
	f.s.nextSession++
	f.s.sessions[f.s.nextSession] = true
	return &adminv1.OpenSessionResponse{Session: &adminv1.Session{Id: f.s.nextSession, ProxyId: in.GetProxyId(), Ttl: durationpb.New(f.ttl)}}, nil
}

func (f *fakeAdmin) KeepAliveSession(_ context.Context, in *adminv1.KeepAliveSessionRequest, _ ...grpc.CallOption) (*adminv1.KeepAliveSessionResponse, error) {
	f.mu.Lock()
	fn, ttl := f.s.keepAliveFn, f.ttl
	f.mu.Unlock()
	f.ev.add("admin keepalive %d", in.GetSessionId())
	if fn != nil {
		return fn(in)
	}
	return &adminv1.KeepAliveSessionResponse{Renewed: true, Ttl: durationpb.New(ttl)}, nil
}

func (f *fakeAdmin) CloseSession(_ context.Context, in *adminv1.CloseSessionRequest, _ ...grpc.CallOption) (*adminv1.CloseSessionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ev.add("admin close-session %d", in.GetSessionId())
	closed := f.s.sessions[in.GetSessionId()]
	delete(f.s.sessions, in.GetSessionId())
	return &adminv1.CloseSessionResponse{Closed: closed}, nil
}

func (f *fakeAdmin) AcquireLeases(_ context.Context, in *adminv1.AcquireLeasesRequest, _ ...grpc.CallOption) (*adminv1.AcquireLeasesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ev.add("admin acquire-leases %d %s", in.GetSessionId(), strings.Join(in.GetMailboxIds(), ","))
	if f.s.acquireLeasesFn != nil {
		if err := f.s.acquireLeasesFn(in); err != nil {
			return nil, err
		}
	}
	if !f.s.sessions[in.GetSessionId()] {
		return &adminv1.AcquireLeasesResponse{Refusal: &adminv1.LeaseRefusal{Reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION}}, nil
	}
	resp := &adminv1.AcquireLeasesResponse{}
	for _, id := range in.GetMailboxIds() {
		req := &adminv1.AcquireLeaseRequest{MailboxId: id, RunnerId: in.GetProxyId()}
		if f.acquireFn != nil {
			if r, err := f.acquireFn(req); err == nil && r != nil && !r.GetGranted() {
				resp.Results = append(resp.Results, &adminv1.MailboxLeaseResult{MailboxId: id, Refusal: r.GetRefusal()})
				continue
			}
		}
		l := f.grant(req).GetLease()
		l.SessionId = in.GetSessionId()
		resp.Results = append(resp.Results, &adminv1.MailboxLeaseResult{MailboxId: id, Ok: true, Lease: l})
	}
	return resp, nil
}

func (f *fakeAdmin) ReleaseLeases(_ context.Context, in *adminv1.ReleaseLeasesRequest, _ ...grpc.CallOption) (*adminv1.ReleaseLeasesResponse, error) {
	f.ev.add("admin release-leases %d %s", in.GetSessionId(), strings.Join(in.GetMailboxIds(), ","))
	resp := &adminv1.ReleaseLeasesResponse{}
	for _, id := range in.GetMailboxIds() {
		resp.Results = append(resp.Results, &adminv1.MailboxLeaseResult{MailboxId: id, Ok: true})
	}
	return resp, nil
}

func (f *fakeAdmin) setKeepAlive(fn func(*adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.keepAliveFn = fn
}

func (f *fakeAdmin) setOpen(fn func(*adminv1.OpenSessionRequest) (*adminv1.OpenSessionResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.openFn = fn
}

// sessionMode runs the harness's agent on sessions.
func sessionMode(c *Config) { c.LeaseMode = LeaseModeSession }

// setLag sets the lag the runner reports for mailbox id (nil: unknown).
func (r *fakeRunner) setLag(id string, lag *int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, ok := r.mb[id]; ok {
		st.Lag = lag
	}
}

// setPositions sets the stored positions the runner reports for mailbox id.
func (r *fakeRunner) setPositions(id string, ps ...*runnerv1.StoredPosition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, ok := r.mb[id]; ok {
		st.StoredPositions = ps
	}
}

// giveUpDownRunner steps an agent whose runner went down at its activation
// (t0) through the probe under the bound (t0+3s, which leaves the event
// probed; check runs then) to the give-up at the first probe past it
// (t0+6s), and on to the deadline the runner was handed (t0+10s); waiters
// is how many clock waiters the agent has while it waits.
func (h *harness) giveUpDownRunner(waiters int, probed string, check func()) {
	h.t.Helper()
	h.settle(waiters)
	h.clk.Step(testInterval)
	h.waitEvent(0, probed)
	check()
	h.settle(waiters)
	h.clk.Step(testInterval)
	_, giveUp := h.waitEvent(0, "runner down fence")
	if !giveUp.at.Equal(h.t0.Add(2 * testInterval)) {
		h.t.Fatalf("gave up at %v, want at the first probe past the bound (t0+6s)", giveUp.at)
	}
	h.settle(waiters)
	h.clk.Step(testTTL - 2*testInterval)
}
