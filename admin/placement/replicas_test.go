package placement

import (
	"slices"
	"testing"
)

func TestRankStartsWithComputeOwner(t *testing.T) {
	t.Parallel()
	ids := proxies(7)
	tab := Compute(ids)
	for p := range uint32(Partitions) {
		r := Rank(p, ids)
		if len(r) != len(ids) || r[0] != tab.Owner(p) {
			t.Fatalf("partition %d: rank %v, owner %s", p, r, tab.Owner(p))
		}
		// The runner-up is the owner once the first is gone.
		rest := Compute(slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == r[0] }))
		if rest.Owner(p) != r[1] {
			t.Fatalf("partition %d: runner-up %s, owner without %s is %s", p, r[1], r[0], rest.Owner(p))
		}
	}
}

func TestReplicasDistinctAndSpreadAcrossZones(t *testing.T) {
	t.Parallel()
	zoneOf := map[string]string{
		"a1": "a", "a2": "a", "a3": "a",
		"b1": "b", "b2": "b",
		"c1": "c",
	}
	zone := func(id string) string { return zoneOf[id] }
	all := []string{"a1", "a2", "a3", "b1", "b2", "c1"}
	noZone := func(string) string { return "" }
	tests := []struct {
		name       string
		primary    string
		n          int
		keep       []string
		candidates []string
		zone       func(string) string
		check      func(t *testing.T, p uint32, got []string)
	}{
		{
			name: "one per other zone first", primary: "a1", n: 2, candidates: all, zone: zone,
			check: func(t *testing.T, _ uint32, got []string) {
				zs := []string{zone(got[0]), zone(got[1])}
				slices.Sort(zs)
				if !slices.Equal(zs, []string{"b", "c"}) {
					t.Errorf("replicas %v in zones %v, want b and c", got, zs)
				}
			},
		},
		{
			name: "zones exhausted fills in rank order", primary: "a1", n: 4, candidates: all, zone: zone,
			check: func(t *testing.T, p uint32, got []string) {
				if len(got) != 4 {
					t.Fatalf("got %v, want 4", got)
				}
				var rest []string
				for _, id := range Rank(p, all) {
					if id != "a1" && !slices.Contains(got[:2], id) {
						rest = append(rest, id)
					}
				}
				if !slices.Equal(got[2:], rest[:2]) {
					t.Errorf("after one per zone got %v, want %v in rank order", got[2:], rest[:2])
				}
			},
		},
		{
			name: "no zones is rank order", primary: "a1", n: 3, candidates: all, zone: noZone,
			check: func(t *testing.T, p uint32, got []string) {
				want := slices.DeleteFunc(Rank(p, all), func(id string) bool { return id == "a1" })[:3]
				if !slices.Equal(got, want) {
					t.Errorf("got %v, want %v", got, want)
				}
			},
		},
		{
			name: "kept replicas stay first", primary: "a1", n: 2, keep: []string{"a2"}, candidates: all, zone: zone,
			check: func(t *testing.T, _ uint32, got []string) {
				if got[0] != "a2" || zone(got[1]) == "a" {
					t.Errorf("got %v, want a2 then another zone", got)
				}
			},
		},
		{
			name: "fewer proxies than asked", primary: "a1", n: 4, candidates: []string{"a1", "b1"}, zone: zone,
			check: func(t *testing.T, _ uint32, got []string) {
				if !slices.Equal(got, []string{"b1"}) {
					t.Errorf("got %v, want [b1]", got)
				}
			},
		},
		{
			name: "none asked", primary: "a1", n: 0, candidates: all, zone: zone,
			check: func(t *testing.T, _ uint32, got []string) {
				if len(got) != 0 {
					t.Errorf("got %v, want none", got)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for p := range uint32(Partitions) {
				got := Replicas(p, tc.primary, tc.n, tc.keep, tc.candidates, tc.zone)
				seen := map[string]bool{tc.primary: true}
				for _, id := range got {
					if seen[id] {
						t.Fatalf("partition %d: %v repeats %s or the primary", p, got, id)
					}
					seen[id] = true
				}
				tc.check(t, p, got)
				if t.Failed() {
					t.Fatalf("partition %d", p)
				}
			}
		})
	}
}

func TestReplicasMoveLittleWhenAProxyJoins(t *testing.T) {
	t.Parallel()
	ids := proxies(6)
	changed := 0
	for p := range uint32(Partitions) {
		owner := Rank(p, ids)[0]
		before := Replicas(p, owner, 2, nil, ids, func(string) string { return "" })
		after := Replicas(p, owner, 2, before, append(slices.Clone(ids), "proxy-new"), func(string) string { return "" })
		if !slices.Equal(before, after) {
			changed++
		}
	}
	if changed != 0 {
		t.Errorf("%d partitions changed replicas when a proxy joined, want none (kept replicas stay)", changed)
	}
}
