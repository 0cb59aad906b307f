package xdsadmin

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/ir"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// countingSource counts Follow's reads of a real FSM.
type countingSource struct {
	*fsm.FSM
	routes, proxies atomic.Int64
}

func (c *countingSource) Routes() ([]*adminv1.Route, []*adminv1.NamespaceRoute, uint64) {
	c.routes.Add(1)
	return c.FSM.Routes()
}

func (c *countingSource) Proxies() ([]*adminv1.ProxyInfo, uint64) {
	c.proxies.Add(1)
	return c.FSM.Proxies()
}

// A lease checkpoint (applied every second while runners heartbeat) makes
// Follow look at the FSM again but not copy the routes; a grant does.
func TestFollowCopiesRoutesOnlyWhenTheyChange(t *testing.T) {
	t.Parallel()
	f := fsm.New()
	var index uint64
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	apply := func(cmd *adminv1.Command) {
		t.Helper()
		cmd.Now = timestamppb.New(now)
		data, err := fsm.Encode(cmd)
		if err != nil {
			t.Fatal(err)
		}
		index++
		if err, ok := f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}).(error); ok {
			t.Fatalf("apply %s: %v", fsm.CommandType(cmd), err)
		}
	}
	apply(&adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
		Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:8980", RunnerId: "runner-a"}}}})
	for _, ns := range []string{"audit", "billing"} {
		apply(&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
			Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}}})
	}
	apply(&adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: "audit@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:9001"}}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp := xds.New(ctx, xds.Config{})
	go func() { _ = cp.Run(ctx) }()
	src := &countingSource{FSM: f}
	cfg := xds.FollowConfig{
		Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
		Resolve: func(context.Context, string) ([]string, error) { return nil, nil },
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = cp.Follow(ctx, src, cfg) }()
	defer func() { cancel(); <-done }()

	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	await("the first routes to be served", func() bool { return cp.Version() == strconv.FormatUint(index, 10) })
	if got := src.routes.Load(); got != 1 {
		t.Fatalf("%d route copies for the first state, want 1", got)
	}

	l, _ := f.Lease("audit@p1")
	for i := range 3 {
		rounds := src.proxies.Load()
		now = now.Add(time.Second)
		apply(&adminv1.Command{Body: &adminv1.Command_CheckpointLeases{CheckpointLeases: &adminv1.CheckpointLeasesCommand{
			Checkpoints: []*adminv1.LeaseCheckpoint{{
				MailboxId: "audit@p1", Epoch: l.GetEpoch(),
				ExpiresAt: timestamppb.New(now.Add(time.Minute)), LastHeartbeatAt: timestamppb.New(now),
			}},
		}}})
		await("Follow to look at checkpoint "+strconv.Itoa(i), func() bool { return src.proxies.Load() > rounds })
		if got := src.routes.Load(); got != 1 {
			t.Fatalf("checkpoint %d: %d route copies, want still 1", i, got)
		}
	}

	apply(&adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: "billing@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:9001"}}})
	await("the new grant to be served", func() bool { return cp.Version() == strconv.FormatUint(index, 10) })
	if got := src.routes.Load(); got != 2 {
		t.Fatalf("%d route copies after a grant, want 2", got)
	}
}
