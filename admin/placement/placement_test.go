package placement

import (
	"fmt"
	"testing"
)

func proxies(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("proxy-%02d", i+1)
	}
	return out
}

func moved(a, b Table) int {
	n := 0
	for p := range a {
		if a[p] != b[p] {
			n++
		}
	}
	return n
}

func TestComputeCoversEveryPartitionOnce(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 4, 5, 8, 17} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			ids := proxies(n)
			tab := Compute(ids)
			seen := make([]int, Partitions)
			for _, id := range ids {
				for _, r := range tab.Ranges(id) {
					if r.Start > r.End || r.End >= Partitions {
						t.Fatalf("bad range %v for %s", r, id)
					}
					for p := r.Start; p <= r.End; p++ {
						seen[p]++
					}
				}
			}
			for p, c := range seen {
				if c != 1 {
					t.Fatalf("partition %d covered %d times", p, c)
				}
			}
			for id, c := range tab.Counts() {
				// Each partition lands on a uniformly random proxy, so counts
				// are binomial around Partitions/n (sd ~4 at n=17); the ids
				// are fixed, so these loose bounds only catch a broken hash.
				if fair := Partitions / n; c < fair/3 || c > fair*2 {
					t.Errorf("%s owns %d partitions, fair share %d", id, c, fair)
				}
			}
		})
	}
}

func TestComputeEmptyAndDeterministic(t *testing.T) {
	t.Parallel()
	empty := Compute(nil)
	for p := range Partitions {
		if empty.Owner(uint32(p)) != "" {
			t.Fatalf("partition %d owned with no proxies", p)
		}
	}
	a := Compute([]string{"c", "a", "b", "a"})
	b := Compute([]string{"b", "c", "a"})
	if a != b {
		t.Fatal("table depends on input order or duplicates")
	}
	if a.Owner(Partitions) != "" {
		t.Fatal("out-of-range partition has an owner")
	}
}

func TestJoinMovesOnlyTheNewcomersShare(t *testing.T) {
	t.Parallel()
	before := Compute(proxies(4))
	after := Compute(proxies(5))
	n := moved(before, after)
	// About 1/5 of 256 (51) should move; allow 10-30%.
	if n < Partitions*10/100 || n > Partitions*30/100 {
		t.Fatalf("adding a 5th proxy moved %d of %d partitions", n, Partitions)
	}
	for p := range before {
		if before[p] != after[p] && after[p] != "proxy-05" {
			t.Fatalf("partition %d moved from %s to %s, not to the newcomer", p, before[p], after[p])
		}
	}
}

func TestLeaveMovesOnlyTheLeaversPartitions(t *testing.T) {
	t.Parallel()
	ids := proxies(5)
	before := Compute(ids)
	after := Compute(append(ids[:2:2], ids[3:]...)) // drop proxy-03
	for p := range before {
		if before[p] != "proxy-03" && before[p] != after[p] {
			t.Fatalf("partition %d moved from surviving %s to %s", p, before[p], after[p])
		}
		if after[p] == "proxy-03" {
			t.Fatalf("partition %d still owned by the removed proxy", p)
		}
	}
}

func TestPartitionMatchesCRC32(t *testing.T) {
	t.Parallel()
	// Values from an independent crc32 (Python's zlib.crc32), pinned so a
	// change of hash function, which would move every namespace, fails.
	for _, tc := range []struct {
		ns   string
		want uint32
	}{
		{"", 0},
		{"audit-logs", 0x553d9bf7 % 256},
		{"$admin", 232},
	} {
		if got := Partition(tc.ns); got != tc.want || got >= Partitions {
			t.Errorf("Partition(%q) = %d, want %d", tc.ns, got, tc.want)
		}
	}
}

func BenchmarkCompute(b *testing.B) {
	ids := proxies(20)
	for b.Loop() {
		Compute(ids)
	}
}
