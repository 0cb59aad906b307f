package server

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// A follower relays a forwarded answer of any size the leader would send
// directly: a LINEARIZABLE ListNamespaces over gRPC's default 4 MiB receive
// limit (~10k ordinary namespaces) failed ResourceExhausted on the
// follower's forwarding connection while the leader answered it. Now the
// List calls page, so such a listing comes in pages within the limit,
// through either node.
func TestForwardedAnswerOverDefaultMessageLimit(t *testing.T) {
	t.Parallel()
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	lead, leadCC := startNodeConn(t, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listen(), Bootstrap: true}})
	follower, followerCC := startNodeConn(t, NodeConfig{Raft: raftnode.Config{ID: "b", DataDir: t.TempDir(), Listener: listen()}})
	c := ctx(t)
	awaitState(t, "a to lead", func() bool { l, _ := lead.Raft.Leadership(); return l.IsLeader && lead.Lessor.Primary() })

	// Namespaces as large as validation allows, so a few hundred fill what
	// ~10k ordinary ones would.
	cfg := &adminv1.NamespaceConfig{}
	for i := range fsm.MaxTopics {
		cfg.Topics = append(cfg.Topics, fmt.Sprintf("%s%03d", strings.Repeat("t", mesh.MaxIDLen-3), i))
	}
	const want = 5 << 20
	count := want/proto.Size(&adminv1.Namespace{Name: "ns-000", Config: cfg}) + 1
	for i := range count {
		if _, err := lead.Server.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: fmt.Sprintf("ns-%03d", i), Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	// b joins only now: a cluster of one cannot lose its leader to a loaded
	// machine halfway through the writes, and b catches up from a's log.
	if _, err := lead.Server.AddVoter(c, &adminv1.AddVoterRequest{Id: "b", RaftAddress: follower.Raft.Addr(), GrpcAddress: follower.GRPCAddr()}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to follow a", func() bool {
		l, _ := follower.Raft.Leadership()
		return l.LeaderID == "a" && follower.FSM.MemberAddress("a") != ""
	})

	// Paged, the answers fit gRPC's default receive limit, which the calls
	// keep: ~10k ordinary namespaces list through a follower in pages.
	for name, cc := range map[string]*grpc.ClientConn{"leader": leadCC, "follower": followerCC} {
		got, size, pages, tok := 0, 0, 0, ""
		for {
			resp, err := adminv1.NewAdminClient(cc).ListNamespaces(c,
				&adminv1.ListNamespacesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE, PageToken: tok})
			if err != nil {
				t.Fatalf("ListNamespaces on the %s, page %d: %v", name, pages+1, err)
			}
			got, size, pages, tok = got+len(resp.GetNamespaces()), size+proto.Size(resp), pages+1, resp.GetNextPageToken()
			if tok == "" {
				break
			}
		}
		if got != count || size < want || pages < 2 {
			t.Errorf("ListNamespaces on the %s: %d namespaces in %d bytes and %d pages, want %d in over %d and several pages", name, got, size, pages, count, want)
		}
	}
}
