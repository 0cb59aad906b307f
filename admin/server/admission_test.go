package server

import (
	"context"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// startAdmitting is a single leading node on clk with admission a, with
// proxy p (runner r1) holding a@p by AcquireLease and an open session.
func startAdmitting(t *testing.T, clk clock.WithTicker, a Admission) (*Node, adminv1.ControlPlaneClient, adminv1.SessionsClient, uint64) {
	t.Helper()
	n, cc := startNodeConn(t, NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, HTTPAddr: "127.0.0.1:0", Clock: clk, Admission: a})
	awaitState(t, "solo to lead", func() bool { l, _ := n.Raft.Leadership(); return l.IsLeader && n.Lessor.Primary() })
	cp, ss := adminv1.NewControlPlaneClient(cc), adminv1.NewSessionsClient(cc)
	c := ctx(t)
	placeOn(t, c, cp, "p", "r1", "a")
	if acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"}); err != nil || !acq.GetGranted() {
		t.Fatalf("acquire: %v, %v", acq, err)
	}
	open, err := ss.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	if err != nil {
		t.Fatal(err)
	}
	return n, cp, ss, open.GetSession().GetId()
}

// shed checks err is RESOURCE_EXHAUSTED with a positive retry hint.
func shed(t *testing.T, what string, err error) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("%s: %v, want ResourceExhausted", what, err)
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return
		}
	}
	t.Fatalf("%s: %v carries no RetryInfo with a delay", what, err)
}

// renewalsAndEssentials checks that heartbeats, keepalives, proxy
// heartbeats and releases of nothing held are all served.
func renewalsAndEssentials(t *testing.T, c context.Context, cp adminv1.ControlPlaneClient, ss adminv1.SessionsClient, sid uint64) {
	t.Helper()
	if hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r1"}); err != nil || !hb.GetRenewed() {
		t.Fatalf("heartbeat under load: %v, %v", hb, err)
	}
	if ka, err := ss.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "p", SessionId: sid}); err != nil || !ka.GetRenewed() {
		t.Fatalf("keepalive under load: %v, %v", ka, err)
	}
	if _, err := cp.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "p"}); err != nil {
		t.Fatalf("proxy heartbeat under load: %v", err)
	}
}

// Past the in-flight bound the leader refuses new work RESOURCE_EXHAUSTED
// with a retry hint, while renewals and the writes that keep what exists
// alive are served; once the write in flight is done, new work is taken
// again.
func TestOverloadShedsNewWorkNotRenewals(t *testing.T) {
	t.Parallel()
	n, cp, ss, sid := startAdmitting(t, clock.RealClock{}, Admission{MaxInFlightWrites: 1})
	c := ctx(t)
	admitted, release := make(chan struct{}), make(chan struct{})
	hold := func(method string) {
		if method == "CreateNamespace" {
			close(admitted)
			<-release
		}
	}
	n.Server.hooks.writeAdmitted.Store(&hold)
	created := make(chan error, 1)
	go func() {
		_, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "b", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
		created <- err
	}()
	<-admitted
	if v := scrapeValue(t, n, "prism_admin_writes_in_flight"); v != 1 {
		t.Fatalf("writes in flight = %v, want 1", v)
	}
	_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "c@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	shed(t, "acquire", err)
	_, err = ss.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "p", SessionId: sid, MailboxIds: []string{"c@p"}})
	shed(t, "acquire in a session", err)
	_, err = ss.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: "p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	shed(t, "open", err)
	renewalsAndEssentials(t, c, cp, ss, sid)
	if v := scrapeValue(t, n, "prism_admin_shed_total"); v != 3 {
		t.Fatalf("shed = %v, want 3", v)
	}
	close(release)
	if err := <-created; err != nil {
		t.Fatalf("the write in flight: %v", err)
	}
	n.Server.hooks.writeAdmitted.Store(nil)
	if _, err := ss.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "p", SessionId: sid, MailboxIds: []string{"a@p"}}); err != nil {
		t.Fatalf("acquire once the load is gone: %v", err)
	}
}

// A renewal that waited longer than ShedAfterRenewalWait between its
// arrival and the lessor sheds new work for RetryAfter; the renewal itself,
// and the ones after it, are served.
func TestSlowRenewalShedsNewWork(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a := Admission{ShedAfterRenewalWait: 500 * time.Millisecond, RetryAfter: 2 * time.Second}
	n, cp, ss, sid := startAdmitting(t, clk, a)
	c := ctx(t)
	slow := func(*lease.Receipt) { clk.Step(a.ShedAfterRenewalWait + time.Millisecond) }
	n.Server.hooks.renewalReceived.Store(&slow)
	if hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r1"}); err != nil || !hb.GetRenewed() {
		t.Fatalf("slow heartbeat: %v, %v", hb, err)
	}
	n.Server.hooks.renewalReceived.Store(nil)
	_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "c@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	shed(t, "acquire after a slow renewal", err)
	renewalsAndEssentials(t, c, cp, ss, sid)
	clk.Step(a.RetryAfter)
	if _, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "c@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"}); err != nil {
		t.Fatalf("acquire after the retry hint: %v", err)
	}
}

// A heartbeat held up between its arrival and the lessor (here by the
// test's hook, in production by load) for longer than the lease has left
// keeps the lease: the leader's expiry scans pass it by while it waits, and
// it renews from its arrival.
func TestDelayedHeartbeatCountsFromArrival(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n, cp, adm, _ := startSingleAt(t, clk, 0)
	c := ctx(t)
	interval := n.Server.cfg.ExpiryInterval
	scanAfter := func(d time.Duration) {
		t.Helper()
		scans := scrapeValue(t, n, "prism_admin_lease_expiry_scans_total")
		clk.Step(d)
		awaitState(t, "an expiry scan", func() bool { return scrapeValue(t, n, "prism_admin_lease_expiry_scans_total") >= scans+1 })
	}
	placeOn(t, c, cp, "p", "r1", "a")
	acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001", Ttl: durationpb.New(time.Second)})
	if err != nil || !acq.GetGranted() {
		t.Fatalf("acquire: %v, %v", acq, err)
	}
	grace := acq.GetLease().GetGrace().AsDuration()
	arrived, release := make(chan time.Time, 1), make(chan struct{})
	hold := func(rc *lease.Receipt) {
		arrived <- rc.At()
		<-release
	}
	n.Server.hooks.renewalReceived.Store(&hold)
	// Arrives just before expires + grace ...
	scanAfter(time.Second + grace - interval)
	type result struct {
		hb  *adminv1.MailboxHeartbeatResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r1"})
		done <- result{hb, err}
	}()
	at := <-arrived
	// ... and waits well past it, through several scans.
	for range 5 {
		scanAfter(interval)
	}
	if _, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "a@p"}); err != nil {
		t.Fatalf("lease with an on-time heartbeat waiting expired: %v", err)
	}
	n.Server.hooks.renewalReceived.Store(nil)
	close(release)
	r := <-done
	if r.err != nil || !r.hb.GetRenewed() || !r.hb.GetExpiresAt().AsTime().Equal(at.Add(time.Second)) {
		t.Fatalf("delayed heartbeat: %v, %v; want renewed until arrival + ttl %s", r.hb, r.err, at.Add(time.Second))
	}
	scanAfter(interval)
	if _, err := adm.GetLease(c, &adminv1.GetLeaseRequest{MailboxId: "a@p"}); err != nil {
		t.Fatalf("renewed lease gone: %v", err)
	}
	if v := scrapeValue(t, n, "prism_admin_lease_expirations_total"); v != 0 {
		t.Fatalf("expirations = %v, want 0", v)
	}
}

// A renewal waiting at the renewal gate longer than ShedAfterRenewalWait
// sheds new work while it waits; it is served once a turn frees, and new
// work is taken again once no renewal waits that long.
func TestWaitingRenewalShedsNewWork(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a := Admission{MaxRenewalsInFlight: 1, ShedAfterRenewalWait: 500 * time.Millisecond, RetryAfter: 2 * time.Second}
	n, cp, ss, sid := startAdmitting(t, clk, a)
	c := ctx(t)
	gate := n.Server.admission.renewals
	hold := n.Lessor.ReceiveHeartbeat("a@p")
	defer hold.Close()
	busy, err := gate.enter(c, hold)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ka  *adminv1.KeepAliveSessionResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		ka, err := ss.KeepAliveSession(c, &adminv1.KeepAliveSessionRequest{ProxyId: "p", SessionId: sid})
		done <- result{ka, err}
	}()
	awaitState(t, "the keepalive to wait at the gate", func() bool { _, n := gate.oldestWait(clk.Now()); return n == 1 })
	if _, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "c@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"}); err != nil {
		t.Fatalf("acquire while a renewal waits briefly: %v", err)
	}
	clk.Step(a.ShedAfterRenewalWait + time.Millisecond)
	if v := scrapeValue(t, n, "prism_admin_renewals_waiting"); v != 1 {
		t.Fatalf("renewals waiting = %v, want 1", v)
	}
	_, err = ss.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "p", SessionId: sid, MailboxIds: []string{"d@p"}})
	shed(t, "acquire while a renewal waits too long", err)
	if v := scrapeValue(t, n, `prism_admin_shed_total{method="AcquireLeases"}`); v != 1 {
		t.Fatalf("AcquireLeases shed = %v, want 1", v)
	}
	busy()
	r := <-done
	if r.err != nil || !r.ka.GetRenewed() {
		t.Fatalf("the waiting keepalive: %v, %v", r.ka, r.err)
	}
	// It reached the lessor late, so new work stays shed for RetryAfter.
	_, err = cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "d@p", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	shed(t, "acquire just after a late renewal", err)
	clk.Step(a.RetryAfter)
	if _, err := ss.AcquireLeases(c, &adminv1.AcquireLeasesRequest{ProxyId: "p", SessionId: sid, MailboxIds: []string{"a@p"}}); err != nil {
		t.Fatalf("acquire once no renewal waits: %v", err)
	}
}
