package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/internal/diskfree"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Below the watermark of its data dir a node refuses the writes that add
// state, RESOURCE_EXHAUSTED naming the dir, its free bytes and the flag, and
// changes nothing; reads, renewals and proxy heartbeats go on; once space is
// back writes are taken again.
func TestDiskPressureRefusesWrites(t *testing.T) {
	t.Parallel()
	const need = 1 << 20
	var free atomic.Uint64
	free.Store(1 << 30)
	dir := t.TempDir()
	n, cc := startNodeConn(t, NodeConfig{
		Raft:     raftnode.Config{ID: "solo", Bootstrap: true, DataDir: dir, BindAddr: "127.0.0.1:0"},
		HTTPAddr: "127.0.0.1:0",
		MinFree:  diskfree.Watermark{MinBytes: need},
		diskStat: func(string) (diskfree.Usage, error) { return diskfree.Usage{Free: free.Load(), Total: 1 << 40}, nil },
	})
	awaitState(t, "solo to lead", func() bool { l, _ := n.Raft.Leadership(); return l.IsLeader && n.Lessor.Primary() })
	cp, adm := adminv1.NewControlPlaneClient(cc), adminv1.NewAdminClient(cc)
	c := ctx(t)
	placeOn(t, c, cp, "p1", "r1", "ns")
	acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "ns@p1", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	if err != nil {
		t.Fatal(err)
	}
	pressure := func() string {
		resp, err := http.Get("http://" + n.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, fmt.Sprintf("prism_admin_disk_pressure{dir=%q}", dir)) {
				return l[strings.LastIndex(l, " ")+1:]
			}
		}
		return "absent"
	}
	if got := pressure(); got != "0" {
		t.Fatalf("prism_admin_disk_pressure with room = %s", got)
	}

	free.Store(need - 1)
	before := n.FSM.Counts()
	_, err = cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "other", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
	want := fmt.Sprintf("admin data dir %s has %d bytes free", dir, need-1)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "below --min-free-bytes") {
		t.Fatalf("CreateNamespace short of space: %v; want ResourceExhausted saying %q and the flag", err, want)
	}
	_, err = cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "ns2@p1", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"})
	wantCode(t, "AcquireLease short of space", err, codes.ResourceExhausted)
	if got := n.FSM.Counts(); got != before {
		t.Fatalf("tables changed under refusals: %+v, was %+v", got, before)
	}
	if got := pressure(); got != "1" {
		t.Fatalf("prism_admin_disk_pressure short of space = %s", got)
	}
	// Not Raft writes, or writes that keep a live proxy live: still answered.
	hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "ns@p1", RunnerId: "r1", Epoch: acq.GetLease().GetEpoch()})
	if err != nil || !hb.GetRenewed() {
		t.Fatalf("renewal short of space: %v, %v", hb, err)
	}
	if _, err := cp.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}); err != nil {
		t.Fatalf("proxy heartbeat short of space: %v", err)
	}
	if ns, err := adm.ListNamespaces(c, &adminv1.ListNamespacesRequest{}); err != nil || len(ns.GetNamespaces()) != 1 {
		t.Fatalf("read short of space: %v, %v", ns, err)
	}

	// Above the watermark but within its margin: still short.
	free.Store(need + need/20)
	_, err = cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "other", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
	wantCode(t, "CreateNamespace within the margin", err, codes.ResourceExhausted)
	free.Store(2 * need)
	if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "other", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatalf("CreateNamespace once space is back: %v", err)
	}
	if got := pressure(); got != "0" {
		t.Fatalf("prism_admin_disk_pressure once space is back = %s", got)
	}
}
