package admincluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/testkit/e2e"
)

// A node paused with SIGSTOP (a GC or VM stall, a throttled container) must
// not answer from the state it had before the pause. Each cycle pauses one
// node for longer than the election timeout while two runners send it
// heartbeats that queue in its socket: runner a holds mailbox m and sends
// only to the paused node, runner c reconnects its mailbox k through another
// node (a newer epoch) after queueing a heartbeat for its old epoch. Runner b
// keeps trying to acquire m through the other nodes. After SIGCONT every
// queued call is answered, and then:
//   - no two holders overlap: a holds m until ttl after it sent its last
//     renewed heartbeat (what the sidecar does), and b's grant, stamped by the
//     leader on this machine's clock, must come after that;
//   - no stale epoch is renewed: c's old-epoch heartbeat is never answered
//     renewed once c holds the newer epoch.
//
// Either way a's heartbeats reach no leader during the pause, so the leader
// (a successor, when the leader was paused) expires a's lease and grants m
// to b before the victim resumes.
func TestPausedNodeRenewsNothingStale(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	// The pause is where the fault bites: longer than a successor's election
	// (fast raft timing, well under a second) plus its promotion extension
	// and grace, so the successor expires a's lease at about election + ttl
	// + extension + grace, before a's heartbeats sent late in the pause end
	// (send + ttl); and shorter than ttl + grace, so the paused node's own
	// lessor still holds a's and c's old leases when it resumes and would
	// renew them from its stale state.
	const (
		ttl   = 2 * time.Second
		grace = 500 * time.Millisecond
		pause = 1800 * time.Millisecond
		// Heartbeats are sent this often to the paused node.
		every = 100 * time.Millisecond
	)
	for _, tc := range []struct {
		name   string
		leader bool
		cycles int
	}{
		{"leader", true, 10},
		{"follower", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, 3)
			cfg := &adminv1.NamespaceConfig{
				Topics: []string{"t"}, Lease: e2e.Lease{TTL: ttl, Grace: grace, Heartbeat: every}.Config(),
			}
			var handoffs, queued, done int
			for i := 0; done < tc.cycles; i++ {
				if i >= 2*tc.cycles {
					t.Fatalf("leadership moved before the pause in %d of %d cycles", i-done, i)
				}
				lead := c.AwaitLeader()
				victim := lead
				if !tc.leader {
					victim = c.Follower(lead)
				}
				r := pauseCycle(t, c, victim, tc.leader, fmt.Sprintf("%s-%d", tc.name, i), cfg, ttl, pause, every)
				if r.skipped {
					continue
				}
				done++
				queued += r.queued
				if r.handoff {
					handoffs++
				}
			}
			t.Logf("%d cycles: %d heartbeats queued on the paused node, %d handoffs to b", tc.cycles, queued, handoffs)
			if queued < tc.cycles*int(pause/every)/2 {
				t.Fatalf("only %d heartbeats were sent during the pauses: the cycles did not exercise the fault", queued)
			}
			if handoffs < tc.cycles/2 {
				t.Fatalf("b was granted m in only %d of %d cycles: the successor did not take over", handoffs, tc.cycles)
			}
		})
	}
}

type cycleResult struct {
	queued  int
	handoff bool
	// skipped: the victim's role changed before the pause.
	skipped bool
}

type beat struct {
	sent, answered time.Time
	resp           *adminv1.MailboxHeartbeatResponse
	err            error
}

// pauseCycle runs one pause of node victim and checks its properties.
func pauseCycle(t *testing.T, c *e2e.AdminCluster, victim int, wantLeader bool, tag string, cfg *adminv1.NamespaceConfig, ttl, pause, every time.Duration) cycleResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	paused := c.Nodes[victim]
	others := func(attempt int) *e2e.AdminNode {
		return c.Nodes[(victim+1+attempt%(len(c.Nodes)-1))%len(c.Nodes)]
	}
	// m and k are mailboxes of proxies m-<tag> (runner a) and k-<tag>
	// (runner c), each with a namespace of its own placed on it.
	registerRunner(ctx, t, c, "m-"+tag, "a")
	registerRunner(ctx, t, c, "k-"+tag, "c")
	m := placedMailbox(ctx, t, c, "m-"+tag, "pause-m-"+tag, cfg)
	k := placedMailbox(ctx, t, c, "k-"+tag, "pause-k-"+tag, cfg)
	acquire := func(n *e2e.AdminNode, mailbox, runner string) (*adminv1.AcquireLeaseResponse, time.Time, error) {
		// Short, so an attempt stuck forwarding to the paused leader gives
		// way to the next one within the pause.
		actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer acancel()
		sent := time.Now()
		r, err := n.ControlAs(proxyOf(mailbox)).AcquireLease(actx, &adminv1.AcquireLeaseRequest{MailboxId: mailbox, RunnerId: runner, RunnerAddress: "127.0.0.1:9000"})
		return r, sent, err
	}
	mustAcquire := func(mailbox, runner string) (*adminv1.AcquireLeaseResponse, time.Time) {
		for attempt := 0; ; attempt++ {
			r, sent, err := acquire(others(attempt), mailbox, runner)
			if err == nil && r.GetGranted() {
				return r, sent
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: acquire %s as %s: %v %v", tag, mailbox, runner, err, r.GetRefusal())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	aGrant, aSent := mustAcquire(m, "a")
	cGrant, _ := mustAcquire(k, "c")
	// m-<tag>'s runner is replaced by b while a holds m: b may take m once
	// a's lease is gone, and a keeps heartbeating the lease it holds.
	registerRunner(ctx, t, c, "m-"+tag, "b")

	var (
		mu     sync.Mutex
		aBeats []beat
		cOld   []beat
		wg     sync.WaitGroup
	)
	send := func(mailbox, runner string, epoch uint64, into *[]beat) {
		defer wg.Done()
		hctx, hcancel := context.WithTimeout(ctx, pause+5*time.Second)
		defer hcancel()
		b := beat{sent: time.Now()}
		b.resp, b.err = paused.ControlAs(proxyOf(mailbox)).MailboxHeartbeat(hctx, &adminv1.MailboxHeartbeatRequest{MailboxId: mailbox, RunnerId: runner, Epoch: epoch})
		b.answered = time.Now()
		mu.Lock()
		*into = append(*into, b)
		mu.Unlock()
	}

	// a heartbeats the victim for the whole cycle; the victim is paused once
	// a's first heartbeats have been answered.
	stopBeats := make(chan struct{})
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			wg.Add(1)
			go send(m, "a", aGrant.GetLease().GetEpoch(), &aBeats)
			select {
			case <-stopBeats:
				return
			case <-tick.C:
			}
		}
	}()
	time.Sleep(3 * every)
	if st, err := paused.Status(ctx); err != nil || (st.GetState() == "Leader") != wantLeader {
		// Leadership moved while the cycle was set up (an election on a loaded machine): the pause
		// would not test what it is for. The caller runs another cycle.
		close(stopBeats)
		<-beatsDone
		wg.Wait()
		t.Logf("%s: %s is %v (%v) before the pause, want leader=%v: cycle skipped", tag, paused.ID, st.GetState(), err, wantLeader)
		return cycleResult{skipped: true}
	}
	paused.Pause()
	pausedAt := time.Now()
	wg.Add(1)
	go send(k, "c", cGrant.GetLease().GetEpoch(), &cOld)

	// c reconnects k through the others: a newer epoch, once a leader answers.
	cNew, _ := mustAcquire(k, "c")
	cNewAt := time.Now()
	if cNew.GetLease().GetEpoch() <= cGrant.GetLease().GetEpoch() {
		t.Fatalf("%s: reconnect got epoch %d, not after %d", tag, cNew.GetLease().GetEpoch(), cGrant.GetLease().GetEpoch())
	}

	// b tries m through the others until granted; a stops sending when the
	// victim resumes, so only heartbeats queued during the pause are left.
	var bGrant *adminv1.AcquireLeaseResponse
	resumed := false
	for attempt := 0; time.Since(pausedAt) < pause+3*ttl && (bGrant == nil || !resumed); attempt++ {
		if !resumed && time.Since(pausedAt) >= pause {
			close(stopBeats)
			<-beatsDone
			paused.Resume()
			resumed = true
		}
		if bGrant == nil {
			if r, _, err := acquire(others(attempt), m, "b"); err == nil && r.GetGranted() {
				bGrant = r
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	res := cycleResult{handoff: bGrant != nil}
	var renewedLate int
	for _, b := range append(slices.Clone(aBeats), cOld...) {
		if b.err == nil && b.resp.GetRenewed() && b.answered.After(pausedAt.Add(pause)) {
			renewedLate++
		}
	}
	t.Logf("%s: %s paused %s; %d heartbeats to it, %d renewed after it resumed; c reconnected at +%s; b granted: %v",
		tag, paused.ID, pause, len(aBeats)+len(cOld), renewedLate, cNewAt.Sub(pausedAt).Round(time.Millisecond), bGrant != nil)
	aEnd := aSent.Add(ttl)
	for _, b := range aBeats {
		if b.sent.After(pausedAt) && b.sent.Before(pausedAt.Add(pause)) {
			res.queued++
		}
		if b.err == nil && b.resp.GetRenewed() && b.sent.Add(ttl).After(aEnd) {
			aEnd = b.sent.Add(ttl)
		}
	}
	if bGrant != nil {
		bStart := bGrant.GetLease().GetGrantedAt().AsTime()
		if bStart.Before(aEnd) {
			t.Errorf("%s: two holders of %s: a holds until %s (ttl after its last renewed heartbeat was sent), b granted at %s (%s earlier); paused at %s",
				tag, m, aEnd.Format(time.StampMicro), bStart.Format(time.StampMicro), aEnd.Sub(bStart), pausedAt.Format(time.StampMicro))
		}
	}
	for _, b := range cOld {
		if b.err == nil && b.resp.GetRenewed() && b.answered.After(cNewAt) {
			t.Errorf("%s: %s epoch %d renewed at %s, after c reconnected with epoch %d at %s",
				tag, k, cGrant.GetLease().GetEpoch(), b.answered.Format(time.StampMicro), cNew.GetLease().GetEpoch(), cNewAt.Format(time.StampMicro))
		}
	}
	return res
}
