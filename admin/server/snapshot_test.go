package server

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// SaveSnapshot is an operator's: a reader, a proxy and a client without a
// certificate are refused and no file is written; an operator's save,
// through a follower, holds every namespace the leader acknowledged.
func TestSaveSnapshotOperatorsOnlyThroughAnyNode(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	lead := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listen(), Bootstrap: true}})
	follower := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{
		ID: "b", DataDir: t.TempDir(), Listener: listen(), JoinPeers: []raftnode.Peer{{ID: "a", Addr: lead.Raft.Addr()}},
	}})
	c := ctx(t)
	op := adminv1.NewAdminClient(as(t, p, lead.GRPCAddr(), identity.Operator, "alice"))
	if _, err := op.AddVoter(c, &adminv1.AddVoterRequest{Id: "b", RaftAddress: follower.Raft.Addr(), GrpcAddress: follower.GRPCAddr()}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to follow a", func() bool {
		l, _ := follower.Raft.Leadership()
		return l.LeaderID == "a" && follower.FSM.MemberAddress("a") != ""
	})
	cp := adminv1.NewControlPlaneClient(as(t, p, lead.GRPCAddr(), identity.Operator, "alice"))
	for _, ns := range []string{"n1", "n2", "n3"} {
		if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	via := follower.GRPCAddr()
	noCert := dialAs(t, via, &tls.Config{RootCAs: p.Source(identity.Operator, "x").ClientConfig(pki.RoleIs(identity.Admin)).RootCAs, MinVersion: tls.VersionTLS13})
	for _, r := range []struct {
		who  string
		c    adminv1.AdminClient
		want codes.Code
	}{
		{"a reader", adminv1.NewAdminClient(as(t, p, via, identity.Reader, "rita")), codes.PermissionDenied},
		{"a proxy", adminv1.NewAdminClient(as(t, p, via, identity.Proxy, "pa")), codes.PermissionDenied},
		{"no certificate", adminv1.NewAdminClient(noCert), codes.Unavailable},
	} {
		_, err := backup.Save(c, r.c, filepath.Join(dir, "refused.snap"))
		wantCode(t, "a save by "+r.who, err, r.want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused saves left %d files", len(entries))
	}

	path := filepath.Join(dir, "ok.snap")
	info, err := backup.Save(c, adminv1.NewAdminClient(as(t, p, via, identity.Operator, "alice")), path)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetNodeId() != "a" || info.GetNamespaceCount() != 3 || info.GetTerm() != lead.Raft.Term() {
		t.Fatalf("info = %v, want the leader's, with 3 namespaces, at its term %d", info, lead.Raft.Term())
	}
	if _, _, err := backup.ReadFile(path); err != nil {
		t.Fatalf("the saved file does not verify: %v", err)
	}
}
