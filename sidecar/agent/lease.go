package agent

import (
	"context"
	"strings"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// acquire asks for the lease until granted; it returns the lease and when
// the granted request was sent, or false if the worker was stopped.
func (w *worker) acquire() (*adminv1.Lease, time.Time, bool) {
	bo := w.a.cfg.Backoff
	var lastRefusal adminv1.LeaseRefusalReason
	for {
		req := &adminv1.AcquireLeaseRequest{MailboxId: w.id, RunnerId: w.a.cfg.RunnerID, RunnerAddress: w.a.cfg.AdvertiseAddr}
		if w.a.cfg.LeaseTTL > 0 {
			req.Ttl = durationpb.New(w.a.cfg.LeaseTTL)
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
		sentAt := w.a.cfg.Clock.Now()
		resp, err := w.a.cfg.Admin.AcquireLease(ctx, req)
		cancel()
		switch {
		case err == nil && resp.GetGranted():
			w.a.m.acquires.WithLabelValues("granted").Inc()
			return resp.GetLease(), sentAt, true
		case err == nil:
			w.a.m.acquires.WithLabelValues("refused").Inc()
			r := resp.GetRefusal()
			if r.GetReason() != lastRefusal {
				w.log.Info("lease refused; retrying", "reason", r.GetReason().String(), "holder", r.GetCurrent().GetRunnerId(), "holder_epoch", r.GetCurrent().GetEpoch(), "message", r.GetMessage())
				lastRefusal = r.GetReason()
			}
		default:
			if w.ctx.Err() != nil {
				return nil, time.Time{}, false
			}
			w.a.m.acquires.WithLabelValues("error").Inc()
		}
		retry := w.a.retryWait("acquire", err, &bo)
		if err != nil {
			w.log.Warn("acquire failed; retrying", "err", err, "retry_in", retry)
		}
		if !sleep(w.ctx, w.a.cfg.Clock, retry) {
			return nil, time.Time{}, false
		}
	}
}

type hbResult struct {
	sentAt     time.Time
	resp       *adminv1.MailboxHeartbeatResponse
	err        error
	runnerLost bool // the runner no longer serves the mailbox actively
	// runnerErr is why the runner's control API did not answer the stats
	// probe (nil if it did, NotFound included).
	runnerErr error
	// silence is hold's judgment of the runner with this probe counted.
	silence silence
	// giveUp: the runner is given up on (givingUp); no heartbeat was sent.
	giveUp bool
}

// refused tells a lost lease from a failure to reach the leader.
func refused(r hbResult) (reason, detail string, lost bool) {
	ref := r.resp.GetRefusal()
	if r.err != nil {
		var ok bool
		if ref, ok = mesh.RefusalFrom(r.err); !ok {
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

// heartbeat sends one heartbeat with the runner's stats, in the background.
// A slow runner delays it by at most one interval: its stats are not worth
// the lease. A runner given up on (givingUp: it has failed its probes for
// deadAfter, this one counted into sil, hold's, handed over until the
// result comes back, or it is gone) gets no heartbeat: hold gives the lease
// up instead.
func (w *worker) heartbeat(epoch uint64, interval time.Duration, sil silence, deadAfter time.Duration) chan hbResult {
	ch := make(chan hbResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(w.ctx, w.a.cfg.RPCTimeout)
		defer cancel()
		probeSent := w.a.cfg.Clock.Now()
		stats, lost, runnerErr := w.probe(ctx, epoch, interval)
		sentAt := w.a.cfg.Clock.Now()
		if down := sil.observe(probeSent, sentAt, runnerErr, w.a.heard()); w.a.givingUp(runnerErr, down, deadAfter) {
			ch <- hbResult{runnerErr: runnerErr, silence: sil, giveUp: true}
			return
		}
		resp, err := w.a.cfg.Admin.MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: w.id, RunnerId: w.a.cfg.RunnerID, Epoch: epoch, Stats: stats})
		ch <- hbResult{sentAt: sentAt, resp: resp, err: err, runnerLost: lost, runnerErr: runnerErr, silence: sil}
	}()
	return ch
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
		r, index, err = w.a.sess.release(ctx, sessionID, w.id)
		released, refusal = r.GetOk(), r.GetRefusal()
	} else {
		var resp *adminv1.ReleaseLeaseResponse
		resp, err = w.a.cfg.Admin.ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: w.id, RunnerId: w.a.cfg.RunnerID, Epoch: epoch})
		released, refusal, index = resp.GetReleased(), resp.GetRefusal(), resp.GetIndex()
	}
	log := w.log.With("epoch", epoch, "cause", cause)
	if sessionID != 0 {
		log = log.With("session_id", sessionID)
	}
	switch {
	case err != nil:
		w.a.m.releases.WithLabelValues(cause, "error").Inc()
		log.Error("lease release failed; it expires after ttl + grace", "err", err)
		return err
	case released:
		w.a.m.releases.WithLabelValues(cause, "released").Inc()
		log.Info("lease released", "index", index)
	case refusal != nil:
		w.a.m.releases.WithLabelValues(cause, "refused").Inc()
		log.Warn("lease release refused: it was no longer ours", "reason", refusal.GetReason().String(), "message", refusal.GetMessage())
	default:
		w.a.m.releases.WithLabelValues(cause, "absent").Inc()
		log.Info("lease already gone at release")
	}
	w.update(func(v *LeaseView) { v.State = StateFenced })
	return nil
}
