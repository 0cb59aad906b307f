package lease

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"
)

var quiet = slog.New(slog.DiscardHandler)

var t0 = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

const (
	ttl    = 10 * time.Second
	grace  = 5 * time.Second
	extend = 2 * time.Second
)

// lease is a grant as the FSM would report it, made by a leader at t.
func lease(mailbox, runner string, epoch uint64, t time.Time) *adminv1.Lease {
	return &adminv1.Lease{
		MailboxId: mailbox, RunnerId: runner, Epoch: epoch, RunnerAddress: "10.0.0.1:9090",
		GrantedAt: timestamppb.New(t), LastHeartbeatAt: timestamppb.New(t), ExpiresAt: timestamppb.New(t.Add(ttl)),
		Ttl: durationpb.New(ttl), Grace: durationpb.New(grace),
	}
}

func newLessor(t *testing.T) (*Lessor, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	return New(Config{Clock: clk, ExtendOnPromote: extend, ExpiryRate: 100, ExpiryRetry: 3 * time.Second, Logger: quiet}), clk
}

func hb(mailbox, runner string, epoch uint64) *adminv1.MailboxHeartbeatRequest {
	return &adminv1.MailboxHeartbeatRequest{MailboxId: mailbox, RunnerId: runner, Epoch: epoch}
}

func TestRenew(t *testing.T) {
	t.Parallel()
	type reason = adminv1.LeaseRefusalReason
	cases := []struct {
		name    string
		primary bool
		after   time.Duration // clock advance after the grant at t0
		req     *adminv1.MailboxHeartbeatRequest
		want    reason // UNSPECIFIED means renewed
	}{
		{"holder renews", true, 3 * time.Second, hb("a@p", "r1", 7), 0},
		{"holder without epoch renews", true, 3 * time.Second, hb("a@p", "r1", 0), 0},
		{"holder past ttl but within grace renews", true, ttl + grace, hb("a@p", "r1", 7), 0},
		{"holder past ttl + grace is refused", true, ttl + grace + time.Nanosecond, hb("a@p", "r1", 7), adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED},
		{"other runner is refused", true, time.Second, hb("a@p", "r2", 0), adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER},
		{"stale incarnation is refused", true, time.Second, hb("a@p", "r1", 6), adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_STALE_EPOCH},
		{"unknown mailbox is refused", true, time.Second, hb("b@p", "r1", 0), adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE},
		{"follower refuses", false, time.Second, hb("a@p", "r1", 7), adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, clk := newLessor(t)
			if tc.primary {
				l.Promote()
			}
			l.LeaseGranted(lease("a@p", "r1", 7, t0))
			clk.Step(tc.after)
			res := renewNow(l, tc.req)
			if tc.want == 0 {
				if !res.GetRenewed() || !res.GetExpiresAt().AsTime().Equal(clk.Now().Add(ttl)) || res.GetEpoch() != 7 || res.GetTtl().AsDuration() != ttl {
					t.Fatalf("renew = %v, want renewed until now+ttl", res)
				}
				return
			}
			if res.GetRenewed() || res.GetRefusal().GetReason() != tc.want || res.GetRefusal().GetMessage() == "" {
				t.Fatalf("renew = %v, want refusal %v", res, tc.want)
			}
			if tc.want == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER && res.GetRefusal().GetCurrent().GetRunnerId() != "r1" {
				t.Fatalf("refusal does not name the holder: %v", res.GetRefusal())
			}
		})
	}
}

// firstExpiry advances the clock in small steps until the lessor requests
// an expire and returns that time.
func firstExpiry(t *testing.T, l *Lessor, clk *clocktesting.FakeClock, limit time.Duration) time.Time {
	t.Helper()
	start := clk.Now()
	for clk.Now().Sub(start) <= limit {
		if refs := l.Expired(); len(refs) > 0 {
			return clk.Now()
		}
		clk.Step(10 * time.Millisecond)
	}
	t.Fatalf("no expiry within %s", limit)
	return time.Time{}
}

func TestExpiryOnlyAfterTTLPlusGrace(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		renewAfter []time.Duration // heartbeats, as offsets from t0
		wantAfter  time.Duration   // expiry due strictly after t0 + this
	}{
		{"never renewed", nil, ttl + grace},
		{"renewed twice", []time.Duration{3 * time.Second, 9 * time.Second}, 9*time.Second + ttl + grace},
		{"renewed in grace", []time.Duration{ttl + grace}, ttl + grace + ttl + grace},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, clk := newLessor(t)
			l.Promote()
			l.LeaseGranted(lease("a@p", "r1", 1, t0))
			for _, at := range tc.renewAfter {
				clk.SetTime(t0.Add(at))
				if refs := l.Expired(); len(refs) > 0 {
					t.Fatalf("expired %v at %s, before its heartbeat", refs, at)
				}
				if res := renewNow(l, hb("a@p", "r1", 1)); !res.GetRenewed() {
					t.Fatalf("renew at %s: %v", at, res)
				}
			}
			got := firstExpiry(t, l, clk, time.Minute)
			if due := t0.Add(tc.wantAfter); !got.After(due) || got.Sub(due) > 10*time.Millisecond {
				t.Fatalf("expiry requested at t0+%s, want just after t0+%s", got.Sub(t0), tc.wantAfter)
			}
		})
	}
}

func TestPromoteExtendsEveryLease(t *testing.T) {
	t.Parallel()
	l, clk := newLessor(t)
	// Granted under an old leader, long enough ago that by the FSM's record
	// both have expired: the new leader heard no heartbeats yet.
	l.LeaseGranted(lease("a@p", "r1", 1, t0))
	l.LeaseGranted(lease("b@p", "r2", 2, t0.Add(time.Second)))
	clk.SetTime(t0.Add(time.Minute))
	if refs := l.Expired(); refs != nil {
		t.Fatalf("non-primary requested expiry: %v", refs)
	}
	l.Promote()
	promoted := clk.Now()
	if refs := l.Expired(); len(refs) > 0 {
		t.Fatalf("expired on promotion: %v", refs)
	}
	// b heartbeats to the new leader; a never does.
	clk.Step(ttl)
	if res := renewNow(l, hb("b@p", "r2", 2)); !res.GetRenewed() {
		t.Fatalf("renew after promotion: %v", res)
	}
	got := firstExpiry(t, l, clk, time.Minute)
	if due := promoted.Add(ttl + extend + grace); !got.After(due) || got.Sub(due) > 10*time.Millisecond {
		t.Fatalf("first expiry at promotion+%s, want just after promotion+ttl+extend+grace", got.Sub(promoted))
	}
	l.Demote()
	if res := renewNow(l, hb("b@p", "r2", 2)); res.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER {
		t.Fatalf("demoted lessor renewed: %v", res)
	}
	if refs := l.Expired(); refs != nil {
		t.Fatalf("demoted lessor requested expiry: %v", refs)
	}
}

// TestHolderStopsBeforeAnyoneElseCanAcquire checks the client-side stop rule
// (docs/architecture.md#client-side-stop)
// against the lessor: a sidecar that stops at ttl after sending its last
// acknowledged heartbeat is always stopped before the lease can be expired
// (and so before anyone else can acquire), whether the leader stays, or a
// new leader is promoted before or shortly after the acknowledgement (a
// deposed leader acks for at most the raft leader lease timeout, which is
// shorter than the election timeout used as the extension).
func TestHolderStopsBeforeAnyoneElseCanAcquire(t *testing.T) {
	t.Parallel()
	const leaderLeaseTimeout = 500 * time.Millisecond
	for _, sendToAck := range []time.Duration{0, 200 * time.Millisecond, time.Second} {
		// -1: no leader change; negative: the deposed leader acked after
		// its successor's promotion, by up to the raft leader lease timeout.
		for _, promoteAt := range []time.Duration{-1, -leaderLeaseTimeout, -3 * time.Second, 0, leaderLeaseTimeout, 5 * time.Second} {
			t.Run(fmt.Sprintf("ack+%s/promote%+v", sendToAck, promoteAt), func(t *testing.T) {
				t.Parallel()
				clk := clocktesting.NewFakeClock(t0)
				cfg := Config{Clock: clk, ExtendOnPromote: extend, Logger: quiet}
				oldLeader, newLeader := New(cfg), New(cfg)
				oldLeader.Promote()
				for _, l := range []*Lessor{oldLeader, newLeader} {
					l.LeaseGranted(lease("a@p", "r1", 1, t0))
				}
				// Late in the grant's ttl, so a new leader that trusted the
				// grant's expiry instead of refreshing would expire too early.
				sent := t0.Add(8 * time.Second)
				acked := sent.Add(sendToAck)
				clk.SetTime(acked)
				if !renewNow(oldLeader, hb("a@p", "r1", 1)).GetRenewed() {
					t.Fatal("heartbeat not acknowledged")
				}
				holderStops := sent.Add(ttl)
				leader := oldLeader
				if promoteAt != -1 {
					clk.SetTime(acked.Add(promoteAt))
					newLeader.Promote()
					leader = newLeader
				}
				if expiry := firstExpiry(t, leader, clk, 5*time.Minute); !expiry.After(holderStops) {
					t.Fatalf("lease expirable at %s, holder stops at %s", expiry.Sub(t0), holderStops.Sub(t0))
				}
			})
		}
	}
}

func TestExpiryRequestsAreRateLimitedAndRetried(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	l := New(Config{Clock: clk, ExpiryRate: 10, ExpiryBurst: 10, ExpiryRetry: 3 * time.Second, Logger: quiet})
	l.Promote()
	for i := range 25 {
		l.LeaseGranted(lease(fmt.Sprintf("m%02d@p", i), "r", uint64(i+1), t0))
	}
	clk.Step(ttl + grace + time.Millisecond)
	first := l.Expired()
	if len(first) != 10 || first[0].GetMailboxId() != "m00@p" {
		t.Fatalf("first batch %d (%v), want the burst of 10 in mailbox order", len(first), first)
	}
	if again := l.Expired(); len(again) != 0 {
		t.Fatalf("no tokens left but got %d", len(again))
	}
	clk.Step(time.Second)
	if second := l.Expired(); len(second) != 10 || second[0].GetMailboxId() != "m10@p" {
		t.Fatalf("second batch %v", second)
	}
	// The first ten were committed; the rest were not.
	for _, r := range first {
		l.LeaseRemoved(r.GetMailboxId(), r.GetEpoch())
	}
	clk.Step(time.Second)
	if third := l.Expired(); len(third) != 5 || third[0].GetMailboxId() != "m20@p" {
		t.Fatalf("third batch %v", third)
	}
	// m10..m19 were requested 1 s ago and not committed: they are offered
	// again only once ExpiryRetry (3 s) has passed.
	clk.Step(time.Second)
	if early := l.Expired(); len(early) != 0 {
		t.Fatalf("retried before ExpiryRetry: %v", early)
	}
	clk.Step(time.Second + time.Millisecond)
	if retry := l.Expired(); len(retry) != 10 || retry[0].GetMailboxId() != "m10@p" {
		t.Fatalf("retry batch %v", retry)
	}
	if l.Len() != 15 {
		t.Fatalf("%d leases mirrored, want 15", l.Len())
	}
}

func TestStaleRemovalNeverDropsANewGrant(t *testing.T) {
	t.Parallel()
	l, clk := newLessor(t)
	l.Promote()
	l.LeaseGranted(lease("a@p", "r1", 1, t0))
	clk.Step(ttl + grace + time.Millisecond)
	refs := l.Expired()
	if len(refs) != 1 {
		t.Fatalf("refs %v", refs)
	}
	// Before the expire commits, the mailbox is released and re-granted;
	// the FSM ignores the stale expire, and so must the mirror.
	l.LeaseRemoved("a@p", 1)
	l.LeaseGranted(lease("a@p", "r2", 5, clk.Now()))
	l.LeaseRemoved("a@p", 1)
	if res := renewNow(l, hb("a@p", "r2", 5)); !res.GetRenewed() {
		t.Fatalf("new grant lost: %v", res)
	}
	if refs := l.Expired(); len(refs) != 0 {
		t.Fatalf("new grant due at once: %v", refs)
	}
}

func TestCheckpointsAndAnnotate(t *testing.T) {
	t.Parallel()
	l, clk := newLessor(t)
	l.Promote()
	for _, m := range []string{"c@p", "a@p", "b@p"} {
		l.LeaseGranted(lease(m, "r1", 1, t0))
	}
	if cps := l.Checkpoints(10); len(cps) != 0 {
		t.Fatalf("checkpoints before any renewal: %v", cps)
	}
	clk.Step(time.Second)
	for _, m := range []string{"c@p", "a@p", "b@p"} {
		req := hb(m, "r1", 1)
		req.Stats = &adminv1.LeaseStats{EventsStored: 9}
		renewNow(l, req)
	}
	cps := l.Checkpoints(2)
	if len(cps) != 2 || cps[0].GetMailboxId() != "a@p" || cps[1].GetMailboxId() != "b@p" ||
		!cps[0].GetExpiresAt().AsTime().Equal(t0.Add(time.Second+ttl)) || cps[0].GetStats().GetEventsStored() != 9 {
		t.Fatalf("checkpoints %v", cps)
	}
	if rest := l.Checkpoints(10); len(rest) != 1 || rest[0].GetMailboxId() != "c@p" {
		t.Fatalf("rest %v", rest)
	}
	if none := l.Checkpoints(10); len(none) != 0 {
		t.Fatalf("checkpointed twice: %v", none)
	}
	stored := lease("a@p", "r1", 1, t0)
	if got := l.Annotate(stored); !got.GetExpiresAt().AsTime().Equal(t0.Add(time.Second+ttl)) || got.GetStats().GetEventsStored() != 9 || got == stored {
		t.Fatalf("annotate = %v", got)
	}
	if !stored.GetExpiresAt().AsTime().Equal(t0.Add(ttl)) {
		t.Fatal("annotate modified its argument")
	}
	if other := lease("a@p", "r1", 99, t0); l.Annotate(other) != other {
		t.Fatal("annotated a different epoch")
	}
}

func TestStaleProxies(t *testing.T) {
	t.Parallel()
	l, clk := newLessor(t)
	proxy := func(id string, seen time.Duration, status adminv1.ProxyStatus) *adminv1.Proxy {
		return &adminv1.Proxy{Registration: &adminv1.ProxyRegistration{ProxyId: id}, Status: status, LastSeen: timestamppb.New(t0.Add(seen))}
	}
	proxies := []*adminv1.Proxy{
		proxy("p1", 0, adminv1.ProxyStatus_PROXY_STATUS_LIVE),
		proxy("p2", 50*time.Second, adminv1.ProxyStatus_PROXY_STATUS_LIVE),
		proxy("p3", 0, adminv1.ProxyStatus_PROXY_STATUS_STALE),
	}
	clk.SetTime(t0.Add(40 * time.Second))
	if refs := l.StaleProxies(proxies, 30*time.Second); refs != nil {
		t.Fatalf("non-primary judged proxies: %v", refs)
	}
	l.Promote()
	clk.SetTime(t0.Add(60 * time.Second))
	if refs := l.StaleProxies(proxies, 30*time.Second); len(refs) != 0 {
		t.Fatalf("proxies judged stale within staleAfter of promotion: %v", refs)
	}
	clk.SetTime(t0.Add(71 * time.Second))
	refs := l.StaleProxies(proxies, 30*time.Second)
	if len(refs) != 1 || refs[0].GetProxyId() != "p1" || !refs[0].GetLastSeen().AsTime().Equal(t0) {
		t.Fatalf("stale = %v, want p1 with its last_seen", refs)
	}
}

// renewNow is a heartbeat that arrives now and is processed at once.
func renewNow(l *Lessor, req *adminv1.MailboxHeartbeatRequest) *adminv1.MailboxHeartbeatResponse {
	rc := l.ReceiveHeartbeat(req.GetMailboxId())
	defer rc.Close()
	return l.Renew(rc, req)
}

// keepAliveNow is a keepalive that arrives now and is processed at once.
func keepAliveNow(l *Lessor, req *adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error) {
	rc := l.ReceiveKeepAlive(req.GetSessionId())
	defer rc.Close()
	return l.KeepAlive(rc, req)
}
