package placement

import (
	"cmp"
	"slices"
)

// MaxReplicas bounds NamespaceConfig.replicas: every copy consumes the
// namespace's topics and stores its whole history, so a copy costs as much as
// the first one, and past a handful the next zone is worth less than the disk.
const MaxReplicas = 5

// Rank lists the given proxies in rendezvous order for partition p: the
// first is the partition's owner in Compute over the same set, the second its
// owner once the first is gone, and so on. Duplicates are dropped; on an exact
// tie the smaller id comes first, as in Compute.
func Rank(p uint32, proxies []string) []string {
	ids := slices.Clone(proxies)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	scores := make(map[string]uint64, len(ids))
	for _, id := range ids {
		scores[id] = score(idHash(id), p)
	}
	slices.SortStableFunc(ids, func(a, b string) int { return cmp.Compare(scores[b], scores[a]) })
	return ids
}

// Replicas chooses up to n proxies to hold replicas of a namespace of
// partition p whose mailbox is served by primary (docs/architecture.md#replicas),
// distinct from primary and from each other:
//
//   - keep, in their order, comes first: replicas already placed that may
//     stay (the caller keeps only those whose proxy still serves), so a
//     replica is not dropped, and its copy wasted, because a proxy joined;
//   - then candidates (the placeable proxies) in rendezvous order for p,
//     each in a zone no chosen copy (primary included) is in yet while there
//     is one, then the rest in the same order. zone gives a proxy's zone
//     label; "" counts as a zone of its own per proxy, so proxies without
//     labels are spread by rendezvous order alone.
func Replicas(p uint32, primary string, n int, keep, candidates []string, zone func(string) string) []string {
	if n <= 0 {
		return nil
	}
	chosen := map[string]bool{primary: true}
	zones := map[string]bool{}
	use := func(id string) {
		chosen[id] = true
		if z := zone(id); z != "" {
			zones[z] = true
		}
	}
	if primary != "" {
		use(primary)
	}
	var out []string
	for _, id := range keep {
		if len(out) == n {
			return out
		}
		if id != "" && !chosen[id] {
			use(id)
			out = append(out, id)
		}
	}
	ranked := Rank(p, candidates)
	for _, spread := range []bool{true, false} {
		for _, id := range ranked {
			if len(out) == n {
				return out
			}
			if chosen[id] || spread && zone(id) != "" && zones[zone(id)] {
				continue
			}
			use(id)
			out = append(out, id)
		}
	}
	return out
}
