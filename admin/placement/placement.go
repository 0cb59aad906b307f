// Package placement decides which proxy hosts a namespace
// (docs/architecture.md#placement).
//
// A namespace hashes to one of 256 partitions, and each partition belongs to
// one live proxy (live to the FSM: heartbeating, and its sidecar not reporting
// its runner dead). Ownership is computed from the live proxy set every time,
// never stored, so every admin node that applied the same log derives the same
// table and nothing can drift out of sync.
//
// Partitions are assigned by rendezvous (highest-random-weight) hashing: each
// (proxy, partition) pair gets a pseudo-random score and the highest score
// owns the partition. When a proxy joins it takes exactly the partitions where
// it now scores highest (about 1/n of them) and nothing else moves; when a
// proxy leaves only its own partitions move, each to its runner-up. A ring
// with virtual nodes gives the same property only approximately and needs
// tuning of the node count; with 256 partitions and tens of proxies the
// O(partitions × proxies) cost of rendezvous hashing is a few microseconds.
package placement

import (
	"hash/crc32"
	"hash/fnv"
	"slices"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Partitions is the fixed partition count. It is part of every node's
// contract (docs/architecture.md#identities): changing it re-places every
// namespace.
const Partitions = 256

// Partition returns the partition of a namespace.
func Partition(namespace string) uint32 {
	return crc32.ChecksumIEEE([]byte(namespace)) % Partitions
}

// Table is the owner of every partition; "" where no proxy is live.
type Table [Partitions]string

// Compute assigns every partition to one of the given live proxies. The order
// of proxies and duplicates do not matter.
func Compute(proxies []string) Table {
	ids := slices.Clone(proxies)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	seeds := make([]uint64, len(ids))
	for i, id := range ids {
		seeds[i] = idHash(id)
	}
	var t Table
	for p := range Partitions {
		best, bestScore := -1, uint64(0)
		for i := range ids {
			s := score(seeds[i], uint32(p))
			// ids are sorted, so on an exact tie the smaller id wins.
			if best < 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		if best >= 0 {
			t[p] = ids[best]
		}
	}
	return t
}

// Owner returns the proxy that owns partition p, or "" if none is live or p
// is out of range.
func (t *Table) Owner(p uint32) string {
	if p >= Partitions {
		return ""
	}
	return t[p]
}

// Ranges returns the partitions owned by proxyID as sorted, maximal inclusive
// ranges.
func (t *Table) Ranges(proxyID string) []*adminv1.PartitionRange {
	var out []*adminv1.PartitionRange
	for p := 0; p < Partitions; p++ {
		if t[p] != proxyID || proxyID == "" {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End == uint32(p-1) {
			out[n-1].End = uint32(p)
			continue
		}
		out = append(out, &adminv1.PartitionRange{Start: uint32(p), End: uint32(p)})
	}
	return out
}

// Counts returns how many partitions each proxy owns.
func (t *Table) Counts() map[string]int {
	out := make(map[string]int)
	for _, id := range t {
		if id != "" {
			out[id]++
		}
	}
	return out
}

func idHash(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// score mixes a proxy's hash with a partition through the splitmix64
// finalizer: FNV alone has weak avalanche on short inputs, which would give
// lopsided tables for ids like "proxy-01".."proxy-09".
func score(seed uint64, p uint32) uint64 {
	x := seed ^ ((uint64(p) + 1) * 0x9e3779b97f4a7c15)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
