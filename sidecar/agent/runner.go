package agent

import (
	"context"
	"sync/atomic"
	"time"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// runnerClient is the sidecar's one client of its runner's control API,
// which the proxy heartbeat, the session and every worker share: its calls
// note when the runner last answered (heard), it tells a runner that is
// gone from one that is only silent (runnerconn.go), bounds each valid_for
// on the boot clock, and hands out the turns to open or start a mailbox.
type runnerClient struct {
	runnerv1.RunnerControlClient
	cfg *Config
	// heardAt is when the runner last answered any call (heardRunner).
	heardAt atomic.Pointer[time.Time]
	// starts holds a token per call in flight that opens a store or
	// starts a consumer in the runner (startSlot).
	starts chan struct{}
}

// newRunnerClient wraps cfg.Runner; opened is told of every mailbox the
// runner opened afresh.
func newRunnerClient(cfg *Config, opened func(mailboxID string)) *runnerClient {
	rc := &runnerClient{cfg: cfg, starts: make(chan struct{}, maxRunnerStarts)}
	rc.RunnerControlClient = heardRunner{RunnerControlClient: cfg.Runner, rc: rc, opened: opened}
	return rc
}

// heardRunner is the runner's control client noting when the runner last
// answered a call of any kind (runnerClient.heardAt): proof of life that
// ends its silence (silence.heard), as a probe's answer does. An answer is
// what a probe takes for one: success, or NotFound from the runner itself.
type heardRunner struct {
	runnerv1.RunnerControlClient
	rc     *runnerClient
	opened func(mailboxID string)
}

// noted makes the call and notes its answer.
func noted[Req, Resp any](r heardRunner, call func(context.Context, Req, ...grpc.CallOption) (Resp, error), ctx context.Context, in Req, opts []grpc.CallOption) (Resp, error) {
	resp, err := call(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) note(err error) {
	if err == nil || status.Code(err) == codes.NotFound {
		now := r.rc.cfg.Clock.Now()
		r.rc.heardAt.Store(&now)
	}
}

// heard is when the runner last answered any call (zero if never).
func (rc *runnerClient) heard() time.Time {
	if t := rc.heardAt.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

func (r heardRunner) OpenMailbox(ctx context.Context, in *runnerv1.OpenMailboxRequest, opts ...grpc.CallOption) (*runnerv1.OpenMailboxResponse, error) {
	resp, err := r.RunnerControlClient.OpenMailbox(ctx, in, opts...)
	r.note(err)
	if err == nil {
		// A mailbox opened afresh allows no recovery peers yet.
		r.opened(in.GetMailboxId())
	}
	return resp, err
}

func (r heardRunner) ActivateMailbox(ctx context.Context, in *runnerv1.ActivateMailboxRequest, opts ...grpc.CallOption) (*runnerv1.ActivateMailboxResponse, error) {
	return noted(r, r.RunnerControlClient.ActivateMailbox, ctx, in, opts)
}

func (r heardRunner) ExtendMailbox(ctx context.Context, in *runnerv1.ExtendMailboxRequest, opts ...grpc.CallOption) (*runnerv1.ExtendMailboxResponse, error) {
	return noted(r, r.RunnerControlClient.ExtendMailbox, ctx, in, opts)
}

func (r heardRunner) ExtendMailboxes(ctx context.Context, in *runnerv1.ExtendMailboxesRequest, opts ...grpc.CallOption) (*runnerv1.ExtendMailboxesResponse, error) {
	return noted(r, r.RunnerControlClient.ExtendMailboxes, ctx, in, opts)
}

func (r heardRunner) FenceMailbox(ctx context.Context, in *runnerv1.FenceMailboxRequest, opts ...grpc.CallOption) (*runnerv1.FenceMailboxResponse, error) {
	return noted(r, r.RunnerControlClient.FenceMailbox, ctx, in, opts)
}

func (r heardRunner) CloseMailbox(ctx context.Context, in *runnerv1.CloseMailboxRequest, opts ...grpc.CallOption) (*runnerv1.CloseMailboxResponse, error) {
	return noted(r, r.RunnerControlClient.CloseMailbox, ctx, in, opts)
}

func (r heardRunner) Drain(ctx context.Context, in *runnerv1.DrainRequest, opts ...grpc.CallOption) (*runnerv1.DrainResponse, error) {
	return noted(r, r.RunnerControlClient.Drain, ctx, in, opts)
}

func (r heardRunner) GetStats(ctx context.Context, in *runnerv1.GetStatsRequest, opts ...grpc.CallOption) (*runnerv1.GetStatsResponse, error) {
	return noted(r, r.RunnerControlClient.GetStats, ctx, in, opts)
}

// runnerBound reads the boot clock, before the caller reads its lease clock
// to count a valid_for from now, and returns the bound that makes of that
// valid_for the same end as an instant on the boot clock, or nil without
// one. valid_for alone counts from when the runner gets the call, which
// may be long after it was sent if the runner was paused meanwhile
// (docs/architecture.md#fencing); read first, the bound never ends after
// the lease clock's end.
func (rc *runnerClient) bound() func(validFor time.Duration) *runnerv1.BoottimeBound {
	now, ok := rc.cfg.Boottime()
	return func(validFor time.Duration) *runnerv1.BoottimeBound {
		if !ok {
			return nil
		}
		return &runnerv1.BoottimeBound{BootId: now.BootID, ValidUntilBoottime: int64(now.Since + validFor)}
	}
}

// maxRunnerStarts bounds the calls that open a mailbox's store or start
// its consumer in the runner at once. The runner does each on its own
// goroutine, CPU-bound: a proxy's whole share assigned together would
// queue every other call behind them, the stats probe included, past the
// runner-dead bound, and each call queued there would time out
// (RPCTimeout) and be retried, where here it only waits its turn
// (docs/architecture.md#the-sidecar).
const maxRunnerStarts = 32

// startSlot waits for a turn to open or start a mailbox in the runner and
// returns its release; false if ctx ended first.
func (rc *runnerClient) startSlot(ctx context.Context) (func(), bool) {
	select {
	case rc.starts <- struct{}{}:
		return func() { <-rc.starts }, true
	case <-ctx.Done():
		return nil, false
	}
}

// dialed is RunnerConn.Dialed, nil without a RunnerConn; taken before a
// call to the runner, for await after it fails.
func (rc *runnerClient) dialed() <-chan struct{} {
	if rc.cfg.RunnerConn == nil {
		return nil
	}
	return rc.cfg.RunnerConn.Dialed()
}

// await waits d before the next call to the runner after one failed,
// or less when the runner is gone: until a dial to it connects (it started
// again), so that its mailboxes are opened, acquired and served again as
// soon as it listens. dialed is dialed() from before the failed call,
// so a runner that started again since then is called again at once.
// False if ctx ended first.
func (rc *runnerClient) await(ctx context.Context, d time.Duration, dialed <-chan struct{}) bool {
	// Refusing first: a dial that connects clears it and closes dialed at
	// once, so one of the two is seen.
	refusing := rc.refusing()
	select {
	case <-dialed:
		return ctx.Err() == nil
	default:
	}
	if !refusing {
		return sleep(ctx, rc.cfg.Clock, d)
	}
	t := rc.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
	case <-dialed:
	}
	return true
}

// probeTimeout bounds one stats probe of the runner made every interval.
func (rc *runnerClient) probeTimeout(interval time.Duration) time.Duration {
	return min(rc.cfg.RPCTimeout/2, interval)
}

// refusing reports whether the runner's control API refuses connections
// (RunnerConn.Refusing); false when the sidecar cannot tell.
func (rc *runnerClient) refusing() bool {
	return rc.cfg.RunnerConn != nil && rc.cfg.RunnerConn.Refusing()
}

// gone reports whether err, a failed call to the runner, leaves the runner
// provably serving nothing: its control API refuses connections.
func (rc *runnerClient) gone(err error) bool {
	return err != nil && rc.refusing()
}

// givingUp says whether a runner whose probe failed with err (nil: it
// answered), silent for down, is given up on: silent for deadAfter, or gone
// (its control API refuses connections: runnerconn.go), however short its
// silence. A runner that only does not answer (paused, slow) is never gone.
func (rc *runnerClient) givingUp(err error, down, deadAfter time.Duration) bool {
	return err != nil && (down >= deadAfter || rc.gone(err))
}
