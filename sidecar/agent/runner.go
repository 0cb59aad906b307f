package agent

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// proxyRunnerDeadAfter is how long the runner may fail the proxy
// heartbeat's probe before the proxy reports it not ready:
// Config.RunnerDeadAfter, else three heartbeat intervals, at most half the
// ttl asked for (the workers' bound, taken from the sidecar's settings since
// a proxy holds no single lease to take it from).
func (c *Config) proxyRunnerDeadAfter() time.Duration {
	if c.RunnerDeadAfter > 0 {
		return c.RunnerDeadAfter
	}
	d := 3 * c.HeartbeatInterval
	if c.LeaseTTL > 0 {
		d = min(d, c.LeaseTTL/2)
	}
	return d
}

// judgeRunner probes the runner's control API (its stats) and records
// whether the proxy's runner is ready: not once the probe has failed
// (unreachable, or an error other than NotFound) for the runner-dead bound,
// counted in sil (silence: never the sidecar's own pause), ready again at
// its first answer. Only the bound flips it to not ready, so a runner that
// is slow or paused for less never moves a namespace. It returns the
// runner's answer (nil if none), whose lags the heartbeat reports.
func (a *Agent) judgeRunner(ctx context.Context, sil *silence) *runnerv1.GetStatsResponse {
	sentAt := a.cfg.Clock.Now()
	pctx, cancel := context.WithTimeout(ctx, sil.timeout)
	stats, err := a.cfg.Runner.GetStats(pctx, &runnerv1.GetStatsRequest{})
	cancel()
	now := a.cfg.Clock.Now()
	if err == nil || status.Code(err) == codes.NotFound {
		if was := sil.down(); a.runnerNotReady.Swap(false) {
			a.log.Info("runner answers again; reporting it ready, so the proxy takes namespaces again", "down_for", was)
		}
		sil.observe(sentAt, now, nil, time.Time{})
		a.m.runnerReady.Set(1)
		return stats
	}
	if ctx.Err() != nil {
		return nil
	}
	bound := a.cfg.proxyRunnerDeadAfter()
	if down := sil.observe(sentAt, now, err, a.heard()); down >= bound && !a.runnerNotReady.Swap(true) {
		a.m.runnerReady.Set(0)
		a.log.Warn("runner unreachable past the bound; reporting it not ready, so the proxy's namespaces move to other proxies",
			"down_for", down, "runner_dead_after", bound, "err", err)
	}
	return nil
}

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
