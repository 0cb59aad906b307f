package admincluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/slowfs"
)

// A leader whose disk stalls (its fsyncs held, a saturated or failing
// device) must answer nothing from state the cluster has moved past, and the
// cluster must grant again once the disk answers. Every node's data dir is on
// a FUSE loopback served by this process (testkit/slowfs); each cycle holds
// the leader's fsyncs for longer than the election timeout while, as in
// TestPausedNodeRenewsNothingStale, runner a heartbeats mailbox m to the
// leader, runner c heartbeats k's old epoch to it and reconnects k through
// the other nodes, and runner b tries to take m through the other nodes.
// Then the same properties hold: no two holders of m overlap (from the
// clients' send times) and no stale epoch of k is renewed once c holds a
// newer one.
//
// It also logs what the cluster does meanwhile: whether leadership moved,
// how many of a's renewals were answered during the stall, and how long
// after the disk came back the first grant (c's reconnect) arrived. The
// stall is shorter than the default --disk-stall-timeout (10s), so this is
// the cluster without the watchdog: see TestDiskStallFailStop for it.
func TestDiskStall(t *testing.T) {
	const (
		ttl   = 2 * time.Second
		grace = 500 * time.Millisecond
		// Twenty times the fast election timeout (150ms): an election would
		// have ample time to run if the followers noticed anything.
		stall  = 3 * time.Second
		every  = 100 * time.Millisecond
		cycles = 3
	)
	c, disks := stallCluster(t)
	cfg := &adminv1.NamespaceConfig{
		Topics: []string{"t"}, Lease: e2e.Lease{TTL: ttl, Grace: grace, Heartbeat: every}.Config(),
	}
	for i, tries := 0, 0; i < cycles; tries++ {
		if tries == cycles+3 {
			t.Fatalf("leadership moved before the stall in %d of %d cycles", tries-i, tries)
		}
		lead := c.AwaitLeader()
		if stallCycle(t, c, lead, disks[lead], fmt.Sprintf("stall-%d", tries), cfg, ttl, stall, every, false) {
			i++
		}
	}
}

// TestDiskStallFailStop is TestDiskStall with the nodes' --disk-stall-timeout
// shorter than the stall: the stalled leader must exit (fail-stop, its
// replication goroutines dying with it), another node must lead and grant
// while the disk is still stalled, and the same safety properties hold. The
// test restarts the exited node once its disk answers, as a supervisor would.
func TestDiskStallFailStop(t *testing.T) {
	const (
		ttl          = 2 * time.Second
		grace        = 500 * time.Millisecond
		stallTimeout = time.Second
		stall        = 4 * stallTimeout
		every        = 100 * time.Millisecond
		cycles       = 2
	)
	c, disks := stallCluster(t, "--disk-stall-timeout", stallTimeout.String())
	cfg := &adminv1.NamespaceConfig{
		Topics: []string{"t"}, Lease: e2e.Lease{TTL: ttl, Grace: grace, Heartbeat: every}.Config(),
	}
	for i, tries := 0, 0; i < cycles; tries++ {
		if tries == cycles+3 {
			t.Fatalf("leadership moved before the stall in %d of %d cycles", tries-i, tries)
		}
		lead := c.AwaitLeader()
		if stallCycle(t, c, lead, disks[lead], fmt.Sprintf("failstop-%d", tries), cfg, ttl, stall, every, true) {
			c.Nodes[lead].Restart()
			i++
		}
	}
}

// stallCluster starts three admin nodes, with args, each on its own FUSE
// loopback whose fsyncs the test can hold.
func stallCluster(t *testing.T, args ...string) (*e2e.AdminCluster, []*slowfs.FS) {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	disks, dirs := make([]*slowfs.FS, 3), make([]string, 3)
	for i := range disks {
		mnt := t.TempDir()
		d, err := slowfs.Mount(t.TempDir(), mnt)
		if errors.Is(err, slowfs.ErrUnsupported) {
			t.Skipf("the disk-stall fault mounts a FUSE loopback, which needs root and /dev/fuse: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := d.Unmount(); err != nil {
				t.Error(err)
			}
		})
		disks[i], dirs[i] = d, mnt
	}
	c := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, RaftFaults: true, DataDirs: dirs,
		Args: append([]string{"--snapshot-threshold", "512", "--trailing-logs", "256"}, args...)})
	// A stalled fsync holds its caller in the kernel, out of reach of
	// kill -9: let them through before the nodes are killed (cleanups run
	// last in, first out).
	t.Cleanup(func() {
		for _, d := range disks {
			d.Release()
		}
	})
	return c, disks
}

// stallCycle stalls node lead's disk for stall and checks the properties;
// with failStop, also that the leader exited and a grant came during the
// stall. It returns false, having stalled nothing, when lead no longer
// leads once the cycle's leases are set up: a leader silent for the
// heartbeat timeout is replaced (docs/operations.md, "Raft timing and leader
// failover"), which a loaded machine can bring about, and stalling a
// follower's disk would test nothing.
func stallCycle(t *testing.T, c *e2e.AdminCluster, lead int, disk *slowfs.FS, tag string, cfg *adminv1.NamespaceConfig, ttl, stall, every time.Duration, failStop bool) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	leader := c.Nodes[lead]
	others := func(attempt int) *e2e.AdminNode {
		return c.Nodes[(lead+1+attempt%(len(c.Nodes)-1))%len(c.Nodes)]
	}
	registerRunner(ctx, t, c, "m-"+tag, "a")
	registerRunner(ctx, t, c, "k-"+tag, "c")
	m := placedMailbox(ctx, t, c, "m-"+tag, "stall-m-"+tag, cfg)
	k := placedMailbox(ctx, t, c, "k-"+tag, "stall-k-"+tag, cfg)
	acquire := func(attempt int, mailbox, runner string) (*adminv1.AcquireLeaseResponse, error) {
		actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer acancel()
		return others(attempt).ControlAs(proxyOf(mailbox)).AcquireLease(actx, &adminv1.AcquireLeaseRequest{MailboxId: mailbox, RunnerId: runner, RunnerAddress: "127.0.0.1:9000"})
	}
	// mustAcquire retries through the other nodes and counts the refusals by
	// gRPC code (or the lease refusal's reason).
	mustAcquire := func(mailbox, runner string, refused map[string]int) (*adminv1.AcquireLeaseResponse, time.Time) {
		for attempt := 0; ; attempt++ {
			r, err := acquire(attempt, mailbox, runner)
			if err == nil && r.GetGranted() {
				return r, time.Now()
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: acquire %s as %s: %v %v", tag, mailbox, runner, err, r.GetRefusal())
			}
			if refused != nil {
				if err != nil {
					refused[status.Code(err).String()]++
				} else {
					refused[r.GetRefusal().GetReason().String()]++
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	aSentAt := time.Now()
	aLease, _ := mustAcquire(m, "a", nil)
	aGrant, aEpoch := aLease.GetLease().GetGrantedAt().AsTime(), aLease.GetLease().GetEpoch()
	cGrant, _ := mustAcquire(k, "c", nil)
	registerRunner(ctx, t, c, "m-"+tag, "b")

	var (
		mu           sync.Mutex
		aBeats, cOld []beat
		wg           sync.WaitGroup
	)
	beatLoop := func(mailbox, runner string, epoch uint64, into *[]beat, stop <-chan struct{}) {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hctx, hcancel := context.WithTimeout(ctx, stall+5*time.Second)
				defer hcancel()
				b := beat{sent: time.Now()}
				b.resp, b.err = leader.ControlAs(proxyOf(mailbox)).MailboxHeartbeat(hctx, &adminv1.MailboxHeartbeatRequest{MailboxId: mailbox, RunnerId: runner, Epoch: epoch})
				b.answered = time.Now()
				mu.Lock()
				*into = append(*into, b)
				mu.Unlock()
			}()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}
	stopA, stopC := make(chan struct{}), make(chan struct{})
	wg.Add(2)
	go beatLoop(m, "a", aEpoch, &aBeats, stopA)
	go beatLoop(k, "c", cGrant.GetLease().GetEpoch(), &cOld, stopC)
	time.Sleep(3 * every)

	before, err := leader.Status(ctx)
	if err != nil || before.GetState() != "Leader" {
		close(stopA)
		close(stopC)
		wg.Wait()
		t.Logf("%s: %s is %s before the stall (%v): the cycle starts again with the new leader", tag, leader.ID, before.GetState(), err)
		return false
	}
	_, heldBefore := disk.Fsyncs()
	disk.Stall()
	stalledAt := time.Now()
	exitedAt := make(chan time.Time, 1)
	go func() {
		select {
		case <-leader.Exited():
			exitedAt <- time.Now()
		case <-ctx.Done():
		}
	}()
	released := make(chan time.Time, 1)
	time.AfterFunc(stall, func() {
		// a stops when the disk answers again: its lease then ends ttl
		// after its last renewed heartbeat and b may take m.
		close(stopA)
		disk.Release()
		released <- time.Now()
	})
	// Watch the nodes' view of leadership through the stall.
	var (
		views    = map[string]bool{}
		maxTerm  uint64
		watchEnd = make(chan struct{})
		watched  = make(chan struct{})
	)
	go func() {
		defer close(watched)
		for {
			for _, n := range c.Nodes {
				if st, err := n.Status(ctx); err == nil {
					mu.Lock()
					views[n.ID+"->"+st.GetLeaderId()] = true
					maxTerm = max(maxTerm, st.GetTerm())
					mu.Unlock()
				}
			}
			select {
			case <-watchEnd:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	cRefused := map[string]int{}
	cNew, cNewAt := mustAcquire(k, "c", cRefused)
	if cNew.GetLease().GetEpoch() <= cGrant.GetLease().GetEpoch() {
		t.Fatalf("%s: reconnect got epoch %d, not after %d", tag, cNew.GetLease().GetEpoch(), cGrant.GetLease().GetEpoch())
	}
	releasedAt := <-released
	var bGrant *adminv1.AcquireLeaseResponse
	for attempt := 0; bGrant == nil && time.Since(releasedAt) < 3*ttl; attempt++ {
		if r, err := acquire(attempt, m, "b"); err == nil && r.GetGranted() {
			bGrant = r
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stopC)
	close(watchEnd)
	<-watched
	wg.Wait()
	after := c.Nodes[c.AwaitLeader()]
	_, heldAfter := disk.Fsyncs()

	mu.Lock()
	defer mu.Unlock()
	var viewList []string
	for v := range views {
		viewList = append(viewList, v)
	}
	sort.Strings(viewList)
	// What the cluster did during the stall.
	var renewedIn, answeredIn, failedIn int
	var slowest time.Duration
	for _, b := range aBeats {
		if b.sent.Before(stalledAt) || !b.sent.Before(releasedAt) {
			continue
		}
		slowest = max(slowest, b.answered.Sub(b.sent))
		switch {
		case b.err != nil:
			failedIn++
		case b.resp.GetRenewed():
			renewedIn++
		default:
			answeredIn++
		}
	}
	t.Logf("%s: %s's fsyncs held %s (%d fsyncs waited); leader before %s (term %d), after %s, highest term seen %d, views %s",
		tag, leader.ID, releasedAt.Sub(stalledAt).Round(time.Millisecond), heldAfter-heldBefore, leader.ID, before.GetTerm(), after.ID, maxTerm, strings.Join(viewList, " "))
	t.Logf("%s: a's heartbeats sent to %s during the stall: %d renewed, %d refused, %d failed, slowest answer %s",
		tag, leader.ID, renewedIn, answeredIn, failedIn, slowest.Round(time.Millisecond))
	t.Logf("%s: c's reconnect (a new grant) at %+s from the release, refusals meanwhile %v; b granted m: %v",
		tag, cNewAt.Sub(releasedAt).Round(time.Millisecond), cRefused, bGrant != nil)
	if cNewAt.After(releasedAt) && after.ID == leader.ID && maxTerm == before.GetTerm() {
		t.Logf("%s: no grant for the whole %s stall: %s kept leading (term %d) with its log store blocked, so no follower started an election and nothing committed",
			tag, stall, leader.ID, maxTerm)
	}

	if failStop {
		select {
		case at := <-exitedAt:
			if !at.Before(releasedAt) {
				t.Errorf("%s: %s exited %s after its disk answered again, not during the stall", tag, leader.ID, at.Sub(releasedAt))
			}
			t.Logf("%s: %s exited %s into the stall", tag, leader.ID, at.Sub(stalledAt).Round(time.Millisecond))
		default:
			t.Fatalf("%s: %s is still running after a %s stall", tag, leader.ID, stall)
		}
		if !leader.LogHas("raft disk write stalled", "path=", "exit_code="+strconv.Itoa(raftnode.ExitDiskStall)) {
			t.Errorf("%s: %s's log names no stalled write", tag, leader.ID)
		}
		if after.ID == leader.ID {
			t.Errorf("%s: %s leads again after exiting", tag, leader.ID)
		}
		if !cNewAt.Before(releasedAt) {
			t.Errorf("%s: c's reconnect was granted %s after the disk answered, not during the stall", tag, cNewAt.Sub(releasedAt))
		}
	}
	if heldAfter == heldBefore {
		t.Fatalf("%s: no fsync of %s waited during the stall: the fault did not bite", tag, leader.ID)
	}
	if bGrant == nil {
		t.Fatalf("%s: b was not granted %s within %s of the disk answering again", tag, m, 3*ttl)
	}
	aEnd := aSentAt.Add(ttl)
	for _, b := range aBeats {
		if b.err == nil && b.resp.GetRenewed() && b.sent.Add(ttl).After(aEnd) {
			aEnd = b.sent.Add(ttl)
		}
	}
	if bStart := bGrant.GetLease().GetGrantedAt().AsTime(); bStart.Before(aEnd) {
		t.Errorf("%s: two holders of %s: a (granted %s) holds until %s (ttl after its last renewed heartbeat was sent), b granted at %s (%s earlier); stalled at %s",
			tag, m, aGrant.Format(time.StampMicro), aEnd.Format(time.StampMicro), bStart.Format(time.StampMicro), aEnd.Sub(bStart), stalledAt.Format(time.StampMicro))
	}
	for _, b := range cOld {
		if b.err == nil && b.resp.GetRenewed() && b.sent.After(cNewAt) {
			t.Errorf("%s: %s epoch %d sent at %s renewed, after c reconnected with epoch %d at %s",
				tag, k, cGrant.GetLease().GetEpoch(), b.sent.Format(time.StampMicro), cNew.GetLease().GetEpoch(), cNewAt.Format(time.StampMicro))
		}
	}
	return true
}
