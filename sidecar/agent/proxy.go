package agent

import (
	"context"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

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
			if a.life.reach(phaseRegistered) {
				a.log.Info("proxy registered", "index", resp.GetIndex(), "assignments", len(resp.GetAssignments()))
			}
			return true
		}
		retry := a.m.retryWait("register", err, &bo)
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
	sil := newSilence(a.cfg.Clock.Now(), a.rn.probeTimeout(a.cfg.HeartbeatInterval), a.cfg.HeartbeatInterval)
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
// report no positions (docs/architecture.md#moves). A mailbox the runner does not report, or
// reports without a lag, is sent with lag_known false; without positions,
// with none. A mailbox the runner failed to open OpenFailuresReported times
// in a row is reported open_failed with the runner's error, so the admin
// places the namespace on another proxy (docs/architecture.md#the-sidecar).
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
	if down := sil.observe(sentAt, now, err, a.rn.heard()); down >= bound && !a.runnerNotReady.Swap(true) {
		a.m.runnerReady.Set(0)
		a.log.Warn("runner unreachable past the bound; reporting it not ready, so the proxy's namespaces move to other proxies",
			"down_for", down, "runner_dead_after", bound, "err", err)
	}
	return nil
}
