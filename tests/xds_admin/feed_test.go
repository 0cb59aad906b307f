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

// countingSource counts Follow's reads of a real FSM: a look at the proxy
// routes index every round, a copy of the proxies when it moved.
type countingSource struct {
	*fsm.FSM
	looks, copies atomic.Int64
}

func (c *countingSource) ProxyRoutesIndex() uint64 {
	c.looks.Add(1)
	return c.FSM.ProxyRoutesIndex()
}

func (c *countingSource) Proxies() ([]*adminv1.ProxyInfo, uint64) {
	c.copies.Add(1)
	return c.FSM.Proxies()
}

// Lease changes (a checkpoint, applied every second while runners
// heartbeat; a grant; a release) make Follow look at the FSM again but not
// copy the proxies nor serve a new version; a proxy's runner moving does.
func TestFollowCopiesProxiesOnlyWhenTheyChange(t *testing.T) {
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
	registerAt := func(addr string) {
		apply(&adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
			Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: addr, RunnerId: "runner-a"}}}})
	}
	registerAt("127.0.0.1:8980")
	registered := index
	for _, ns := range []string{"audit", "billing"} {
		apply(&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
			Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}}})
	}
	apply(&adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: "audit@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:8980"}}})

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
	served := func(want uint64) func() bool {
		return func() bool { return cp.Version() == strconv.FormatUint(want, 10) }
	}
	await("the first state to be served", served(registered))
	if got := src.copies.Load(); got != 1 {
		t.Fatalf("%d proxy copies for the first state, want 1", got)
	}

	// leaseChange applies cmd and waits for Follow to have looked at it.
	leaseChange := func(what string, cmd *adminv1.Command) {
		t.Helper()
		looks := src.looks.Load()
		now = now.Add(time.Second)
		apply(cmd)
		await("Follow to look at "+what, func() bool { return src.looks.Load() > looks })
		if got := src.copies.Load(); got != 1 {
			t.Fatalf("%s: %d proxy copies, want still 1", what, got)
		}
		if !served(registered)() {
			t.Fatalf("%s: serving version %s, want still %d", what, cp.Version(), registered)
		}
	}
	l, _ := f.Lease("audit@p1")
	for i := range 3 {
		leaseChange("checkpoint "+strconv.Itoa(i), &adminv1.Command{Body: &adminv1.Command_CheckpointLeases{CheckpointLeases: &adminv1.CheckpointLeasesCommand{
			Checkpoints: []*adminv1.LeaseCheckpoint{{
				MailboxId: "audit@p1", Epoch: l.GetEpoch(),
				ExpiresAt: timestamppb.New(now.Add(time.Minute)), LastHeartbeatAt: timestamppb.New(now),
			}},
		}}})
	}
	leaseChange("a grant", &adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: "billing@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:8980"}}})
	leaseChange("a release", &adminv1.Command{Body: &adminv1.Command_ReleaseLease{ReleaseLease: &adminv1.ReleaseLeaseRequest{
		MailboxId: "audit@p1", RunnerId: "runner-a"}}})

	registerAt("127.0.0.1:8981")
	await("the runner's new address to be served", served(index))
	if got := src.copies.Load(); got != 2 {
		t.Fatalf("%d proxy copies after the runner moved, want 2", got)
	}
}
