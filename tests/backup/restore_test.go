// Package backup_test proves disaster recovery on real processes: a 3-node
// admin cluster over mutual TLS with namespaces, proxies and leases is saved
// with prismctl snapshot save, every node is killed and its data deleted,
// three new nodes are built with prism admin restore and started, and
// everything comes back except the leases, which are re-acquired above
// every epoch granted before.
package backup_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testbin"
	"github.com/prism-mesh/prism/testkit/testproc"
	"github.com/prism-mesh/prism/testkit/testwait"
)

func TestSaveKillRestore(t *testing.T) {
	t.Parallel()
	backups := t.TempDir()
	c := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, Args: []string{
		"--backup-dir", backups, "--backup-interval", "300ms", "--backup-retain", "2",
	}})
	lead := c.Nodes[c.AwaitLeader()]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	proxies := []string{"px-1", "px-2"}
	for _, p := range proxies {
		if _, err := lead.ControlAs(p).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
			ProxyId: p, Address: "127.0.0.1:9000", RunnerId: "runner-" + p,
		}}); err != nil {
			t.Fatalf("register %s: %v", p, err)
		}
	}
	lease := e2e.Lease{TTL: 20 * time.Second, Grace: 5 * time.Second, Heartbeat: 5 * time.Second}
	var names []string
	for i := range 8 {
		ns := fmt.Sprintf("orders-%d", i)
		c.CreateNamespace(30*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{"orders"}, Lease: lease.Config()})
		names = append(names, ns)
	}
	// Every mailbox of its namespace's proxy, leased as its sidecar would:
	// one session per proxy, one bulk acquire.
	mailboxes := map[string][]string{}
	for _, ns := range names {
		r, err := lead.Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: ns, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
		if err != nil {
			t.Fatal(err)
		}
		p := r.GetNamespace().GetAssignedProxyId()
		mailboxes[p] = append(mailboxes[p], ns+"@"+p)
	}
	var high uint64 // every fencing token granted before the save
	for p, ids := range mailboxes {
		s := adminv1.NewSessionsClient(lead.ConnAs(identity.Proxy, p))
		open, err := s.OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: p, RunnerId: "runner-" + p, RunnerAddress: "127.0.0.1:9001"})
		if err != nil || open.GetSession() == nil {
			t.Fatalf("open session of %s: %v, %v", p, open, err)
		}
		high = max(high, open.GetSession().GetId())
		got, err := s.AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: p, SessionId: open.GetSession().GetId(), MailboxIds: ids})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range got.GetResults() {
			if !r.GetOk() {
				t.Fatalf("acquire %s: %v", r.GetMailboxId(), r)
			}
			high = max(high, r.GetLease().GetEpoch())
		}
	}

	// prismctl snapshot save, through a follower.
	ctl, err := testbin.Path("prismctl")
	if err != nil {
		t.Fatal(err)
	}
	follower := c.Nodes[c.Follower(c.AwaitLeader())]
	file := filepath.Join(t.TempDir(), "prism.snap")
	save := exec.Command(ctl, append(e2e.CtlArgs(t, nil, identity.Operator, e2e.Operator), "--admin", follower.GRPCAddr, "snapshot", "save", file)...)
	if out, err := save.CombinedOutput(); err != nil || !strings.Contains(string(out), "namespaces/proxies/leases/sessions  8/2/8/") {
		t.Fatalf("prismctl snapshot save: %v\n%s", err, out)
	}
	info, _, err := backup.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}

	// The periodic files: every node writes its own, and they verify.
	testwait.For(t, 30*time.Second, "a periodic snapshot file of every node", func() (bool, string) {
		for _, n := range c.Nodes {
			files, _ := filepath.Glob(filepath.Join(backups, "prism-"+n.ID+"-*.snap"))
			if len(files) == 0 {
				return false, "none of " + n.ID
			}
			if len(files) > 2 {
				return false, fmt.Sprintf("%d files of %s, retain is 2", len(files), n.ID)
			}
			if _, _, err := backup.ReadFile(files[len(files)-1]); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})

	// Quorum loss, and worse: every node and its data gone.
	for _, n := range c.Nodes {
		n.Kill()
		if err := os.RemoveAll(n.DataDir); err != nil {
			t.Fatal(err)
		}
	}

	// Three new nodes on new addresses, restored from the file.
	prism, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	type node struct{ id, raft, grpc, http, dir string }
	var fresh []node
	var peers []string
	for i := range 3 {
		n := node{id: fmt.Sprintf("admin-%d", i+1), raft: testproc.FreeAddr(t), grpc: testproc.FreeAddr(t), http: testproc.FreeAddr(t),
			dir: filepath.Join(t.TempDir(), "data")}
		fresh = append(fresh, n)
		peers = append(peers, n.id+"="+n.raft+"="+n.grpc)
	}
	for _, n := range fresh {
		out, err := exec.Command(prism, "admin", "restore", "--snapshot", file, "--data-dir", n.dir, "--node-id", n.id,
			"--peers", strings.Join(peers, ","), "--log-format", "text").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "8 leases and 2 sessions revoked") {
			t.Fatalf("prism admin restore %s: %v\n%s", n.id, err, out)
		}
	}
	// A second restore into a used dir is refused.
	if out, err := exec.Command(prism, "admin", "restore", "--snapshot", file, "--data-dir", fresh[0].dir, "--node-id", fresh[0].id,
		"--peers", strings.Join(peers, ",")).CombinedOutput(); err == nil || !strings.Contains(string(out), "not empty") {
		t.Fatalf("restore into a used data dir: %v\n%s", err, out)
	}
	for _, n := range fresh {
		args := []string{"admin", "--node-id", n.id, "--raft-addr", n.raft, "--grpc-addr", n.grpc, "--http-addr", n.http,
			"--data-dir", n.dir, "--raft-timing", "fast", "--log-format", "text", "--gateway-no-query-auth", "--peers", strings.Join(peers, ",")}
		testproc.Start(t, n.id+"-restored", append(args, e2e.TLSArgs(t, nil, identity.Admin, n.id)...)...)
	}
	op := adminv1.NewAdminClient(e2e.Dial(t, nil, fresh[0].grpc, identity.Operator, e2e.Operator))
	linear := adminv1.Consistency_CONSISTENCY_LINEARIZABLE
	var got *adminv1.ListNamespacesResponse
	testwait.For(t, 60*time.Second, "the restored cluster to answer a linearizable read", func() (bool, string) {
		r, err := op.ListNamespaces(ctx, &adminv1.ListNamespacesRequest{Consistency: linear})
		if err != nil {
			return false, err.Error()
		}
		got = r
		return true, ""
	})
	if len(got.GetNamespaces()) != len(names) {
		t.Fatalf("restored %d namespaces, want %d", len(got.GetNamespaces()), len(names))
	}
	for i, ns := range got.GetNamespaces() {
		if ns.GetName() != names[i] || ns.GetConfig().GetLease().GetTtl().AsDuration() != lease.TTL {
			t.Fatalf("restored namespace %d = %v", i, ns)
		}
	}
	ps, err := op.ListProxies(ctx, &adminv1.ListProxiesRequest{Consistency: linear})
	if err != nil || len(ps.GetProxies()) != len(proxies) {
		t.Fatalf("restored proxies: %v, %v", ps, err)
	}
	ls, err := op.ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: linear})
	if err != nil || len(ls.GetLeases()) != 0 {
		t.Fatalf("restored leases: %v, %v (every lease of the snapshot is revoked)", ls, err)
	}
	st, err := op.GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
	if err != nil || len(st.GetMembers()) != 3 || st.GetTerm() <= info.GetTerm()+backup.TermGap {
		t.Fatalf("restored cluster status: %v, %v; want 3 members at a term above %d", st, err, info.GetTerm()+backup.TermGap)
	}

	// Each sidecar re-acquires, through any node, above every epoch before.
	for p, ids := range mailboxes {
		s := adminv1.NewSessionsClient(e2e.Dial(t, nil, fresh[2].grpc, identity.Proxy, p))
		var open *adminv1.OpenSessionResponse
		testwait.For(t, 30*time.Second, "a new session of "+p, func() (bool, string) {
			open, err = s.OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: p, RunnerId: "runner-" + p, RunnerAddress: "127.0.0.1:9001"})
			return err == nil && open.GetSession() != nil, fmt.Sprint(open, err)
		})
		if id := open.GetSession().GetId(); id <= high {
			t.Fatalf("new session id %d of %s is not above %d, the highest token before the save", id, p, high)
		}
		got, err := s.AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: p, SessionId: open.GetSession().GetId(), MailboxIds: ids})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range got.GetResults() {
			if !r.GetOk() || r.GetLease().GetEpoch() <= high {
				t.Fatalf("re-acquire %s: %v, want granted above epoch %d", r.GetMailboxId(), r, high)
			}
		}
	}
}
