package agent

import (
	"context"
	"time"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// heardRunner is the runner's control client noting when the runner last
// answered a call of any kind (Agent.heardAt): proof of life that ends its
// silence (silence.heard), as a probe's answer does. An answer is what a
// probe takes for one: success, or NotFound from the runner itself.
type heardRunner struct {
	runnerv1.RunnerControlClient
	a *Agent
}

func (r heardRunner) note(err error) {
	if err == nil || status.Code(err) == codes.NotFound {
		now := r.a.cfg.Clock.Now()
		r.a.heardAt.Store(&now)
	}
}

// heard is when the runner last answered any call (zero if never).
func (a *Agent) heard() time.Time {
	if t := a.heardAt.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

func (r heardRunner) OpenMailbox(ctx context.Context, in *runnerv1.OpenMailboxRequest, opts ...grpc.CallOption) (*runnerv1.OpenMailboxResponse, error) {
	resp, err := r.RunnerControlClient.OpenMailbox(ctx, in, opts...)
	r.note(err)
	if err == nil {
		// A mailbox opened afresh allows no recovery peers yet.
		r.a.allow.opened(in.GetMailboxId())
	}
	return resp, err
}

func (r heardRunner) ActivateMailbox(ctx context.Context, in *runnerv1.ActivateMailboxRequest, opts ...grpc.CallOption) (*runnerv1.ActivateMailboxResponse, error) {
	resp, err := r.RunnerControlClient.ActivateMailbox(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) ExtendMailbox(ctx context.Context, in *runnerv1.ExtendMailboxRequest, opts ...grpc.CallOption) (*runnerv1.ExtendMailboxResponse, error) {
	resp, err := r.RunnerControlClient.ExtendMailbox(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) ExtendMailboxes(ctx context.Context, in *runnerv1.ExtendMailboxesRequest, opts ...grpc.CallOption) (*runnerv1.ExtendMailboxesResponse, error) {
	resp, err := r.RunnerControlClient.ExtendMailboxes(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) FenceMailbox(ctx context.Context, in *runnerv1.FenceMailboxRequest, opts ...grpc.CallOption) (*runnerv1.FenceMailboxResponse, error) {
	resp, err := r.RunnerControlClient.FenceMailbox(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) CloseMailbox(ctx context.Context, in *runnerv1.CloseMailboxRequest, opts ...grpc.CallOption) (*runnerv1.CloseMailboxResponse, error) {
	resp, err := r.RunnerControlClient.CloseMailbox(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) Drain(ctx context.Context, in *runnerv1.DrainRequest, opts ...grpc.CallOption) (*runnerv1.DrainResponse, error) {
	resp, err := r.RunnerControlClient.Drain(ctx, in, opts...)
	r.note(err)
	return resp, err
}

func (r heardRunner) GetStats(ctx context.Context, in *runnerv1.GetStatsRequest, opts ...grpc.CallOption) (*runnerv1.GetStatsResponse, error) {
	resp, err := r.RunnerControlClient.GetStats(ctx, in, opts...)
	r.note(err)
	return resp, err
}

// runnerBound reads the boot clock, before the caller reads its lease clock
// to count a valid_for from now, and returns the bound that makes of that
// valid_for the same end as an instant on the boot clock, or nil without
// one. valid_for alone counts from when the runner gets the call, which
// may be long after it was sent if the runner was paused meanwhile
// (docs/architecture.md#fencing); read first, the bound never ends after
// the lease clock's end.
func (a *Agent) runnerBound() func(validFor time.Duration) *runnerv1.BoottimeBound {
	now, ok := a.cfg.Boottime()
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
func (a *Agent) startSlot(ctx context.Context) (func(), bool) {
	select {
	case a.starts <- struct{}{}:
		return func() { <-a.starts }, true
	case <-ctx.Done():
		return nil, false
	}
}

// runnerDialed is RunnerConn.Dialed, nil without a RunnerConn; taken before
// a call to the runner, for awaitRunner after it fails.
func (a *Agent) runnerDialed() <-chan struct{} {
	if a.cfg.RunnerConn == nil {
		return nil
	}
	return a.cfg.RunnerConn.Dialed()
}

// awaitRunner waits d before the next call to the runner after one failed,
// or less when the runner is gone: until a dial to it connects (it started
// again), so that its mailboxes are opened, acquired and served again as
// soon as it listens. dialed is runnerDialed from before the failed call,
// so a runner that started again since then is called again at once.
// False if ctx ended first.
func (a *Agent) awaitRunner(ctx context.Context, d time.Duration, dialed <-chan struct{}) bool {
	// Refusing first: a dial that connects clears it and closes dialed at
	// once, so one of the two is seen.
	refusing := a.runnerRefusing()
	select {
	case <-dialed:
		return ctx.Err() == nil
	default:
	}
	if !refusing {
		return sleep(ctx, a.cfg.Clock, d)
	}
	t := a.cfg.Clock.NewTimer(d)
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
func (a *Agent) probeTimeout(interval time.Duration) time.Duration {
	return min(a.cfg.RPCTimeout/2, interval)
}
