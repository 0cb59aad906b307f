package fsm

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

const ns = "audit-logs"

func mailboxID(namespace, proxyID string) string {
	return mesh.MailboxID{Namespace: namespace, Proxy: proxyID}.String()
}

// base is the state every command case starts from: two live proxies, one
// namespace placed on one of them (owner, whose runner is runner-a; the other
// proxy's is runner-b), and a lease on its mailbox (epoch 4).
func base(t *testing.T) (h *harness, owner, other, mailbox string) {
	h = newHarness(t)
	owner = ownerOf(ns, "proxy-01", "proxy-02")
	other = map[string]string{"proxy-01": "proxy-02", "proxy-02": "proxy-01"}[owner]
	runner := map[string]string{owner: "runner-a", other: "runner-b"}
	h.must(c(0, registerRunner("proxy-01", runner["proxy-01"])))
	h.must(c(time.Second, registerRunner("proxy-02", runner["proxy-02"])))
	res := h.must(c(2*time.Second, createNS(ns, "audit.events"))).(*adminv1.CreateNamespaceResponse)
	if got := res.GetNamespace().GetAssignedProxyId(); got != owner {
		t.Fatalf("namespace placed on %s, placement says %s", got, owner)
	}
	mailbox = mailboxID(ns, owner)
	if got := h.must(c(3*time.Second, acquire(mailbox, "runner-a"))).(*adminv1.AcquireLeaseResponse); !got.GetGranted() || got.GetLease().GetEpoch() != 4 {
		t.Fatalf("setup acquire: %v", got)
	}
	return h, owner, other, mailbox
}

func TestCommands(t *testing.T) {
	t.Parallel()
	type env struct {
		h                     *harness
		owner, other, mailbox string
		res                   any
		lease                 *adminv1.Lease
		namespace             *adminv1.Namespace
	}
	cases := []struct {
		name    string
		cmd     func(e *env) *adminv1.Command
		wantErr error
		check   func(t *testing.T, e *env)
	}{
		{
			name: "register new proxy is live and may take partitions",
			cmd:  func(e *env) *adminv1.Command { return c(time.Minute, register("proxy-03")) },
			check: func(t *testing.T, e *env) {
				res := e.res.(*adminv1.RegisterProxyResponse)
				p, _ := e.h.f.Proxy("proxy-03")
				if p.GetProxy().GetStatus() != adminv1.ProxyStatus_PROXY_STATUS_LIVE || !proto.Equal(p.GetProxy().GetLastSeen(), at(time.Minute)) {
					t.Fatalf("proxy-03 = %v", p)
				}
				tab := placement.Compute([]string{"proxy-01", "proxy-02", "proxy-03"})
				if !equalSlices(res.GetPartitionRanges(), tab.Ranges("proxy-03")) || len(res.GetPartitionRanges()) == 0 {
					t.Fatalf("ranges %v, want %v", res.GetPartitionRanges(), tab.Ranges("proxy-03"))
				}
				if want := tab.Owner(placement.Partition(ns)); e.namespace.GetAssignedProxyId() != want {
					t.Fatalf("namespace on %s, placement says %s", e.namespace.GetAssignedProxyId(), want)
				}
			},
		},
		{
			name: "re-register replaces fields and keeps registered_at",
			cmd: func(e *env) *adminv1.Command {
				r := register(e.owner)
				r.Registration.Version = "0.2.0"
				return c(time.Minute, r)
			},
			check: func(t *testing.T, e *env) {
				p, _ := e.h.f.Proxy(e.owner)
				if p.GetProxy().GetRegistration().GetVersion() != "0.2.0" || !proto.Equal(p.GetProxy().GetLastSeen(), at(time.Minute)) {
					t.Fatalf("proxy = %v", p)
				}
				if at0 := p.GetProxy().GetRegisteredAt().AsTime(); !at0.Before(t0.Add(2 * time.Second)) {
					t.Fatalf("registered_at moved to %v", at0)
				}
				if got := e.res.(*adminv1.RegisterProxyResponse).GetAssignments(); len(got) != 1 || got[0].GetMailboxId() != e.mailbox {
					t.Fatalf("assignments = %v", got)
				}
			},
		},
		{
			name: "proxy heartbeat refreshes last_seen and health",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: e.owner, NamespaceHealth: []*adminv1.NamespaceHealth{
					{Namespace: "zz", Status: adminv1.HealthStatus_HEALTH_STATUS_DEGRADED},
					{Namespace: ns, Status: adminv1.HealthStatus_HEALTH_STATUS_HEALTHY, ActiveSessions: 3},
				}})
			},
			check: func(t *testing.T, e *env) {
				p := e.res.(*adminv1.ProxyHeartbeatResponse).GetProxy()
				if !proto.Equal(p.GetLastSeen(), at(time.Minute)) || p.GetNamespaceHealth()[0].GetNamespace() != ns {
					t.Fatalf("proxy = %v (health must be sorted)", p)
				}
			},
		},
		{
			name: "proxy heartbeat from an unregistered proxy",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: "proxy-99"})
			},
			wantErr: ErrProxyNotFound,
		},
		{
			name: "mark stale moves the namespaces to the survivor",
			cmd: func(e *env) *adminv1.Command {
				p, _ := e.h.f.Proxy(e.owner)
				return c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: e.owner, LastSeen: p.GetProxy().GetLastSeen()}}})
			},
			check: func(t *testing.T, e *env) {
				if got := e.res.(*MarkStaleResult).Marked; len(got) != 1 || got[0] != e.owner {
					t.Fatalf("marked %v", got)
				}
				if e.namespace.GetAssignedProxyId() != e.other || e.namespace.GetAssignmentIndex() != e.h.index {
					t.Fatalf("namespace = %v, want on %s at %d", e.namespace, e.other, e.h.index)
				}
				if w, _ := e.h.f.Assignments(e.owner); len(w.GetAssignments())+len(w.GetPartitionRanges()) != 0 {
					t.Fatalf("stale proxy still assigned %v", w)
				}
				if e.lease == nil {
					t.Fatal("marking a proxy stale removed its lease; only expiry may")
				}
			},
		},
		{
			name: "mark stale with an old last_seen is ignored",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: e.owner, LastSeen: at(-time.Hour)}}})
			},
			check: func(t *testing.T, e *env) {
				if len(e.res.(*MarkStaleResult).Marked) != 0 || e.namespace.GetAssignedProxyId() != e.owner {
					t.Fatalf("stale mark applied: %v", e.namespace)
				}
			},
		},
		{
			name: "create namespace places it by partition",
			cmd:  func(e *env) *adminv1.Command { return c(time.Minute, createNS("$admin", "admin.events")) },
			check: func(t *testing.T, e *env) {
				n := e.res.(*adminv1.CreateNamespaceResponse).GetNamespace()
				tab := placement.Compute([]string{"proxy-01", "proxy-02"})
				want := tab.Owner(placement.Partition("$admin"))
				if n.GetPartition() != placement.Partition("$admin") || n.GetAssignedProxyId() != want || n.GetCreatedIndex() != e.h.index {
					t.Fatalf("namespace = %v, want proxy %s", n, want)
				}
			},
		},
		{
			name: "create identical namespace again is a no-op success",
			cmd:  func(e *env) *adminv1.Command { return c(time.Minute, createNS(ns, "audit.events")) },
			check: func(t *testing.T, e *env) {
				res := e.res.(*adminv1.CreateNamespaceResponse)
				if res.GetCreated() || res.GetNamespace().GetCreatedIndex() != 3 {
					t.Fatalf("re-create = %v", res)
				}
			},
		},
		{
			name:    "create namespace with a different config",
			cmd:     func(e *env) *adminv1.Command { return c(time.Minute, createNS(ns, "other.topic")) },
			wantErr: ErrNamespaceExists,
		},
		{
			name: "delete namespace keeps its leases",
			cmd:  func(e *env) *adminv1.Command { return c(time.Minute, &adminv1.DeleteNamespaceRequest{Namespace: ns}) },
			check: func(t *testing.T, e *env) {
				if !e.res.(*adminv1.DeleteNamespaceResponse).GetDeleted() || e.namespace != nil || e.lease == nil {
					t.Fatalf("delete: res %v namespace %v lease %v", e.res, e.namespace, e.lease)
				}
			},
		},
		{
			name: "delete missing namespace succeeds with deleted=false",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.DeleteNamespaceRequest{Namespace: "nope"})
			},
			check: func(t *testing.T, e *env) {
				if e.res.(*adminv1.DeleteNamespaceResponse).GetDeleted() {
					t.Fatal("deleted a namespace that did not exist")
				}
			},
		},
		{
			name: "acquire a free mailbox: epoch is the log index, timing from the namespace",
			cmd: func(e *env) *adminv1.Command {
				e.h.must(c(50*time.Second, createNS(nsOn("billing", e.other, "proxy-01", "proxy-02"), "billing.events")))
				return c(time.Minute, acquire(mailboxID(nsOn("billing", e.other, "proxy-01", "proxy-02"), e.other), "runner-b"))
			},
			check: func(t *testing.T, e *env) {
				l := e.res.(*adminv1.AcquireLeaseResponse).GetLease()
				billing := nsOn("billing", e.other, "proxy-01", "proxy-02")
				if l.GetEpoch() != e.h.index || l.GetNamespace() != billing || l.GetProxyId() != e.other || l.GetPartition() != placement.Partition(billing) {
					t.Fatalf("lease = %v", l)
				}
				if l.GetTtl().AsDuration() != 20*time.Second || l.GetGrace().AsDuration() != 7*time.Second ||
					!proto.Equal(l.GetExpiresAt(), at(time.Minute+20*time.Second)) {
					t.Fatalf("lease timing = %v", l)
				}
			},
		},
		{
			name: "acquire held by another runner is refused naming the holder",
			cmd: func(e *env) *adminv1.Command {
				// The proxy's runner was replaced while the old one's lease lives.
				e.h.must(c(50*time.Second, registerRunner(e.owner, "runner-b")))
				return c(time.Minute, acquire(e.mailbox, "runner-b"))
			},
			check: func(t *testing.T, e *env) {
				res := e.res.(*adminv1.AcquireLeaseResponse)
				if res.GetGranted() || res.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER ||
					res.GetRefusal().GetCurrent().GetRunnerId() != "runner-a" || res.GetRefusal().GetCurrent().GetEpoch() != 4 {
					t.Fatalf("acquire = %v", res)
				}
				if e.lease.GetRunnerId() != "runner-a" || e.lease.GetEpoch() != 4 {
					t.Fatalf("refused acquire changed the lease: %v", e.lease)
				}
			},
		},
		{
			name: "reconnect by the holder gets a new epoch and address",
			cmd: func(e *env) *adminv1.Command {
				a := acquire(e.mailbox, "runner-a")
				a.RunnerAddress = "10.0.0.9:9090"
				a.Ttl = durationpb.New(5 * time.Second)
				return c(time.Minute, a)
			},
			check: func(t *testing.T, e *env) {
				if e.lease.GetEpoch() != e.h.index || e.lease.GetEpoch() <= 4 || e.lease.GetRunnerAddress() != "10.0.0.9:9090" {
					t.Fatalf("lease = %v", e.lease)
				}
				if e.lease.GetTtl().AsDuration() != 5*time.Second || e.lease.GetHeartbeatInterval().AsDuration() >= 5*time.Second {
					t.Fatalf("requested ttl not honoured or heartbeat interval not under it: %v", e.lease)
				}
			},
		},
		{
			name: "release by the holder removes lease and route",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: e.mailbox, RunnerId: "runner-a", Epoch: 4})
			},
			check: func(t *testing.T, e *env) {
				if !e.res.(*adminv1.ReleaseLeaseResponse).GetReleased() || e.lease != nil {
					t.Fatalf("release = %v, lease %v", e.res, e.lease)
				}
				if r, _ := e.h.f.Route(e.mailbox); r != nil {
					t.Fatalf("route survived release: %v", r)
				}
			},
		},
		{
			name: "release by another runner is refused",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: e.mailbox, RunnerId: "runner-b"})
			},
			check: func(t *testing.T, e *env) {
				res := e.res.(*adminv1.ReleaseLeaseResponse)
				if res.GetReleased() || res.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER || e.lease == nil {
					t.Fatalf("release = %v", res)
				}
			},
		},
		{
			name: "release with a stale epoch is refused",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: e.mailbox, RunnerId: "runner-a", Epoch: 3})
			},
			check: func(t *testing.T, e *env) {
				if r := e.res.(*adminv1.ReleaseLeaseResponse).GetRefusal(); r.GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_STALE_EPOCH || e.lease == nil {
					t.Fatalf("release = %v", e.res)
				}
			},
		},
		{
			name: "release of a mailbox without a lease succeeds with released=false",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: "x@proxy-01", RunnerId: "runner-a"})
			},
			check: func(t *testing.T, e *env) {
				if res := e.res.(*adminv1.ReleaseLeaseResponse); res.GetReleased() || res.GetRefusal() != nil {
					t.Fatalf("release = %v", res)
				}
			},
		},
		{
			name: "expire with the current epoch removes the lease",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: e.mailbox, Epoch: 4}, {MailboxId: "x@proxy-01", Epoch: 2}}})
			},
			check: func(t *testing.T, e *env) {
				if got := e.res.(*ExpireResult).Expired; len(got) != 1 || got[0].GetEpoch() != 4 || e.lease != nil {
					t.Fatalf("expired %v, lease %v", got, e.lease)
				}
			},
		},
		{
			name: "expire naming an old epoch never kills a re-granted lease",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: e.mailbox, Epoch: 3}}})
			},
			check: func(t *testing.T, e *env) {
				if len(e.res.(*ExpireResult).Expired) != 0 || e.lease.GetEpoch() != 4 {
					t.Fatalf("stale expire applied: %v", e.lease)
				}
			},
		},
		{
			name: "checkpoint with the current epoch records renewal and stats",
			cmd: func(e *env) *adminv1.Command {
				return c(time.Minute, &adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{
					{MailboxId: e.mailbox, Epoch: 4, ExpiresAt: at(70 * time.Second), LastHeartbeatAt: at(50 * time.Second), Stats: &adminv1.LeaseStats{EventsStored: 42}},
					{MailboxId: e.mailbox, Epoch: 3, ExpiresAt: at(time.Hour), LastHeartbeatAt: at(time.Hour)},
				}})
			},
			check: func(t *testing.T, e *env) {
				if e.res.(*CheckpointResult).Applied != 1 || !proto.Equal(e.lease.GetExpiresAt(), at(70*time.Second)) || e.lease.GetStats().GetEventsStored() != 42 {
					t.Fatalf("lease = %v", e.lease)
				}
				if _, _, v := e.h.f.Routes(); v != 4 {
					t.Fatalf("checkpoint bumped the routes version to %d", v)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, mailbox := base(t)
			e := &env{h: h, owner: owner, other: other, mailbox: mailbox}
			before := tables(t, h.f)
			e.res = h.apply(tc.cmd(e))
			if err, isErr := e.res.(error); isErr || tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("result %v, want error %v", e.res, tc.wantErr)
				}
				if !bytes.Equal(before, tables(t, h.f)) {
					t.Fatal("refused command changed state")
				}
			}
			e.lease, _ = h.f.Lease(mailbox)
			e.namespace, _, _ = h.f.Namespace(ns)
			if tc.check != nil {
				tc.check(t, e)
			}
			roundTrip(t, h.f)
		})
	}
}
