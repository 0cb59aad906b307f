package agent

import (
	"context"
	"time"

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
		sil.observe(sentAt, now, nil)
		a.m.runnerReady.Set(1)
		return stats
	}
	if ctx.Err() != nil {
		return nil
	}
	bound := a.cfg.proxyRunnerDeadAfter()
	if down := sil.observe(sentAt, now, err); down >= bound && !a.runnerNotReady.Swap(true) {
		a.m.runnerReady.Set(0)
		a.log.Warn("runner unreachable past the bound; reporting it not ready, so the proxy's namespaces move to other proxies",
			"down_for", down, "runner_dead_after", bound, "err", err)
	}
	return nil
}
