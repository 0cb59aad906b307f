package admincluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
)

// lossyNode is a single admin node that granted leases, was killed -9 and
// lost the tail of its raft-wal, as a disk that acknowledged fsyncs it did
// not do leaves it: the last segment is cut back to an earlier offset, and
// raft-wal recovers to the last whole commit without a word. The cut falls
// amid the grants, so a restarted node reuses lost indexes.
type lossyNode struct {
	c       *e2e.AdminCluster
	n       *e2e.AdminNode
	grant   func() uint64
	before  []uint64 // epochs granted before the cut
	applied uint64   // the node's applied index when it was killed
}

const lossGrants = 40

func cutLogTail(t *testing.T, ctx context.Context, args ...string) *lossyNode {
	t.Helper()
	c := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1, Args: args})
	n := c.Nodes[0]

	// A lone proxy hosts the namespace; its runner id defaults to its id.
	const proxy, ns = "proxy-1", "cut"
	if _, err := n.ControlAs(proxy).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:9000"}}); err != nil {
		t.Fatal(err)
	}
	c.CreateNamespace(30*time.Second, ns, nsConfig())
	mailbox := ns + "@" + proxy
	l := &lossyNode{c: c, n: n}
	// Every grant, reconnects included, takes a new epoch.
	l.grant = func() uint64 {
		t.Helper()
		r, err := n.ControlAs(proxy).AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: mailbox, RunnerId: proxy, RunnerAddress: "127.0.0.1:9000"})
		if err != nil || !r.GetGranted() {
			t.Fatalf("acquire %s: %v %v", mailbox, r, err)
		}
		return r.GetLease().GetEpoch()
	}

	seg := tailSegment(t, filepath.Join(n.DataDir, "wal"))
	setupEnd := writtenEnd(t, seg)
	for range lossGrants {
		l.before = append(l.before, l.grant())
	}
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l.applied = st.GetAppliedIndex()
	// The node records its commit index beside the log every 50ms
	// (admin/raftnode's ackedIndexEvery), with nothing to observe from here.
	time.Sleep(200 * time.Millisecond)
	n.Kill()

	end := writtenEnd(t, seg)
	cut := setupEnd + (end-setupEnd)/2
	if err := os.Truncate(seg, cut); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut %s from %d to %d bytes (the grants span %d..%d)", filepath.Base(seg), end, cut, setupEnd, end)
	return l
}

// TestLostLogTailRefusesToStart: a node whose log ends before the commit
// index it had acknowledged says so, naming both indexes, and exits instead
// of voting or leading on what is left.
func TestLostLogTailRefusesToStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := cutLogTail(t, ctx)

	l.n.Restart()
	select {
	case <-l.n.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the node started on a log that lost acknowledged entries")
	}
	if err := l.n.Term(time.Second); err == nil {
		t.Fatal("the node exited 0 after refusing a log that lost entries")
	}
	if !l.n.LogHas("level=ERROR", "lost acknowledged entries", "acknowledged_index=", "last_index=") {
		t.Fatalf("no error naming the acknowledged and the last index:\n%s", l.n.Tail(5))
	}
	if !l.n.LogHas("acknowledged", "--accept-log-loss") {
		t.Fatalf("the exit does not tell the operator the way out:\n%s", l.n.Tail(5))
	}
}

// TestEpochsSurviveLostLogTail: with the operator's --accept-log-loss the
// node starts on what is left, and still grants no epoch twice or below one
// granted before the cut.
func TestEpochsSurviveLostLogTail(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := cutLogTail(t, ctx, "--accept-log-loss")

	l.n.Restart()
	l.c.AwaitLeader()
	st, err := l.n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The new term's first entry is applied too, so the log must be well
	// short of where it ended for the grants' indexes to be reused.
	if st.GetAppliedIndex() >= l.applied-lossGrants/4 {
		t.Fatalf("after the cut the node applied up to %d of %d: the cut lost no grants, so the test proves nothing", st.GetAppliedIndex(), l.applied)
	}
	t.Logf("restarted at term %d, applied index %d (was %d)", st.GetTerm(), st.GetAppliedIndex(), l.applied)
	if !l.n.LogHas("level=ERROR", "lost acknowledged entries", "acknowledged_index=", "accept_log_loss=true") {
		t.Fatalf("the accepted loss was not logged:\n%s", l.n.Tail(20))
	}

	var after []uint64
	for range lossGrants {
		after = append(after, l.grant())
	}
	highest := slices.Max(l.before)
	for i, e := range after {
		if e <= highest || slices.Contains(l.before, e) {
			t.Fatalf("grant %d after the restart has epoch %d; before the cut the node granted up to %d (epochs %v)", i, e, highest, l.before)
		}
		if i > 0 && e <= after[i-1] {
			t.Fatalf("epochs after the restart do not grow: %v", after)
		}
	}
	t.Logf("epochs before the cut %d..%d, after %d..%d", l.before[0], highest, after[0], after[len(after)-1])
}

// tailSegment is the raft-wal segment that takes appends: segment files are
// named by their base index, zero-padded, so the last one sorts last.
func tailSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no raft-wal segment in %s: %v", dir, err)
	}
	slices.Sort(segs)
	return segs[len(segs)-1]
}

// writtenEnd is where a preallocated segment's written frames end: raft-wal
// pads frames to 8 bytes and the rest of the file is zeros.
func writtenEnd(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	end := int64(len(bytes.TrimRight(b, "\x00")))
	return (end + 7) &^ 7
}
