package fsm

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var t0 = time.Date(2026, 11, 22, 2, 0, 0, 0, time.UTC)

func at(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }

// c builds a command stamped at t0+d.
func c(d time.Duration, body any) *adminv1.Command {
	cmd := &adminv1.Command{Now: at(d)}
	switch b := body.(type) {
	case *adminv1.RegisterProxyRequest:
		cmd.Body = &adminv1.Command_RegisterProxy{RegisterProxy: b}
	case *adminv1.ProxyHeartbeatRequest:
		cmd.Body = &adminv1.Command_ProxyHeartbeat{ProxyHeartbeat: b}
	case *adminv1.MarkProxiesStaleCommand:
		cmd.Body = &adminv1.Command_MarkProxiesStale{MarkProxiesStale: b}
	case *adminv1.CreateNamespaceRequest:
		cmd.Body = &adminv1.Command_CreateNamespace{CreateNamespace: b}
	case *adminv1.DeleteNamespaceRequest:
		cmd.Body = &adminv1.Command_DeleteNamespace{DeleteNamespace: b}
	case *adminv1.AcquireLeaseRequest:
		cmd.Body = &adminv1.Command_AcquireLease{AcquireLease: b}
	case *adminv1.ReleaseLeaseRequest:
		cmd.Body = &adminv1.Command_ReleaseLease{ReleaseLease: b}
	case *adminv1.ExpireLeasesCommand:
		cmd.Body = &adminv1.Command_ExpireLeases{ExpireLeases: b}
	case *adminv1.CheckpointLeasesCommand:
		cmd.Body = &adminv1.Command_CheckpointLeases{CheckpointLeases: b}
	case *adminv1.PutMembersCommand:
		cmd.Body = &adminv1.Command_PutMembers{PutMembers: b}
	case *adminv1.RemoveMemberCommand:
		cmd.Body = &adminv1.Command_RemoveMember{RemoveMember: b}
	case *adminv1.OpenSessionRequest:
		cmd.Body = &adminv1.Command_OpenSession{OpenSession: b}
	case *adminv1.CloseSessionRequest:
		cmd.Body = &adminv1.Command_CloseSession{CloseSession: b}
	case *adminv1.AcquireLeasesRequest:
		cmd.Body = &adminv1.Command_AcquireLeases{AcquireLeases: b}
	case *adminv1.ReleaseLeasesRequest:
		cmd.Body = &adminv1.Command_ReleaseLeases{ReleaseLeases: b}
	case *adminv1.ExpireSessionsCommand:
		cmd.Body = &adminv1.Command_ExpireSessions{ExpireSessions: b}
	case *adminv1.StartMoveCommand:
		cmd.Body = &adminv1.Command_StartMove{StartMove: b}
	case *adminv1.SwitchMoveCommand:
		cmd.Body = &adminv1.Command_SwitchMove{SwitchMove: b}
	case *adminv1.EndHandoffCommand:
		cmd.Body = &adminv1.Command_EndHandoff{EndHandoff: b}
	case *adminv1.AbandonMoveCommand:
		cmd.Body = &adminv1.Command_AbandonMove{AbandonMove: b}
	case *adminv1.RebalanceCommand:
		cmd.Body = &adminv1.Command_Rebalance{Rebalance: b}
	case *adminv1.CordonProxyCommand:
		cmd.Body = &adminv1.Command_CordonProxy{CordonProxy: b}
	case *adminv1.DrainProxyRequest:
		cmd.Body = &adminv1.Command_DrainProxy{DrainProxy: b}
	default:
		panic(fmt.Sprintf("no command body for %T", body))
	}
	return cmd
}

func register(id string) *adminv1.RegisterProxyRequest {
	return &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: id, Address: id + ".prism.local:8980", Version: "0.1.0",
		Capabilities: []string{"mailbox"}, Labels: map[string]string{"tier": "a"}, Region: "eu-west-1", Zone: "eu-west-1a",
	}}
}

// registerRunner registers a proxy whose mailboxes runner serves.
func registerRunner(id, runner string) *adminv1.RegisterProxyRequest {
	r := register(id)
	r.Registration.RunnerId = runner
	return r
}

// ownerOf is the proxy placement puts namespace on when live are the live
// proxies.
func ownerOf(namespace string, live ...string) string {
	tab := placement.Compute(live)
	return tab.Owner(placement.Partition(namespace))
}

// nsOn is the first namespace "{prefix}-{n}" placed on proxy when live are
// the live proxies, so a test can make a mailbox legitimate on the proxy it
// wants.
func nsOn(prefix, proxy string, live ...string) string {
	tab := placement.Compute(live)
	for n := 0; ; n++ {
		name := fmt.Sprintf("%s-%d", prefix, n)
		if tab.Owner(placement.Partition(name)) == proxy {
			return name
		}
	}
}

func createNS(name string, topics ...string) *adminv1.CreateNamespaceRequest {
	return &adminv1.CreateNamespaceRequest{Namespace: name, Config: &adminv1.NamespaceConfig{
		Topics: topics,
		Lease: &adminv1.LeaseConfig{
			Ttl: durationpb.New(20 * time.Second), HeartbeatInterval: durationpb.New(5 * time.Second), Grace: durationpb.New(7 * time.Second),
		},
		ValidationMode: adminv1.ValidationMode_VALIDATION_MODE_STRICT,
		Retention:      &adminv1.RetentionConfig{MaxAge: durationpb.New(90 * 24 * time.Hour), MaxSizeBytes: 1 << 30},
	}}
}

func acquire(mailbox, runner string) *adminv1.AcquireLeaseRequest {
	return &adminv1.AcquireLeaseRequest{MailboxId: mailbox, RunnerId: runner, RunnerAddress: runner + ".svc:9090"}
}

// harness applies commands with increasing raft indexes. Its entries carry
// term 0, so a grant's epoch is its index (epochAt) and cases can name
// epochs by index; epoch_test.go covers real terms.
type harness struct {
	t     testing.TB
	f     *FSM
	index uint64
	term  uint64
}

func newHarness(t testing.TB, opts ...Option) *harness {
	return &harness{t: t, f: New(opts...)}
}

// apply encodes and applies a command as the next log entry, returning
// Apply's result (a response or an error).
func (h *harness) apply(cmd *adminv1.Command) any {
	h.t.Helper()
	data, err := proto.Marshal(cmd)
	if err != nil {
		h.t.Fatalf("marshal: %v", err)
	}
	return h.applyBytes(data)
}

func (h *harness) applyBytes(data []byte) any {
	h.index++
	res := h.f.Apply(&raft.Log{Index: h.index, Term: h.term, Type: raft.LogCommand, Data: data})
	h.checkMoveIndexes()
	return res
}

// checkMoveIndexes fails the test unless the indexes derived from the
// namespaces (moving, byPartition, byProxy, misplaced) and the cached
// pending count agree with the tables, recomputed: every command of every
// test that uses the harness checks them.
func (h *harness) checkMoveIndexes() {
	h.t.Helper()
	h.f.mu.RLock()
	st := h.f.st
	ref := &state{namespaces: st.namespaces, proxies: st.proxies, table: st.table}
	ref.reindexNamespaces()
	var pending []string
	for _, name := range sortedKeys(st.namespaces) {
		if st.pendingMove(st.namespaces[name]) {
			pending = append(pending, name)
		}
	}
	indexed := st.pendingMoves()
	for _, ix := range []struct {
		name      string
		got, want any
	}{
		{"moving", st.moving, ref.moving},
		{"byPartition", st.byPartition, ref.byPartition},
		{"byProxy", st.byProxy, ref.byProxy},
		{"misplaced", st.misplaced, ref.misplaced},
	} {
		if !reflect.DeepEqual(ix.got, ix.want) {
			h.f.mu.RUnlock()
			h.t.Fatalf("entry %d: %s index %v, want %v", h.index, ix.name, ix.got, ix.want)
		}
	}
	h.f.mu.RUnlock()
	if !slices.Equal(indexed, pending) {
		h.t.Fatalf("entry %d: pendingMoves %v, want %v", h.index, indexed, pending)
	}
	if got, _ := h.f.PendingMoves(); got != len(pending) {
		h.t.Fatalf("entry %d: PendingMoves %d, want %d", h.index, got, len(pending))
	}
}

// must applies and fails the test on an error result.
func (h *harness) must(cmd *adminv1.Command) any {
	h.t.Helper()
	res := h.apply(cmd)
	if err, ok := res.(error); ok {
		h.t.Fatalf("apply %s: %v", CommandType(cmd), err)
	}
	return res
}

// dump is the complete state as deterministic bytes: the snapshot stream.
func dump(t testing.TB, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("persist: %v", err)
	}
	return sink.Bytes()
}

// tables is dump without the applied index, which advances on every entry
// even when the entry is refused.
func tables(t testing.TB, f *FSM) []byte {
	t.Helper()
	f.mu.RLock()
	s := &snapshot{st: f.st.clone()}
	f.mu.RUnlock()
	var buf bytes.Buffer
	if err := s.write(&buf); err != nil {
		t.Fatalf("write: %v", err)
	}
	return buf.Bytes()
}

func memberAddrs(f *FSM) map[string]string {
	m, _ := f.MemberAddresses()
	return m
}

// roundTrip snapshots f, restores into a fresh FSM and checks that every
// table and every accessor answers identically (Nomad's fsm_test helper).
func roundTrip(t *testing.T, f *FSM) *FSM {
	t.Helper()
	before := dump(t, f)
	g := New()
	if err := g.Restore(io.NopCloser(bytes.NewReader(before))); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if after := dump(t, g); !bytes.Equal(before, after) {
		t.Fatal("snapshot of the restored FSM differs from the original")
	}
	same := func(what string, a, b any) {
		t.Helper()
		if !equalAny(a, b) {
			t.Fatalf("%s differs after restore:\n%v\n%v", what, a, b)
		}
	}
	p1, i1 := f.Proxies()
	p2, i2 := g.Proxies()
	same("proxies", p1, p2)
	same("applied index", i1, i2)
	n1, _ := f.Namespaces()
	n2, _ := g.Namespaces()
	same("namespaces", n1, n2)
	l1, _ := f.Leases()
	l2, _ := g.Leases()
	same("leases", l1, l2)
	r1, a1, v1 := f.Routes()
	r2, a2, v2 := g.Routes()
	same("routes", r1, r2)
	same("namespace routes", a1, a2)
	same("routes version", v1, v2)
	same("proxy routes index", f.ProxyRoutesIndex(), g.ProxyRoutesIndex())
	for _, a := range a1 {
		r, _ := g.NamespaceRoute(a.GetNamespace())
		same("route of namespace "+a.GetNamespace(), a, r)
	}
	s1, _ := f.Sessions()
	s2, _ := g.Sessions()
	same("sessions", s1, s2)
	same("counts", f.Counts(), g.Counts())
	if m1, m2 := memberAddrs(f), memberAddrs(g); !maps.Equal(m1, m2) {
		t.Fatalf("members differ after restore:\n%v\n%v", m1, m2)
	}
	for _, p := range p1 {
		id := p.GetProxy().GetRegistration().GetProxyId()
		w1, _ := f.Assignments(id)
		w2, _ := g.Assignments(id)
		same("assignments of "+id, w1, w2)
	}
	return g
}

func equalAny(a, b any) bool {
	switch x := a.(type) {
	case proto.Message:
		return proto.Equal(x, b.(proto.Message))
	case []*adminv1.ProxyInfo:
		return equalSlices(x, b.([]*adminv1.ProxyInfo))
	case []*adminv1.Namespace:
		return equalSlices(x, b.([]*adminv1.Namespace))
	case []*adminv1.Lease:
		return equalSlices(x, b.([]*adminv1.Lease))
	case []*adminv1.Route:
		return equalSlices(x, b.([]*adminv1.Route))
	case []*adminv1.NamespaceRoute:
		return equalSlices(x, b.([]*adminv1.NamespaceRoute))
	case []*adminv1.Session:
		return equalSlices(x, b.([]*adminv1.Session))
	default:
		return a == b
	}
}

func equalSlices[M proto.Message](a, b []M) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

type memSink struct {
	bytes.Buffer
	cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { return nil }
