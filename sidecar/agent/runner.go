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
// (unreachable, or an error other than NotFound) for the runner-dead bound
// since the runner last answered at lastOK, ready again at its first answer.
// Only the bound flips it to not ready, so a runner that is slow or paused
// for less never moves a namespace. It returns when the runner last
// answered, and its answer (nil if none), whose lags the heartbeat reports.
// A failed probe counts as the runner's silence only up to its timeout
// (failedBy).
func (a *Agent) judgeRunner(ctx context.Context, lastOK time.Time) (time.Time, *runnerv1.GetStatsResponse) {
	timeout := a.probeTimeout(a.cfg.HeartbeatInterval)
	sentAt := a.cfg.Clock.Now()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	stats, err := a.cfg.Runner.GetStats(pctx, &runnerv1.GetStatsRequest{})
	cancel()
	now := a.cfg.Clock.Now()
	if err == nil || status.Code(err) == codes.NotFound {
		if a.runnerNotReady.Swap(false) {
			a.log.Info("runner answers again; reporting it ready, so the proxy takes namespaces again", "down_for", now.Sub(lastOK))
		}
		a.m.runnerReady.Set(1)
		return now, stats
	}
	if ctx.Err() != nil {
		return lastOK, nil
	}
	bound := a.cfg.proxyRunnerDeadAfter()
	if down := failedBy(sentAt, timeout, now).Sub(lastOK); down >= bound && !a.runnerNotReady.Swap(true) {
		a.m.runnerReady.Set(0)
		a.log.Warn("runner unreachable past the bound; reporting it not ready, so the proxy's namespaces move to other proxies",
			"down_for", down, "runner_dead_after", bound, "err", err)
	}
	return lastOK, nil
}

// failedBy is when a probe of the runner sent at sentAt with timeout, which
// failed as seen at now, shows the runner silent until: now, but no later
// than the timeout, by which the runner had to answer. A sidecar stopped
// meanwhile (SIGSTOP, a stall of the machine) sees a probe fail long after
// its timeout, perhaps with the runner's answer unread, and must not count
// its own pause as the runner's silence: a pause of the sidecar shorter
// than ttl keeps every lease.
func failedBy(sentAt time.Time, timeout time.Duration, now time.Time) time.Time {
	if by := sentAt.Add(timeout); by.Before(now) {
		return by
	}
	return now
}
