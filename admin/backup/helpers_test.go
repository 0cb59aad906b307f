package backup

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// builder applies commands to an FSM at increasing indexes of one term.
type builder struct {
	t     testing.TB
	f     *fsm.FSM
	term  uint64
	index uint64
}

func (b *builder) apply(cmd *adminv1.Command) any {
	b.t.Helper()
	cmd.Now = timestamppb.New(t0)
	data, err := fsm.Encode(cmd)
	if err != nil {
		b.t.Fatalf("encode: %v", err)
	}
	b.index++
	res := b.f.Apply(&raft.Log{Index: b.index, Term: b.term, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); ok {
		b.t.Fatalf("apply at %d: %v", b.index, err)
	}
	return res
}

// populate builds proxy p1 with namespaces ns-0..ns-(n-1): the first half
// leased in one session, the rest by single AcquireLease. It returns the
// highest epoch granted.
func populate(t testing.TB, term uint64, n int) (*fsm.FSM, uint64) {
	t.Helper()
	b := &builder{t: t, f: fsm.New(), term: term}
	b.apply(&adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
		Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "10.0.0.1:8980", RunnerId: "r1", Version: "0.1.0"},
	}}})
	b.apply(&adminv1.Command{Body: &adminv1.Command_PutMembers{PutMembers: &adminv1.PutMembersCommand{
		Members: []*adminv1.MemberAddress{{Id: "old-1", GrpcAddress: "10.9.9.9:8981"}},
	}}})
	var mailboxes []string
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i)
		b.apply(&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
			Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"events"}, Lease: &adminv1.LeaseConfig{
				Ttl: durationpb.New(20 * time.Second), HeartbeatInterval: durationpb.New(5 * time.Second), Grace: durationpb.New(7 * time.Second),
			}},
		}}})
		mailboxes = append(mailboxes, ns+"@p1")
	}
	open := b.apply(&adminv1.Command{Body: &adminv1.Command_OpenSession{OpenSession: &adminv1.OpenSessionRequest{
		ProxyId: "p1", RunnerId: "r1", RunnerAddress: "10.0.0.1:9090",
	}}}).(*adminv1.OpenSessionResponse)
	sid := open.GetSession().GetId()
	var high uint64
	half := mailboxes[:n/2]
	for len(half) > 0 {
		k := min(len(half), fsm.MaxBulkLeases)
		res := b.apply(&adminv1.Command{Body: &adminv1.Command_AcquireLeases{AcquireLeases: &adminv1.AcquireLeasesRequest{
			ProxyId: "p1", SessionId: sid, MailboxIds: half[:k],
		}}}).(*adminv1.AcquireLeasesResponse)
		for _, r := range res.GetResults() {
			if !r.GetOk() {
				t.Fatalf("acquire %s refused: %v", r.GetMailboxId(), r)
			}
			high = max(high, r.GetLease().GetEpoch())
		}
		half = half[k:]
	}
	for _, m := range mailboxes[n/2:] {
		res := b.apply(&adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
			MailboxId: m, RunnerId: "r1", RunnerAddress: "10.0.0.1:9090",
		}}}).(*adminv1.AcquireLeaseResponse)
		if !res.GetGranted() {
			t.Fatalf("acquire %s refused: %v", m, res)
		}
		high = max(high, res.GetLease().GetEpoch())
	}
	return b.f, high
}

// fakeNode is a raft member at a fixed term.
type fakeNode struct {
	id   string
	term uint64
}

func (n fakeNode) ID() string   { return n.id }
func (n fakeNode) Term() uint64 { return n.term }
