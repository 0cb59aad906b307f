package sidecare2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/testwait"
)

// A sidecar restarted alone: its SIGTERM drains the runner, which
// keeps running; a new sidecar for the same runner re-acquires the lease and
// the runner serves and consumes the mailbox again, on the same store,
// instead of refusing it with "runner draining" until it is restarted too.
func TestSidecarRestartedAloneServesAgain(t *testing.T) {
	e := setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epoch := e.heldBy(t, admin, "runner-a", e.runner, 0)
	e.tl.mark("lease held, epoch %d", epoch)
	const n = 50
	e.kafka.ProduceEnvelopes(t, topic, envelopes("before", n)...)
	testwait.For(t, 30*time.Second, "events stored", func() (bool, string) {
		_, _, stored, err := mailboxStats(e.runner)
		return stored == n, fmt.Sprint(stored, err)
	})

	e.tl.mark("SIGTERM to sidecar-a")
	if err := e.sidecar.Term(5 * time.Second); err != nil {
		t.Fatalf("sidecar stop: %v", err)
	}
	testwait.For(t, 5*time.Second, "lease released", func() (bool, string) {
		l, err := leaseOf(admin)
		return err == nil && l == nil, fmt.Sprintf("lease %v err %v", l, err)
	})
	if !e.runner.Alive() {
		t.Fatal("the runner exited with its sidecar; the test is about the runner living on")
	}
	if code, _, _, err := web.Get(e.runner.HTTPURL() + "/readyz"); err != nil || code == 200 {
		t.Fatalf("drained runner /readyz %d %v, want not ready", code, err)
	}

	e.tl.mark("sidecar-a2 started for runner-a")
	sidecar2 := startSidecar(t, "sidecar-a2", "runner-a", e.runner, admin.GRPCAddr)
	epoch2 := e.heldBy(t, admin, "runner-a", e.runner, epoch)
	e.tl.mark("lease re-acquired and served, epoch %d", epoch2)
	testwait.For(t, 10*time.Second, "sidecar-a2 ready", sidecar2.Ready)
	e.kafka.ProduceEnvelopes(t, topic, envelopes("after", n)...)
	testwait.For(t, 30*time.Second, "events stored on the same store, consuming again", func() (bool, string) {
		_, _, stored, err := mailboxStats(e.runner)
		return stored == 2*n, fmt.Sprint(stored, err)
	})
	code, body, _, err := web.Get(e.runner.QueryURL() + "/v1/mailboxes/" + mailboxID + "/events/after-0007")
	if err != nil || code != 200 {
		t.Fatalf("query after the restart: %d %v %s", code, err, body)
	}
	testwait.For(t, 10*time.Second, "runner ready again", func() (bool, string) {
		code, body, _, err := web.Get(e.runner.HTTPURL() + "/readyz")
		return code == 200, fmt.Sprint(code, body, err)
	})
	e.tl.mark("runner ready, %d events stored", 2*n)
	t.Logf("timeline:\n%s", e.tl)
	if sidecar2.LogHas("runner draining") || !e.runner.LogHas("runner drain ended") {
		t.Fatalf("the new sidecar was refused, or the runner did not end its drain:\nsidecar:\n%s\nrunner:\n%s", sidecar2.Tail(20), e.runner.Tail(20))
	}
}
