package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/admin/server"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// A list over gRPC's default 4 MiB message limit comes whole: with that
// limit, listing ~10k namespaces failed ResourceExhausted when the admin
// answered it in one message; now prismctl asks page after page (the admin
// cuts pages at 2 MiB).
func TestListOverDefaultMessageLimit(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	n, err := server.Start(server.NodeConfig{
		Raft:     raftnode.Config{ID: "solo", Bootstrap: true, Timing: raftnode.FastTiming()},
		GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TLS: p.Source(identity.Admin, "solo"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Stop(ctx)
	})
	a := testAdmin{addr: n.GRPCAddr(), pki: p}

	// Namespaces as large as validation allows, so a few hundred fill what
	// ~10k ordinary ones would.
	cfg := &adminv1.NamespaceConfig{}
	for i := range fsm.MaxTopics {
		cfg.Topics = append(cfg.Topics, fmt.Sprintf("%s%03d", strings.Repeat("t", mesh.MaxIDLen-3), i))
	}
	const want = 5 << 20
	count := want/proto.Size(&adminv1.Namespace{Name: "ns-000", Config: cfg}) + 1
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testwait.For(t, 20*time.Second, "solo to lead", func() (bool, string) {
		l, _ := n.Raft.Leadership()
		return l.IsLeader, "leader " + l.LeaderID
	})
	for i := range count {
		if _, err := n.Server.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: fmt.Sprintf("ns-%03d", i), Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}

	out, err := prismctl(t, append(a.as(identity.Operator, "ops"), "--timeout", "20s", "namespace", "list", "-o", "json")...)
	if err != nil {
		t.Fatalf("namespace list: %v\n%.500s", err, out)
	}
	var got struct {
		Namespaces []json.RawMessage `json:"namespaces"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("namespace list -o json: %v\n%.500s", err, out)
	}
	if len(got.Namespaces) != count {
		t.Errorf("namespace list: %d namespaces, want %d", len(got.Namespaces), count)
	}
}
