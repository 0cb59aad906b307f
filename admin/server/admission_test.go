package server

import (
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/lease"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"
)

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
