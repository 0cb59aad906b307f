package lease

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

const sessionTTL = 6 * time.Second

// openWith opens a session of proxy p for its runner and acquires a@p and
// b@p in it.
func (n *node) openWith() uint64 {
	n.t.Helper()
	r := n.apply(&adminv1.Command{Body: &adminv1.Command_OpenSession{OpenSession: &adminv1.OpenSessionRequest{
		ProxyId: "p", RunnerId: n.runner, RunnerAddress: "10.0.0.1:9090", Ttl: durationpb.New(sessionTTL),
	}}}).(*adminv1.OpenSessionResponse)
	sid := r.GetSession().GetId()
	got := n.apply(&adminv1.Command{Body: &adminv1.Command_AcquireLeases{AcquireLeases: &adminv1.AcquireLeasesRequest{
		ProxyId: "p", SessionId: sid, MailboxIds: []string{"a@p", "b@p"},
	}}}).(*adminv1.AcquireLeasesResponse)
	for _, res := range got.GetResults() {
		if !res.GetOk() {
			n.t.Fatalf("acquire in session: %v", res)
		}
	}
	return sid
}

func keepAlive(sid uint64) *adminv1.KeepAliveSessionRequest {
	return &adminv1.KeepAliveSessionRequest{ProxyId: "p", SessionId: sid}
}

// A session renewed in time keeps all its leases for as long as it is
// renewed, with no per-lease expiry request ever; once silent it is
// requested for expiry after exactly ttl + grace, once, and the FSM ends it
// and its leases in one entry.
func TestSessionKeepAliveAndExpiry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		rounds   int
	}{
		{"a third of the ttl", sessionTTL / 3, 30},
		{"just under ttl + grace", sessionTTL + fsm.DefaultLeaseGrace - time.Millisecond, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.register("r1")
			n.l.Promote()
			sid := n.openWith()
			for i := range tc.rounds {
				n.clk.Step(tc.interval)
				res, err := keepAliveNow(n.l, keepAlive(sid))
				if err != nil || !res.GetRenewed() || !res.GetExpiresAt().AsTime().Equal(n.clk.Now().Add(sessionTTL)) {
					t.Fatalf("round %d: keepalive %v, %v", i, res, err)
				}
				if refs, ids := n.l.Expired(), n.l.ExpiredSessions(); len(refs) != 0 || len(ids) != 0 {
					t.Fatalf("round %d: expiry requested while renewed: %v %v", i, refs, ids)
				}
			}
			if l, _ := n.fsm.Lease("a@p"); !n.l.Annotate(l).GetExpiresAt().AsTime().Equal(n.clk.Now().Add(sessionTTL)) {
				t.Fatalf("lease expiry does not follow the session: %v", n.l.Annotate(l))
			}
			// Silence.
			n.clk.Step(sessionTTL + fsm.DefaultLeaseGrace)
			if ids := n.l.ExpiredSessions(); len(ids) != 0 {
				t.Fatalf("expired at exactly ttl + grace: %v", ids)
			}
			n.clk.Step(time.Millisecond)
			ids := n.l.ExpiredSessions()
			if len(ids) != 1 || ids[0] != sid {
				t.Fatalf("expired sessions %v, want [%d]", ids, sid)
			}
			if again := n.l.ExpiredSessions(); len(again) != 0 {
				t.Fatalf("requested twice: %v", again)
			}
			if refs := n.l.Expired(); len(refs) != 0 {
				t.Fatalf("session leases requested one by one: %v", refs)
			}
			before := n.fsm.AppliedIndex()
			res := n.apply(&adminv1.Command{Body: &adminv1.Command_ExpireSessions{ExpireSessions: &adminv1.ExpireSessionsCommand{SessionIds: ids}}}).(*fsm.ExpireSessionsResult)
			if len(res.Leases) != 2 || n.fsm.AppliedIndex() != before+1 || n.fsm.Counts().Leases != 0 {
				t.Fatalf("expire ended %d leases in %d entries; %d left", len(res.Leases), n.fsm.AppliedIndex()-before, n.fsm.Counts().Leases)
			}
			if n.l.Sessions() != 0 || n.l.Len() != 0 {
				t.Fatalf("mirror keeps %d sessions, %d leases", n.l.Sessions(), n.l.Len())
			}
			if r, _ := keepAliveNow(n.l, keepAlive(sid)); r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION {
				t.Fatalf("keepalive after expiry: %v", r)
			}
		})
	}
}

// Refusals: not primary, another proxy's session, a session past its
// deadline, and a per-mailbox heartbeat for a lease that lives in a session.
func TestSessionKeepAliveRefusals(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.register("r1")
	sid := n.openWith()
	if r, _ := keepAliveNow(n.l, keepAlive(sid)); r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER {
		t.Fatalf("follower renewed: %v", r)
	}
	n.l.Promote()
	if _, err := keepAliveNow(n.l, &adminv1.KeepAliveSessionRequest{ProxyId: "q", SessionId: sid}); !errors.Is(err, fsm.ErrSessionNotOwned) {
		t.Fatalf("another proxy's keepalive: %v", err)
	}
	l, _ := n.fsm.Lease("a@p")
	if r := renewNow(n.l, hb("a@p", "r1", l.GetEpoch())); r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION {
		t.Fatalf("per-mailbox heartbeat of a session lease: %v", r)
	}
	n.clk.Step(sessionTTL + extend + fsm.DefaultLeaseGrace + time.Millisecond)
	if r, _ := keepAliveNow(n.l, keepAlive(sid)); r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED {
		t.Fatalf("late keepalive: %v", r)
	}
}

// A new leader, or a primary restoring a snapshot, gives every session a
// full ttl + ExtendOnPromote from then, whatever the old leader knew.
func TestSessionsOnPromotionAndRestore(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.register("r1")
	sid := n.openWith()
	snap, err := n.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		l    func() *Lessor
	}{
		{"promotion", func() *Lessor {
			n.clk.Step(time.Hour)
			n.l.Promote()
			return n.l
		}},
		{"restore while primary", func() *Lessor {
			m := newNode(t)
			m.clk.SetTime(n.clk.Now())
			m.l.Promote()
			if err := m.fsm.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
				t.Fatal(err)
			}
			if m.l.Sessions() != 1 || m.l.Len() != 2 {
				t.Fatalf("restored %d sessions, %d leases", m.l.Sessions(), m.l.Len())
			}
			n.clk = m.clk
			return m.l
		}},
	} {
		l := tc.l()
		start := n.clk.Now()
		var due time.Duration
		for due == 0 && n.clk.Now().Sub(start) < time.Minute {
			n.clk.Step(10 * time.Millisecond)
			if ids := l.ExpiredSessions(); len(ids) == 1 && ids[0] == sid {
				due = n.clk.Now().Sub(start)
			}
		}
		if want := sessionTTL + extend + fsm.DefaultLeaseGrace; due <= want || due > want+10*time.Millisecond {
			t.Fatalf("%s: session due at +%s, want just after %s", tc.name, due, want)
		}
	}
}

// A session is expired after the largest grace of its leases, each lease
// keeping its namespace's (config.lease.grace) or the default: never before
// any lease's own grace has passed, and a shorter grace only when every
// lease has it. Releasing the lease with the largest grace brings the
// deadline back; a restore counts the graces again.
func TestSessionGraceIsTheLargestOfItsLeases(t *testing.T) {
	t.Parallel()
	const long, short = 20 * time.Second, time.Second
	tests := []struct {
		name      string
		mailboxes []string
		release   []string
		restore   bool
		want      time.Duration
	}{
		{"default only", []string{"a@p", "b@p"}, nil, false, fsm.DefaultLeaseGrace},
		{"a namespace's longer grace", []string{"a@p", "long@p"}, nil, false, long},
		{"a namespace's shorter grace, alone", []string{"short@p"}, nil, false, short},
		{"shorter beside the default", []string{"a@p", "short@p"}, nil, false, fsm.DefaultLeaseGrace},
		{"the longest released", []string{"a@p", "long@p"}, []string{"long@p"}, false, fsm.DefaultLeaseGrace},
		{"after a restore", []string{"a@p", "long@p"}, nil, true, long},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.register("r1")
			for ns, g := range map[string]time.Duration{"long": long, "short": short} {
				n.apply(&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
					Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}, Lease: &adminv1.LeaseConfig{Grace: durationpb.New(g)}},
				}}})
			}
			n.l.Promote()
			sid := n.apply(&adminv1.Command{Body: &adminv1.Command_OpenSession{OpenSession: &adminv1.OpenSessionRequest{
				ProxyId: "p", RunnerId: "r1", RunnerAddress: "10.0.0.1:9090", Ttl: durationpb.New(sessionTTL),
			}}}).(*adminv1.OpenSessionResponse).GetSession().GetId()
			got := n.apply(&adminv1.Command{Body: &adminv1.Command_AcquireLeases{AcquireLeases: &adminv1.AcquireLeasesRequest{
				ProxyId: "p", SessionId: sid, MailboxIds: tc.mailboxes,
			}}}).(*adminv1.AcquireLeasesResponse)
			for _, r := range got.GetResults() {
				want := fsm.DefaultLeaseGrace
				switch r.GetMailboxId() {
				case "long@p":
					want = long
				case "short@p":
					want = short
				}
				if !r.GetOk() || r.GetLease().GetGrace().AsDuration() != want {
					t.Fatalf("grant %v, want ok with grace %s", r, want)
				}
			}
			if len(tc.release) > 0 {
				n.apply(&adminv1.Command{Body: &adminv1.Command_ReleaseLeases{ReleaseLeases: &adminv1.ReleaseLeasesRequest{
					ProxyId: "p", SessionId: sid, MailboxIds: tc.release,
				}}})
			}
			if tc.restore {
				snap, err := n.fsm.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				sink := &memSink{}
				if err := snap.Persist(sink); err != nil {
					t.Fatal(err)
				}
				if err := n.fsm.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
					t.Fatal(err)
				}
			}
			if res, err := keepAliveNow(n.l, keepAlive(sid)); err != nil || !res.GetRenewed() {
				t.Fatalf("keepalive: %v, %v", res, err)
			}
			n.clk.Step(sessionTTL + tc.want)
			if ids := n.l.ExpiredSessions(); len(ids) != 0 {
				t.Fatalf("expired at ttl + %s: %v", tc.want, ids)
			}
			n.clk.Step(time.Millisecond)
			if ids := n.l.ExpiredSessions(); len(ids) != 1 || ids[0] != sid {
				t.Fatalf("expired sessions %v just past ttl + %s, want [%d]", ids, tc.want, sid)
			}
		})
	}
}
