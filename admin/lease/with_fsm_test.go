package lease

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"
)

// node is a real FSM with the lessor as its observer, fed log entries the
// way the leader would propose them: stamped with the lessor's clock.
type node struct {
	t     *testing.T
	clk   *clocktesting.FakeClock
	fsm   *fsm.FSM
	l     *Lessor
	index uint64
	// runner is the one proxy p's registration names.
	runner string
}

// newNode starts with proxy p registered and namespaces a and b placed on
// it, so mailboxes a@p and b@p may be acquired.
func newNode(t *testing.T) *node {
	clk := clocktesting.NewFakeClock(t0)
	l := New(Config{Clock: clk, ExtendOnPromote: extend, Logger: quiet})
	n := &node{t: t, clk: clk, l: l, fsm: fsm.New(fsm.WithLeaseObserver(l))}
	n.register("p")
	for _, ns := range []string{"a", "b"} {
		n.apply(&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
			Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}},
		}}})
	}
	return n
}

// register (re-)registers proxy p with runner as its runner.
func (n *node) register(runner string) {
	n.apply(&adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
		Registration: &adminv1.ProxyRegistration{ProxyId: "p", Address: "10.0.0.1:8980", RunnerId: runner},
	}}})
	n.runner = runner
}

func (n *node) apply(cmd *adminv1.Command) any {
	n.t.Helper()
	cmd.Now = timestamppb.New(n.clk.Now())
	data, err := fsm.Encode(cmd)
	if err != nil {
		n.t.Fatalf("encode: %v", err)
	}
	n.index++
	res := n.fsm.Apply(&raft.Log{Index: n.index, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); ok {
		n.t.Fatalf("apply: %v", err)
	}
	return res
}

// acquire first makes runner p's registered runner, if it is not: a runner
// change of the proxy is how two runners legitimately contend for a mailbox.
func (n *node) acquire(mailbox, runner string) *adminv1.AcquireLeaseResponse {
	if runner != n.runner {
		n.register(runner)
	}
	return n.apply(&adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: mailbox, RunnerId: runner, RunnerAddress: "10.0.0.1:9090",
	}}}).(*adminv1.AcquireLeaseResponse)
}

func (n *node) expire(refs []*adminv1.LeaseRef) *fsm.ExpireResult {
	return n.apply(&adminv1.Command{Body: &adminv1.Command_ExpireLeases{ExpireLeases: &adminv1.ExpireLeasesCommand{Leases: refs}}}).(*fsm.ExpireResult)
}

func TestLeaseLifecycleThroughTheFSM(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.l.Promote()
	got := n.acquire("a@p", "r1")
	if !got.GetGranted() {
		t.Fatalf("acquire: %v", got)
	}
	epoch := got.GetLease().GetEpoch()
	if denied := n.acquire("a@p", "r2"); denied.GetGranted() || denied.GetRefusal().GetCurrent().GetRunnerId() != "r1" {
		t.Fatalf("second runner: %v", denied)
	}
	// Heartbeats keep it alive well past the default ttl + grace.
	for range 10 {
		n.clk.Step(fsm.DefaultHeartbeatInterval)
		if res := renewNow(n.l, hb("a@p", "r1", epoch)); !res.GetRenewed() {
			t.Fatalf("renew: %v", res)
		}
		if refs := n.l.Expired(); len(refs) != 0 {
			t.Fatalf("expired while heartbeating: %v", refs)
		}
	}
	cps := n.l.Checkpoints(100)
	n.apply(&adminv1.Command{Body: &adminv1.Command_CheckpointLeases{CheckpointLeases: &adminv1.CheckpointLeasesCommand{Checkpoints: cps}}})
	if l, _ := n.fsm.Lease("a@p"); !l.GetExpiresAt().AsTime().Equal(n.clk.Now().Add(fsm.DefaultLeaseTTL)) {
		t.Fatalf("checkpoint not in the FSM: %v", l)
	}
	// The runner dies. Nothing expires before ttl + grace.
	n.clk.Step(fsm.DefaultLeaseTTL + fsm.DefaultLeaseGrace)
	if refs := n.l.Expired(); len(refs) != 0 {
		t.Fatalf("expired at exactly ttl + grace: %v", refs)
	}
	n.clk.Step(time.Millisecond)
	refs := n.l.Expired()
	if res := n.expire(refs); len(res.Expired) != 1 || res.Expired[0].GetEpoch() != epoch {
		t.Fatalf("expire %v: %v", refs, res)
	}
	if l, _ := n.fsm.Lease("a@p"); l != nil {
		t.Fatalf("lease survived its expiry: %v", l)
	}
	if res := renewNow(n.l, hb("a@p", "r1", epoch)); res.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE {
		t.Fatalf("renew after expiry: %v", res)
	}
	if again := n.acquire("a@p", "r2"); !again.GetGranted() || again.GetLease().GetEpoch() <= epoch {
		t.Fatalf("re-acquire by r2: %v", again)
	}
}

func TestExpireRacingAReacquireKeepsTheNewGrant(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.l.Promote()
	old := n.acquire("a@p", "r1").GetLease().GetEpoch()
	n.clk.Step(fsm.DefaultLeaseTTL + fsm.DefaultLeaseGrace + time.Millisecond)
	refs := n.l.Expired()
	if len(refs) != 1 {
		t.Fatalf("refs %v", refs)
	}
	// Ordered before the expire in the log: r1 releases, r2 acquires.
	n.apply(&adminv1.Command{Body: &adminv1.Command_ReleaseLease{ReleaseLease: &adminv1.ReleaseLeaseRequest{MailboxId: "a@p", RunnerId: "r1"}}})
	fresh := n.acquire("a@p", "r2").GetLease().GetEpoch()
	if res := n.expire(refs); len(res.Expired) != 0 {
		t.Fatalf("stale expire removed %v", res.Expired)
	}
	if l, _ := n.fsm.Lease("a@p"); l.GetEpoch() != fresh || fresh <= old {
		t.Fatalf("lease %v, want r2's epoch %d", l, fresh)
	}
	if res := renewNow(n.l, hb("a@p", "r2", fresh)); !res.GetRenewed() {
		t.Fatalf("new holder refused: %v", res)
	}
}

func TestFollowerMirrorsLeasesForPromotion(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	epoch := n.acquire("a@p", "r1").GetLease().GetEpoch()
	if res := renewNow(n.l, hb("a@p", "r1", epoch)); res.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER {
		t.Fatalf("follower renewed: %v", res)
	}
	n.clk.Step(time.Hour)
	n.l.Promote()
	if res := renewNow(n.l, hb("a@p", "r1", epoch)); !res.GetRenewed() {
		t.Fatalf("promoted lessor does not know the follower-era grant: %v", res)
	}
}

func TestRestoreOnPrimaryResetsLeases(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	epoch := n.acquire("a@p", "r1").GetLease().GetEpoch()
	n.acquire("b@p", "r2")
	snap, err := n.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	// A fresh node restores the snapshot while it is (already) primary,
	// long after the grants: nothing may be due before a full ttl + extend.
	m := newNode(t)
	m.clk.SetTime(t0.Add(time.Hour))
	m.l.Promote()
	if !m.l.Primary() {
		t.Fatal("not primary after Promote")
	}
	if err := m.fsm.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if m.l.Len() != 2 {
		t.Fatalf("mirror has %d leases after restore", m.l.Len())
	}
	restored := m.clk.Now()
	if res := renewNow(m.l, hb("a@p", "r1", epoch)); !res.GetRenewed() {
		t.Fatalf("restored lease not renewable: %v", res)
	}
	// a@p was renewed at restore (due after ttl + grace); b@p keeps the
	// promotion treatment (due after ttl + extend + grace).
	due := map[string]time.Duration{}
	for len(due) < 2 && m.clk.Now().Sub(restored) < time.Minute {
		for _, r := range m.l.Expired() {
			due[r.GetMailboxId()] = m.clk.Now().Sub(restored)
		}
		m.clk.Step(10 * time.Millisecond)
	}
	if a := fsm.DefaultLeaseTTL + fsm.DefaultLeaseGrace; due["a@p"] <= a || due["a@p"] > a+10*time.Millisecond {
		t.Fatalf("a@p due at restore+%s, want just after %s", due["a@p"], a)
	}
	if b := fsm.DefaultLeaseTTL + extend + fsm.DefaultLeaseGrace; due["b@p"] <= b || due["b@p"] > b+10*time.Millisecond {
		t.Fatalf("b@p due at restore+%s, want just after %s", due["b@p"], b)
	}
	m.l.Demote()
	if m.l.Primary() {
		t.Fatal("primary after Demote")
	}
}

type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }
