package server

import (
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"
)

// The session metrics follow a session's life: the open sessions and their
// leases per session, every keepalive's answer, and each end by its reason
// with the leases it took along.
func TestSessionMetrics(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n, cp, _, cc := startSingleAt(t, clk, time.Hour)
	ss := adminv1.NewSessionsClient(cc)
	c := ctx(t)
	placeOn(t, c, cp, "p", "r1", "a")
	placeOn(t, c, cp, "p", "r1", "b")
	open := func(ttl time.Duration) uint64 {
		t.Helper()
		r, err := ss.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001", Ttl: durationpb.New(ttl)})
		if err != nil || r.GetSession().GetId() == 0 {
			t.Fatalf("open: %v, %v", r, err)
		}
		return r.GetSession().GetId()
	}
	held, empty := open(time.Second), open(time.Hour)
	if r, err := ss.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "p", SessionId: held, MailboxIds: []string{"a@p", "b@p"}}); err != nil || !r.GetResults()[1].GetOk() {
		t.Fatalf("acquire: %v, %v", r, err)
	}
	keepAlive := func(proxy string, sid uint64) {
		t.Helper()
		_, _ = ss.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: proxy, SessionId: sid})
	}
	keepAlive("p", held)
	keepAlive("p", held)
	keepAlive("p", held+1000)
	keepAlive("q", held)

	want := func(metric string, v float64) {
		t.Helper()
		if got := scrapeValue(t, n, metric); got != v {
			t.Fatalf("%s = %v, want %v", metric, got, v)
		}
	}
	want("prism_admin_sessions", 2)
	want("prism_admin_session_leases_count", 2)
	want("prism_admin_session_leases_sum", 2)
	want(`prism_admin_session_leases_bucket{le="0"}`, 1)
	want(`prism_admin_session_leases_bucket{le="1"}`, 1)
	want(`prism_admin_session_leases_bucket{le="10"}`, 2)
	want(`prism_admin_session_keepalives_total{result="renewed"}`, 2)
	want(`prism_admin_session_keepalives_total{result="unknown_session"}`, 1)
	want(`prism_admin_session_keepalives_total{result="permission_denied"}`, 1)

	if r, err := ss.CloseSession(c, &adminv1.CloseSessionRequest{ProxyId: "p", SessionId: empty}); err != nil || !r.GetClosed() {
		t.Fatalf("close: %v, %v", r, err)
	}
	want(`prism_admin_sessions_ended_total{reason="closed"}`, 1)
	want(`prism_admin_session_leases_ended_total{reason="closed"}`, 0)

	// Silent past ttl + grace (the admin's default grace): the session
	// ends with both its leases.
	clk.Step(time.Second + 5*time.Second + 2*n.Server.cfg.ExpiryInterval)
	awaitState(t, "the silent session to expire", func() bool { s, _ := n.FSM.Session(held); return s == nil })
	awaitState(t, "the expiry counted", func() bool {
		return scrapeValue(t, n, `prism_admin_sessions_ended_total{reason="expired"}`) == 1
	})
	want(`prism_admin_session_leases_ended_total{reason="expired"}`, 2)
	want("prism_admin_sessions", 0)
	want("prism_admin_session_leases_count", 0)
	keepAlive("p", held)
	want(`prism_admin_session_keepalives_total{result="unknown_session"}`, 2)
}
