package admincluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/e2e"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// TestEpochsSurviveLostLogTail reproduces a disk that acknowledged fsyncs it
// did not do: a single admin node grants leases, is killed -9, loses the tail
// of its raft-wal (the last segment cut back to an earlier offset, as a torn
// write leaves it; raft-wal recovers to the last whole commit without a
// word), restarts and grants again. Its log now reuses the lost indexes, so
// an epoch taken from the index alone would repeat or go below the lost
// grants; no epoch may.
func TestEpochsSurviveLostLogTail(t *testing.T) {
	t.Parallel()
	c := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1})
	n := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A lone proxy hosts the namespace; its runner id defaults to its id.
	const proxy, ns = "proxy-1", "cut"
	if _, err := n.Control().RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:9000"}}); err != nil {
		t.Fatal(err)
	}
	c.CreateNamespace(30*time.Second, ns, nsConfig())
	mailbox := ns + "@" + proxy

	// Every grant, reconnects included, takes a new epoch.
	grant := func() uint64 {
		t.Helper()
		r, err := n.Control().AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: mailbox, RunnerId: proxy, RunnerAddress: "127.0.0.1:9000"})
		if err != nil || !r.GetGranted() {
			t.Fatalf("acquire %s: %v %v", mailbox, r, err)
		}
		return r.GetLease().GetEpoch()
	}

	seg := tailSegment(t, filepath.Join(n.DataDir, "wal"))
	setupEnd := writtenEnd(t, seg)
	const grants = 40
	var before []uint64
	for range grants {
		before = append(before, grant())
	}
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lastIndex := st.GetAppliedIndex()
	n.Kill()

	end := writtenEnd(t, seg)
	cut := setupEnd + (end-setupEnd)/2
	if err := os.Truncate(seg, cut); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut %s from %d to %d bytes (the grants span %d..%d)", filepath.Base(seg), end, cut, setupEnd, end)

	n.Restart()
	c.AwaitLeader()
	if st, err = n.Status(ctx); err != nil {
		t.Fatal(err)
	}
	// The new term's first entry is applied too, so the log must be well
	// short of where it ended for the grants' indexes to be reused.
	if st.GetAppliedIndex() >= lastIndex-grants/4 {
		t.Fatalf("after the cut the node applied up to %d of %d: the cut lost no grants, so the test proves nothing", st.GetAppliedIndex(), lastIndex)
	}
	t.Logf("restarted at term %d, applied index %d (was %d)", st.GetTerm(), st.GetAppliedIndex(), lastIndex)
	var after []uint64
	for range grants {
		after = append(after, grant())
	}

	highest := slices.Max(before)
	for i, e := range after {
		if e <= highest || slices.Contains(before, e) {
			t.Fatalf("grant %d after the restart has epoch %d; before the cut the node granted up to %d (epochs %v)", i, e, highest, before)
		}
		if i > 0 && e <= after[i-1] {
			t.Fatalf("epochs after the restart do not grow: %v", after)
		}
	}
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
