package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/util/wait"
)

// acquire asks for the lease until granted; it returns the lease and when
// the granted request was sent, or false if the worker was stopped.
func (w *worker) acquire() (*adminv1.Lease, time.Time, bool) {
	bo := w.cfg.Backoff
	var lastRefusal adminv1.LeaseRefusalReason
	for {
		req := &adminv1.AcquireLeaseRequest{MailboxId: w.id, RunnerId: w.cfg.RunnerID, RunnerAddress: w.cfg.AdvertiseAddr}
		if w.cfg.LeaseTTL > 0 {
			req.Ttl = durationpb.New(w.cfg.LeaseTTL)
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RPCTimeout)
		sentAt := w.cfg.Clock.Now()
		resp, err := w.cfg.Admin.AcquireLease(ctx, req)
		cancel()
		switch {
		case err == nil && resp.GetGranted():
			w.m.acquires.WithLabelValues("granted").Inc()
			return resp.GetLease(), sentAt, true
		case err == nil:
			w.m.acquires.WithLabelValues("refused").Inc()
			r := resp.GetRefusal()
			if r.GetReason() != lastRefusal {
				w.log.Info("lease refused; retrying", "reason", r.GetReason().String(), "holder", r.GetCurrent().GetRunnerId(), "holder_epoch", r.GetCurrent().GetEpoch(), "message", r.GetMessage())
				lastRefusal = r.GetReason()
			}
		default:
			if w.ctx.Err() != nil {
				return nil, time.Time{}, false
			}
			w.m.acquires.WithLabelValues("error").Inc()
		}
		retry := w.m.retryWait("acquire", err, &bo)
		if err != nil {
			w.log.Warn("acquire failed; retrying", "err", err, "retry_in", retry)
		}
		if !sleep(w.ctx, w.cfg.Clock, retry) {
			return nil, time.Time{}, false
		}
	}
}

// mailboxLease is a lease held on its own (LeaseModeMailbox), renewed by
// MailboxHeartbeat: the hold loop starts each heartbeat when due, at most
// one in flight, and the heartbeat first probes the runner for the
// mailbox's stats, which it carries (docs/architecture.md#the-sidecar).
type mailboxLease struct {
	w         *worker
	epoch     uint64
	deadAfter time.Duration
	g         *renewable
	board     *probeBoard

	mu sync.Mutex
	// next is when the next heartbeat is due; inflight while one is sent.
	next     time.Time
	inflight bool
	// changed is closed and replaced whenever next or inflight changes.
	changed chan struct{}
	// sil is the runner's silence as the probes counted it, which the
	// heartbeat in flight owns.
	sil silence
	bo  wait.Backoff
}

var _ validity = (*mailboxLease)(nil)

// newMailboxLease follows l, granted to the acquire sent at sentAt: valid
// for its ttl (else the one asked for), heartbeated at its interval when
// shorter than the configured one, and at least twice within the ttl.
func newMailboxLease(w *worker, l *adminv1.Lease, sentAt time.Time) *mailboxLease {
	cfg := w.cfg
	ttl := l.GetTtl().AsDuration()
	if ttl <= 0 {
		ttl = cfg.LeaseTTL
	}
	interval := cfg.HeartbeatInterval
	if li := l.GetHeartbeatInterval().AsDuration(); li > 0 && li < interval {
		interval = li
	}
	interval = min(interval, ttl/3)
	return &mailboxLease{
		w: w, epoch: l.GetEpoch(), deadAfter: w.runnerDeadAfter(interval, ttl),
		g: newRenewable(0, sentAt, ttl, interval), board: newProbeBoard(),
		inflight: true, changed: make(chan struct{}), bo: cfg.Backoff,
	}
}

func (ml *mailboxLease) renewable() *renewable { return ml.g }
func (ml *mailboxLease) probes() *probeBoard   { return ml.board }

// serve starts the heartbeats: the first one interval (jittered) after the
// acquire was sent, the runner's silence counted from now, the activation
// being its last answer.
func (ml *mailboxLease) serve() (unserve func()) {
	cfg := ml.w.cfg
	ml.mu.Lock()
	defer ml.mu.Unlock()
	ml.sil = newSilence(cfg.Clock.Now(), ml.w.rn.probeTimeout(ml.g.every), ml.g.every)
	ml.settleLocked(ml.g.window().lastAckSent.Add(cfg.Jitter(ml.g.every)))
	// A heartbeat still in flight renews nothing the worker follows after
	// this: the hold loop alone extends the runner's deadline.
	return func() {}
}

func (ml *mailboxLease) renewDue(now time.Time) (time.Time, <-chan struct{}) {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	if ml.inflight {
		return time.Time{}, ml.changed
	}
	if now.Before(ml.next) {
		return ml.next, ml.changed
	}
	ml.inflight = true
	go ml.heartbeat(ml.sil)
	return time.Time{}, ml.changed
}

// renewed hands the runner the time left after an acknowledged heartbeat.
func (ml *mailboxLease) renewed(until time.Time) { ml.w.extend(ml.epoch, until) }

// settleLocked records that the heartbeat in flight ended and when the next
// is due; ml.mu must be held.
func (ml *mailboxLease) settleLocked(next time.Time) {
	ml.next, ml.inflight = next, false
	close(ml.changed)
	ml.changed = make(chan struct{})
}

func (ml *mailboxLease) settle(next time.Time, sil silence) {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	ml.sil = sil
	ml.settleLocked(next)
}

// heartbeat probes the runner, publishes the probe, and sends one heartbeat
// with the runner's stats. A slow runner delays it by at most one interval:
// its stats are not worth the lease. A runner given up on (givingUp: it has
// failed its probes for deadAfter, this one counted into sil, or it is
// gone) gets no heartbeat: its probe is final, and the hold loop gives the
// lease up instead. A refusal loses the lease; a failure is retried with
// backoff, the fence not depending on it.
func (ml *mailboxLease) heartbeat(sil silence) {
	w, cfg := ml.w, ml.w.cfg
	ctx, cancel := context.WithTimeout(w.ctx, cfg.RPCTimeout)
	defer cancel()
	probeSent := cfg.Clock.Now()
	stats, mailboxes, runnerErr := w.probe(ctx, ml.epoch, ml.g.every)
	sentAt := cfg.Clock.Now()
	down := sil.observe(probeSent, sentAt, runnerErr, w.rn.heard())
	p := probeResult{sentAt: probeSent, silence: sil, mailboxes: mailboxes, err: runnerErr, final: w.rn.givingUp(runnerErr, down, ml.deadAfter)}
	ml.board.publish(p)
	if p.final {
		return
	}
	resp, err := cfg.Admin.MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: w.id, RunnerId: cfg.RunnerID, Epoch: ml.epoch, Stats: stats})
	if reason, detail, lost := refused(resp.GetRefusal(), err); lost {
		w.m.heartbeats.WithLabelValues("refused").Inc()
		ml.g.lose(reason, detail)
		return
	}
	if err != nil || !resp.GetRenewed() {
		w.m.heartbeats.WithLabelValues("error").Inc()
		retry := ml.bo.Step()
		w.log.Warn("heartbeat failed; retrying", "epoch", ml.epoch, "err", err, "retry_in", retry, "fence_in", ml.g.window().until.Sub(cfg.Clock.Now()))
		ml.settle(cfg.Clock.Now().Add(retry), sil)
		return
	}
	w.m.heartbeats.WithLabelValues("renewed").Inc()
	w.m.hbLatency.Observe(cfg.Clock.Since(sentAt).Seconds())
	ml.bo = cfg.Backoff
	// Due first, then renewed: the hold loop that wakes at the renewal
	// finds the next heartbeat's time already set.
	ml.settle(sentAt.Add(cfg.Jitter(ml.g.every)), sil)
	ml.g.renew(sentAt, resp.GetTtl().AsDuration())
}

// refused tells a lost lease from a failure to reach the leader: ref is the
// answer's refusal, err the call's error, which may carry one.
func refused(ref *adminv1.LeaseRefusal, err error) (reason, detail string, lost bool) {
	if err != nil {
		var ok bool
		if ref, ok = mesh.RefusalFrom(err); !ok {
			return "", "", false
		}
	}
	if ref == nil || ref.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER || ref.GetReason() == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNSPECIFIED {
		return "", "", false
	}
	return refusalReason(ref), ref.GetMessage(), true
}

// refusalReason is a refusal's reason as a metric label: "expired".
func refusalReason(ref *adminv1.LeaseRefusal) string {
	return strings.ToLower(strings.TrimPrefix(ref.GetReason().String(), "LEASE_REFUSAL_REASON_"))
}

// release gives the lease back; every outcome is logged and counted.
// A lease of a session is released in it (ReleaseLeases), one on its own
// with ReleaseLease.
func (w *worker) release(ctx context.Context, cause string, epoch uint64) error {
	var (
		released bool
		refusal  *adminv1.LeaseRefusal
		index    uint64
		err      error
	)
	sessionID := w.view().SessionID
	if sessionID != 0 {
		var r *adminv1.MailboxLeaseResult
		r, index, err = w.sess.release(ctx, sessionID, w.id)
		released, refusal = r.GetOk(), r.GetRefusal()
	} else {
		var resp *adminv1.ReleaseLeaseResponse
		resp, err = w.cfg.Admin.ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: w.id, RunnerId: w.cfg.RunnerID, Epoch: epoch})
		released, refusal, index = resp.GetReleased(), resp.GetRefusal(), resp.GetIndex()
	}
	log := w.log.With("epoch", epoch, "cause", cause)
	if sessionID != 0 {
		log = log.With("session_id", sessionID)
	}
	switch {
	case err != nil:
		w.m.releases.WithLabelValues(cause, "error").Inc()
		log.Error("lease release failed; it expires after ttl + grace", "err", err)
		return err
	case released:
		w.m.releases.WithLabelValues(cause, "released").Inc()
		log.Info("lease released", "index", index)
	case refusal != nil:
		w.m.releases.WithLabelValues(cause, "refused").Inc()
		log.Warn("lease release refused: it was no longer ours", "reason", refusal.GetReason().String(), "message", refusal.GetMessage())
	default:
		w.m.releases.WithLabelValues(cause, "absent").Inc()
		log.Info("lease already gone at release")
	}
	w.update(func(v *LeaseView) { v.State = StateFenced })
	return nil
}
