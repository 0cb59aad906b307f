package fsm

import (
	"slices"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// Replicas (docs/architecture.md#replicas). A namespace whose config asks
// for replicas = k > 1 keeps k-1 replicas besides its serving mailbox: each
// is the mailbox "{ns}@{R}" on its own proxy R, under its own lease and
// epoch (the same AcquireLease path as any mailbox: placementRefusal lets a
// replica's proxy hold it), seeded by peer recovery from the serving
// mailbox and then consuming the topics itself.
//
// Which proxies is placement, recomputed on every change to the namespace
// and on every change of the placeable set (replace), so every admin node
// that applied the same log agrees (chooseReplicas). When the serving proxy
// stops serving, replace promotes the first in-sync replica instead of
// starting an empty mailbox (promotion), and the next call places a
// replacement, which copies the new serving mailbox.

// ReplicaMaxLag bounds how far a replica may trail and still be in sync: on
// every partition the serving mailbox reported, its stored position at most
// this many records behind the serving one's, and its lag behind the topics'
// high watermarks (summed) at most this. It is one batch of a busy
// partition: two live consumers of the same partitions are up to a batch
// apart at any moment, so a tighter bound would flap.
const ReplicaMaxLag = 1000

// wantedReplicas is how many replicas n asks for besides its serving
// mailbox.
func wantedReplicas(n *adminv1.Namespace) int {
	if r := int(n.GetConfig().GetReplicas()); r > 1 {
		return r - 1
	}
	return 0
}

// chooseReplicas is the replica set n should have now: none while it is on
// no proxy; otherwise placement.Replicas over the proxies that may hold one
// (not the assigned proxy, a move's destination or a handoff tail's source,
// and not excluded from n), keeping, in order, the replicas already placed
// whose proxy still serves, with the hash owner first when it is not the
// assigned proxy: a namespace placement wants elsewhere then moves to a
// mailbox that already holds its history, and a lost serving proxy's
// successor is one.
func (s *state) chooseReplicas(n *adminv1.Namespace) []string {
	k := wantedReplicas(n)
	a := n.GetAssignedProxyId()
	if k == 0 || a == "" {
		return nil
	}
	name := n.GetName()
	may := func(id string) bool {
		return id != a && id != n.GetIncomingProxyId() && id != n.GetHandoffProxyId() && !excluded(s.proxies[id], name)
	}
	var keep []string
	if owner := s.ownerOf(n); owner != "" && may(owner) {
		keep = append(keep, owner)
	}
	for _, id := range n.GetReplicaProxyIds() {
		if serving(s.proxies[id]) && may(id) {
			keep = append(keep, id)
		}
	}
	var candidates []string
	for _, id := range s.placeableProxyIDs() {
		if may(id) {
			candidates = append(candidates, id)
		}
	}
	return placement.Replicas(n.GetPartition(), a, k, keep, candidates, func(id string) string {
		return s.proxies[id].GetRegistration().GetZone()
	})
}

// withReplicas is n with its replica set as chooseReplicas says: n itself
// when that is unchanged, else a clone with replica_index = index.
func (s *state) withReplicas(n *adminv1.Namespace, index uint64) *adminv1.Namespace {
	want := s.chooseReplicas(n)
	if slices.Equal(want, n.GetReplicaProxyIds()) {
		return n
	}
	n = proto.CloneOf(n)
	n.ReplicaProxyIds = want
	n.ReplicaIndex = index
	return n
}

// isReplica reports whether proxy holds one of n's replicas.
func isReplica(n *adminv1.Namespace, proxy string) bool {
	return proxy != "" && slices.Contains(n.GetReplicaProxyIds(), proxy)
}

// inSync reports whether n's replica on proxy r is in sync with its serving
// mailbox on proxy a, judged as the handoff's switch judges a destination
// (docs/architecture.md#moves) from the two proxies' last reports: r serves
// (live, its runner ready), holds a live lease on its mailbox, is not
// copying, reports a known lag of at most ReplicaMaxLag, and on every
// partition a's last report names, its stored position is at most
// ReplicaMaxLag behind a's. A serving proxy that reported no positions (a
// sidecar or runner older than them, or none yet) leaves the lag alone to
// judge. A lost serving proxy's last report stands: a replica that had
// reached it then holds what the lost mailbox had stored at that report.
func (s *state) inSync(n *adminv1.Namespace, a, r string) bool {
	name := n.GetName()
	p := s.proxies[r]
	if !serving(p) {
		return false
	}
	if _, ok := s.leases[mesh.MailboxID{Namespace: name, Proxy: r}.String()]; !ok {
		return false
	}
	h := healthEntry(p, name)
	if h == nil || h.GetRecovery().GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPYING || !h.GetLagKnown() || h.GetLag() > ReplicaMaxLag {
		return false
	}
	type tp struct {
		topic     string
		partition int32
	}
	mine := map[tp]int64{}
	for _, sp := range h.GetStoredPositions() {
		mine[tp{sp.GetTopic(), sp.GetPartition()}] = sp.GetNextOffset()
	}
	for _, sp := range healthEntry(s.proxies[a], name).GetStoredPositions() {
		got, ok := mine[tp{sp.GetTopic(), sp.GetPartition()}]
		if !ok || got+ReplicaMaxLag < sp.GetNextOffset() {
			return false
		}
	}
	return true
}

// inSyncReplicas lists n's replicas in sync with its assigned proxy's
// mailbox, in order.
func (s *state) inSyncReplicas(n *adminv1.Namespace) []string {
	var out []string
	for _, r := range n.GetReplicaProxyIds() {
		if s.inSync(n, n.GetAssignedProxyId(), r) {
			out = append(out, r)
		}
	}
	return out
}

// promotion is the replica replace promotes when n's assigned proxy stops
// serving: the hash owner if it is an in-sync replica (it is where
// placement wants the namespace, so no move follows), else the first
// in-sync replica; "" when none is in sync, and the namespace then goes to
// the owner as it would without replicas.
func (s *state) promotion(n *adminv1.Namespace, owner string) string {
	in := s.inSyncReplicas(n)
	if slices.Contains(in, owner) {
		return owner
	}
	for _, r := range in {
		if !excluded(s.proxies[r], n.GetName()) {
			return r
		}
	}
	return ""
}

// recoveryPeers is who may copy n's serving mailbox: a move's destination
// and n's replicas, sorted.
func recoveryPeers(n *adminv1.Namespace) []string {
	var out []string
	if in := n.GetIncomingProxyId(); in != "" {
		out = append(out, in)
	}
	out = append(out, n.GetReplicaProxyIds()...)
	slices.Sort(out)
	return slices.Compact(out)
}
