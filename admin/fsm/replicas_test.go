package fsm

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

const replicaRole = adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA

// zoned registers proxy id in zone.
func zoned(id, zone string) *adminv1.RegisterProxyRequest {
	r := register(id)
	r.Registration.Zone = zone
	return r
}

func createReplicated(name string, replicas uint32) *adminv1.CreateNamespaceRequest {
	r := createNS(name, "events")
	r.Config.Replicas = replicas
	return r
}

// positions is a heartbeat of proxy reporting ns stored up to next on
// partition 0 of "events", with lag.
func positions(proxy string, next, lag int64) *adminv1.ProxyHeartbeatRequest {
	return &adminv1.ProxyHeartbeatRequest{ProxyId: proxy, NamespaceHealth: []*adminv1.NamespaceHealth{{
		Namespace: ns, LagKnown: true, Lag: lag,
		StoredPositions: []*adminv1.StoredPosition{{Topic: "events", Partition: 0, NextOffset: next}},
	}}}
}

// replicaBase is four proxies in two zones and namespace ns with three
// copies: its assigned proxy and two replicas, every copy holding its lease.
func replicaBase(t *testing.T) (h *harness, n *adminv1.Namespace) {
	t.Helper()
	h = newHarness(t)
	for _, r := range []*adminv1.RegisterProxyRequest{zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("b2", "b")} {
		h.must(c(0, r))
	}
	h.must(c(time.Second, createReplicated(ns, 3)))
	n, _, _ = h.f.Namespace(ns)
	for _, id := range append([]string{n.GetAssignedProxyId()}, n.GetReplicaProxyIds()...) {
		h.must(c(2*time.Second, acquire(mailboxID(ns, id), id)))
	}
	return h, n
}

func zoneOf(id string) string { return id[:1] }

// Replicas land on distinct proxies other than the serving one, spread
// across zones, each told to hold its own mailbox seeded from the serving
// one, which lets them copy it; their proxies may acquire their mailboxes
// and no other proxy may.
func TestReplicasPlacedOnDistinctProxiesAcrossZones(t *testing.T) {
	t.Parallel()
	h, n := replicaBase(t)
	a, reps := n.GetAssignedProxyId(), n.GetReplicaProxyIds()
	if len(reps) != 2 || slices.Contains(reps, a) || reps[0] == reps[1] {
		t.Fatalf("assigned %s, replicas %v: want two distinct others", a, reps)
	}
	if zoneOf(reps[0]) == zoneOf(a) && zoneOf(reps[1]) == zoneOf(a) {
		t.Fatalf("assigned %s, replicas %v: all in one zone", a, reps)
	}
	if want := placement.Rank(n.GetPartition(), []string{"a1", "a2", "b1", "b2"})[0]; a != want {
		t.Fatalf("assigned %s, want the hash owner %s", a, want)
	}
	serving := assignmentOf(h.f, a)
	if want := slices.Sorted(slices.Values(reps)); serving.GetRole() != roleServing || !slices.Equal(serving.GetRecoveryPeers(), want) {
		t.Fatalf("serving assignment %v, want SERVING letting %v copy", serving, want)
	}
	for _, r := range reps {
		as := assignmentOf(h.f, r)
		if as.GetRole() != replicaRole || as.GetVersion() != n.GetReplicaIndex() || as.GetMailboxId() != mailboxID(ns, r) ||
			as.GetRecoverySource().GetMailboxId() != mailboxID(ns, a) {
			t.Fatalf("replica %s's assignment %v, want REPLICA of %s seeded from %s", r, as, mailboxID(ns, r), mailboxID(ns, a))
		}
	}
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		if id == a || slices.Contains(reps, id) {
			continue
		}
		if assignmentOf(h.f, id) != nil {
			t.Fatalf("%s, with no copy, is assigned %v", id, assignmentOf(h.f, id))
		}
		res, ok := h.apply(c(3*time.Second, acquire(mailboxID(ns, id), id))).(*adminv1.AcquireLeaseResponse)
		if !ok || res.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE {
			t.Fatalf("acquire on %s, which holds no copy: %v, want NOT_PLACED_HERE", id, res)
		}
	}
	if r := roundTrip(t, h.f); !proto.Equal(assignmentOf(r, reps[0]), assignmentOf(h.f, reps[0])) {
		t.Fatalf("a replica's assignment differs after a restore")
	}
}

func TestReplicasRefusedPastTheCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.must(c(0, register("p1")))
	for _, r := range []uint32{0, 1, placement.MaxReplicas} {
		if res := h.apply(c(time.Second, createReplicated(ns+"-"+string(rune('a'+r)), r))); res == nil || isErr(res) {
			t.Fatalf("replicas %d refused: %v", r, res)
		}
	}
	res := h.apply(c(time.Second, createReplicated(ns, placement.MaxReplicas+1)))
	err, _ := res.(error)
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "config.replicas") || !strings.Contains(err.Error(), "at most 5") {
		t.Fatalf("replicas %d: %v, want an invalid config.replicas naming the cap", placement.MaxReplicas+1, res)
	}
	// One proxy: no replica can be placed, and the namespace still serves.
	n, _, _ := h.f.Namespace(ns + "-f")
	if n.GetAssignedProxyId() != "p1" || len(n.GetReplicaProxyIds()) != 0 {
		t.Fatalf("namespace on one proxy: %v", n)
	}
}

func isErr(v any) bool { _, ok := v.(error); return ok }

// A replica is in sync when its positions reach the serving mailbox's
// within the bound and its lag is known and small; the lookup then lists
// it after the serving mailbox, and prismctl's view says so.
func TestInSyncReplicasInTheRoute(t *testing.T) {
	t.Parallel()
	h, n := replicaBase(t)
	a, reps := n.GetAssignedProxyId(), n.GetReplicaProxyIds()
	route := func() []string {
		_, r, _ := h.f.Namespace(ns)
		if r.GetMailboxId() != mailboxID(ns, a) {
			t.Fatalf("route %v, want the serving mailbox %s", r, mailboxID(ns, a))
		}
		var out []string
		for _, x := range r.GetInSyncReplicas() {
			out = append(out, x.GetMailboxId())
		}
		return out
	}
	if got := route(); len(got) != 0 {
		t.Fatalf("replicas %v in sync before any report", got)
	}
	h.must(c(3*time.Second, positions(a, 5000, 0)))
	h.must(c(3*time.Second, positions(reps[0], 5000-ReplicaMaxLag-1, 0))) // a position too far behind
	h.must(c(3*time.Second, positions(reps[1], 5000, ReplicaMaxLag+1)))   // the topics too far ahead
	if got := route(); len(got) != 0 {
		t.Fatalf("replicas %v in sync while behind", got)
	}
	h.must(c(4*time.Second, positions(reps[1], 4990, 10)))
	if got := route(); !slices.Equal(got, []string{mailboxID(ns, reps[1])}) {
		t.Fatalf("in-sync replicas %v, want only %s", got, reps[1])
	}
	h.must(c(4*time.Second, positions(reps[0], 5000-ReplicaMaxLag, 0)))
	if got := route(); !slices.Equal(got, []string{mailboxID(ns, reps[0]), mailboxID(ns, reps[1])}) {
		t.Fatalf("in-sync replicas %v, want both in placement's order", got)
	}
	for _, r := range h.f.NamespaceReplicas(ns) {
		if r.GetProxyId() != a && (r.GetRole() != replicaRole || !r.GetInSync()) {
			t.Fatalf("replica view %v, want REPLICA in sync", r)
		}
	}
	// A copying replica is never in sync, whatever it reports.
	hb := positions(reps[0], 5000, 0)
	hb.NamespaceHealth[0].Recovery = &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPYING}
	h.must(c(5*time.Second, hb))
	if got := route(); !slices.Equal(got, []string{mailboxID(ns, reps[1])}) {
		t.Fatalf("in-sync replicas %v with %s copying", got, reps[0])
	}
}

// When the serving proxy is lost, an in-sync replica is promoted in the
// same command (not an empty mailbox on the hash owner), and a replacement
// replica is placed, seeded from the promoted mailbox; with no replica in
// sync the namespace goes to the hash owner as without replicas.
func TestLostServingProxyPromotesAnInSyncReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		inSync  func(reps []string) []string // which replicas report caught up
		promote func(owner string, reps []string) string
	}{
		{"the second replica in sync", func(reps []string) []string { return reps[1:] }, func(_ string, reps []string) string { return reps[1] }},
		{"none in sync", func([]string) []string { return nil }, func(owner string, _ []string) string { return owner }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, n := replicaBase(t)
			a, reps := n.GetAssignedProxyId(), n.GetReplicaProxyIds()
			h.must(c(3*time.Second, positions(a, 100, 0)))
			for _, r := range reps {
				lag := int64(ReplicaMaxLag + 1)
				if slices.Contains(tc.inSync(reps), r) {
					lag = 0
				}
				h.must(c(3*time.Second, positions(r, 100, lag)))
			}
			p, _ := h.f.Proxy(a)
			h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: a, LastSeen: p.GetProxy().GetLastSeen()}}}))
			var live []string
			for _, id := range []string{"a1", "a2", "b1", "b2"} {
				if id != a {
					live = append(live, id)
				}
			}
			owner := placement.Rank(n.GetPartition(), live)[0]
			want := tc.promote(owner, reps)
			got, route, _ := h.f.Namespace(ns)
			if got.GetAssignedProxyId() != want || got.GetPriorProxyId() != a {
				t.Fatalf("after losing %s: assigned %s (prior %s), want %s (owner %s, replicas %v)", a, got.GetAssignedProxyId(), got.GetPriorProxyId(), want, owner, reps)
			}
			if want != owner && route.GetMailboxId() != mailboxID(ns, want) {
				t.Fatalf("route %v, want the promoted %s", route, mailboxID(ns, want))
			}
			if as := assignmentOf(h.f, want); as.GetRole() != roleServing || as.GetVersion() != h.index {
				t.Fatalf("promoted assignment %v, want SERVING at %d", as, h.index)
			}
			nr := got.GetReplicaProxyIds()
			if len(nr) != 2 || slices.Contains(nr, a) || slices.Contains(nr, want) || nr[0] == nr[1] {
				t.Fatalf("replicas after the promotion %v: want two, not %s nor %s", nr, a, want)
			}
			for _, r := range nr {
				if !slices.Contains(reps, r) {
					if as := assignmentOf(h.f, r); as.GetRole() != replicaRole || as.GetRecoverySource().GetMailboxId() != mailboxID(ns, want) {
						t.Fatalf("replacement replica %s: %v, want REPLICA seeded from %s", r, as, mailboxID(ns, want))
					}
				}
			}
			if assignmentOf(h.f, a) != nil {
				t.Fatalf("the lost proxy %s keeps %v", a, assignmentOf(h.f, a))
			}
			r := roundTrip(t, h.f)
			if x, _, _ := r.Namespace(ns); !proto.Equal(x, got) {
				t.Fatalf("after a restore %v, want %v", x, got)
			}
		})
	}
}

// A proxy joining does not take a placed replica's place (its copy would be
// wasted), but a replica on a proxy that stops serving is replaced.
func TestReplicasStayUntilTheirProxyStopsServing(t *testing.T) {
	t.Parallel()
	h, n := replicaBase(t)
	reps := n.GetReplicaProxyIds()
	for i := range 8 {
		h.must(c(3*time.Second, zoned("c"+string(rune('0'+i)), "c")))
	}
	got, _, _ := h.f.Namespace(ns)
	owner := placement.Rank(n.GetPartition(), []string{"a1", "a2", "b1", "b2", "c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"})[0]
	for _, r := range reps {
		if !slices.Contains(got.GetReplicaProxyIds(), r) && r != owner {
			t.Fatalf("replicas %v after joins, was %v: %s dropped", got.GetReplicaProxyIds(), reps, r)
		}
	}
	h.must(c(4*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: reps[0], RunnerNotReady: true}))
	got, _, _ = h.f.Namespace(ns)
	if slices.Contains(got.GetReplicaProxyIds(), reps[0]) || len(got.GetReplicaProxyIds()) != 2 {
		t.Fatalf("replicas %v after %s's runner died, want it replaced", got.GetReplicaProxyIds(), reps[0])
	}
}
