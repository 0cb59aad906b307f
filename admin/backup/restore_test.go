package backup

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// TestRestoreRevokesLeasesAndGrantsAboveEveryEarlierEpoch restores a node
// from a snapshot, starts it, and checks the lease rule of restore.go: the
// tables come back without a lease or session, and the next grant's epoch
// is above every epoch granted before the save and in a term past the gap.
func TestRestoreRevokesLeasesAndGrantsAboveEveryEarlierEpoch(t *testing.T) {
	t.Parallel()
	f, high := populate(t, 7, 40)
	info, data, err := Capture(f, fakeNode{"old-1", 9}, t0)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "a1")
	peers := []raftnode.Peer{{ID: "a1", Addr: ln.Addr().String()}}
	res, err := Restore(info, data, Options{DataDir: dir, NodeID: "a1", Peers: peers, GRPCAddrs: map[string]string{"a1": "127.0.0.1:8981"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Term != 9+TermGap || res.RevokedSessions != 1 || res.RevokedLeases != 40 || res.Index <= info.GetIndex() {
		t.Fatalf("result = %+v", res)
	}

	g := fsm.New()
	n, err := raftnode.New(raftnode.Config{ID: "a1", DataDir: dir, Listener: ln, Timing: raftnode.FastTiming()}, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for l, changed := n.Leadership(); !l.IsLeader; l, changed = n.Leadership() {
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the restored node never led")
		}
	}
	c := g.Counts()
	if c.Namespaces != 40 || c.Proxies != 1 || c.Leases != 0 || c.Sessions != 0 {
		t.Fatalf("restored counts = %+v, want 40 namespaces, 1 proxy, no leases or sessions", c)
	}
	if m, _ := g.MemberAddresses(); len(m) != 1 || m["a1"] != "127.0.0.1:8981" {
		t.Fatalf("restored members = %v, want only the new node's gRPC address (followers forward there)", m)
	}
	if term := n.Term(); term <= res.Term {
		t.Fatalf("restored node leads term %d, want above the seed's %d", term, res.Term)
	}
	cmd := &adminv1.Command{Now: timestamppb.Now(), Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: "ns-3@p1", RunnerId: "r1", RunnerAddress: "10.0.0.1:9090",
	}}}
	b, err := fsm.Encode(cmd)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := n.Apply(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	grant, ok := out.(*adminv1.AcquireLeaseResponse)
	if !ok || !grant.GetGranted() {
		t.Fatalf("re-acquire = %v", out)
	}
	if e := grant.GetLease().GetEpoch(); e <= high || e>>40 <= info.GetTerm()+TermGap {
		t.Fatalf("re-acquired epoch %d (term %d): want above %d, the highest before the save, in a term above %d",
			e, e>>40, high, info.GetTerm()+TermGap)
	}
}

func TestRestoreIsTheSameOnEveryNode(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 2, 20)
	info, data, err := Capture(f, fakeNode{"old-1", 2}, t0)
	if err != nil {
		t.Fatal(err)
	}
	peers := []raftnode.Peer{{ID: "a1", Addr: "10.0.0.1:8990"}, {ID: "a2", Addr: "10.0.0.2:8990"}}
	var states [][]byte
	for _, id := range []string{"a1", "a2"} {
		dir := filepath.Join(t.TempDir(), id)
		if _, err := Restore(info, data, Options{DataDir: dir, NodeID: id, Peers: peers}); err != nil {
			t.Fatal(err)
		}
		snaps, err := raft.NewFileSnapshotStore(dir, 1, os.Stderr)
		if err != nil {
			t.Fatal(err)
		}
		metas, _ := snaps.List()
		if len(metas) != 1 || len(metas[0].Configuration.Servers) != 2 {
			t.Fatalf("%s: snapshots %+v", id, metas)
		}
		_, rc, err := snaps.Open(metas[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(rc)
		_ = rc.Close()
		states = append(states, buf.Bytes())
	}
	if !bytes.Equal(states[0], states[1]) {
		t.Fatal("two nodes restored from one file hold different FSM states")
	}
}

func TestRestoreRefuses(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 2, 3)
	info, data, err := Capture(f, fakeNode{"old-1", 2}, t0)
	if err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if err := Write(&file, info, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "good.snap")
	bad := filepath.Join(t.TempDir(), "bad.snap")
	damaged := bytes.Clone(file.Bytes())
	damaged[len(damaged)-1] ^= 1
	if err := os.WriteFile(good, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	peers := []raftnode.Peer{{ID: "a1", Addr: "10.0.0.1:8990"}}
	cases := []struct {
		name, file, dir, id, want string
	}{
		{"a bad checksum", bad, filepath.Join(t.TempDir(), "d"), "a1", "checksum mismatch"},
		{"a non-empty data dir", good, full, "a1", "not empty"},
		{"a node outside the peers", good, filepath.Join(t.TempDir(), "d"), "a9", "do not include"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := RestoreFile(c.file, Options{DataDir: c.dir, NodeID: c.id, Peers: peers})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
			if c.dir != full {
				if entries, _ := os.ReadDir(c.dir); len(entries) != 0 {
					t.Fatalf("a refused restore left %d entries in %s", len(entries), c.dir)
				}
			}
		})
	}
}
