package fsm

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A proxy whose runner cannot open a namespace's mailbox store (damaged,
// out of space) says so in its heartbeat (NamespaceHealth
// open_failed), and placement keeps that namespace off it for the
// exclusion window from the last such report, the rest of its namespaces
// untouched. The window is the proposing leader's --open-failure-exclusion,
// carried in the heartbeat's entry (Command.open_failure_exclusion), never
// a value a replica reads at apply time: replicas, and a log replayed on a
// node started with another flag, all exclude until the same instant. The exclusion is the admin's excluded_until on the
// proxy's own stored NamespaceHealth entry, so it is replicated and
// snapshotted with the proxy; it lasts while the proxy stops reporting the
// namespace (it stops as soon as it no longer hosts it) and is dropped by
// the proxy's first heartbeat past it. Only that rule ends it: a proxy
// that no longer hosts the namespace never tries to open it, so "until it
// can open it again" would never come.
//
// While excluded, the namespace's owner is the next proxy in rendezvous
// order (ownerOf). An excluded assigned proxy serves nothing of the
// namespace, so replace reassigns it at once, like a dead runner's; a move
// toward an excluded proxy is abandoned. Once the exclusion is dropped the
// proxy is the owner again and Rebalance moves the namespace back by
// handoff: the proxy catches up before it serves, so a store that still
// cannot open is reported again and the move abandoned, never a gap.

// DefaultOpenFailureExclusion is how long a namespace stays off a proxy
// after the proxy last reported it could not open its mailbox, unless the
// leader's flag says otherwise, and for every entry written before the
// window was carried in it. Long enough for an operator to rebuild the
// store or free space, short enough that a transient failure does not keep
// a proxy's share elsewhere for good.
const DefaultOpenFailureExclusion = 10 * time.Minute

// MinOpenFailureExclusion and MaxOpenFailureExclusion bound the window an
// entry may carry: under a second a failing store would be retried on
// every heartbeat, past a week a proxy's share stays elsewhere long after
// anyone looked.
const (
	MinOpenFailureExclusion = time.Second
	MaxOpenFailureExclusion = 7 * 24 * time.Hour
)

// ValidOpenFailureExclusion refuses a window outside the bounds, for the
// flag and for an entry.
func ValidOpenFailureExclusion(d time.Duration) error {
	if d < MinOpenFailureExclusion || d > MaxOpenFailureExclusion {
		return fmt.Errorf("open failure exclusion %v: want %v to %v", d, MinOpenFailureExclusion, MaxOpenFailureExclusion)
	}
	return nil
}

// checkOpenFailureExclusion refuses a command carrying a window that is not
// a proxy heartbeat's or is out of bounds.
func checkOpenFailureExclusion(cmd *adminv1.Command) error {
	w := cmd.GetOpenFailureExclusion()
	if w == nil {
		return nil
	}
	if cmd.GetProxyHeartbeat() == nil {
		return invalid("open_failure_exclusion", "only a proxy heartbeat carries it")
	}
	if err := w.CheckValid(); err != nil {
		return invalid("open_failure_exclusion", "%v", err)
	}
	if err := ValidOpenFailureExclusion(w.AsDuration()); err != nil {
		return invalid("open_failure_exclusion", "%v", err)
	}
	return nil
}

// openFailureExclusion is the window cmd excludes for.
func openFailureExclusion(cmd *adminv1.Command) time.Duration {
	if w := cmd.GetOpenFailureExclusion(); w != nil {
		return w.AsDuration()
	}
	return DefaultOpenFailureExclusion
}

// maxOpenFailureLen bounds the runner's error a heartbeat may carry.
const maxOpenFailureLen = 1024

// healthEntry is p's stored health of namespace ns, if any.
func healthEntry(p *adminv1.Proxy, ns string) *adminv1.NamespaceHealth {
	hs := p.GetNamespaceHealth()
	i, ok := slices.BinarySearchFunc(hs, ns, func(h *adminv1.NamespaceHealth, ns string) int {
		return cmp.Compare(h.GetNamespace(), ns)
	})
	if !ok {
		return nil
	}
	return hs[i]
}

// excluded reports whether placement keeps namespace ns off proxy p.
func excluded(p *adminv1.Proxy, ns string) bool {
	return healthEntry(p, ns).GetExcludedUntil() != nil
}

// ownerOf is the proxy placement wants n on: its partition's owner unless
// that proxy is excluded from n, else the owner among the placeable proxies
// not excluded from it, the next in rendezvous order.
func (s *state) ownerOf(n *adminv1.Namespace) string {
	owner := s.table.Owner(n.GetPartition())
	if owner == "" || !excluded(s.proxies[owner], n.GetName()) {
		return owner
	}
	var rest []string
	for _, id := range s.placeableProxyIDs() {
		if !excluded(s.proxies[id], n.GetName()) {
			rest = append(rest, id)
		}
	}
	t := placement.Compute(rest)
	return t.Owner(n.GetPartition())
}

// storedHealth is what a proxy's record keeps of its heartbeat's report at
// now, given the record's previous entries prev: the report, sorted, with
// the admin's excluded_until (a sidecar's own value is ignored) set to
// now + window for an existing namespace reported
// open_failed, kept from prev while it has not passed (an entry holding
// only the exclusion for a namespace no longer reported), and dropped once
// it has. changed says whether the set of excluded namespaces differs from
// prev's, which changes placement.
func (s *state) storedHealth(prev, report []*adminv1.NamespaceHealth, now time.Time, window time.Duration) (out []*adminv1.NamespaceHealth, changed bool) {
	until := timestamppb.New(now.Add(window))
	before := map[string]*timestamppb.Timestamp{}
	for _, h := range prev {
		if h.GetExcludedUntil() != nil {
			before[h.GetNamespace()] = h.GetExcludedUntil()
		}
	}
	lasts := func(t *timestamppb.Timestamp) bool { return t != nil && t.AsTime().After(now) }
	reported := map[string]bool{}
	for _, h := range report {
		h = proto.CloneOf(h)
		h.ExcludedUntil = nil
		_, exists := s.namespaces[h.GetNamespace()]
		switch {
		case h.GetOpenFailed() && exists:
			h.ExcludedUntil = until
		case lasts(before[h.GetNamespace()]):
			h.ExcludedUntil = before[h.GetNamespace()]
		}
		reported[h.GetNamespace()] = true
		out = append(out, h)
	}
	for _, h := range prev {
		if ns := h.GetNamespace(); !reported[ns] && lasts(h.GetExcludedUntil()) {
			out = append(out, &adminv1.NamespaceHealth{Namespace: ns, ExcludedUntil: h.GetExcludedUntil()})
		}
	}
	sortBy(out, (*adminv1.NamespaceHealth).GetNamespace)
	n := 0
	for _, h := range out {
		if h.GetExcludedUntil() == nil {
			continue
		}
		n++
		if before[h.GetNamespace()] == nil {
			changed = true
		}
	}
	return out, changed || n != len(before)
}
