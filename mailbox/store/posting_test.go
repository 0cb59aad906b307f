package store

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randRefs returns n distinct sorted positions with timestamps within spread milliseconds of base and sequences
// near seq, as one batch makes them.
func randRefs(r *rand.Rand, n int, base int64, spread int64, seq uint64) []pos {
	seen := map[pos]bool{}
	var ps []pos
	for len(ps) < n {
		p := makePos(base+r.Int64N(spread+1), seq+uint64(r.IntN(4*n+1)))
		if !seen[p] {
			seen[p] = true
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, comparePos)
	return ps
}

func TestBlockRoundTrip(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name   string
		refs   []pos
		maxLen int // encoded bytes at most
	}{
		{"one position", []pos{makePos(5, 1)}, 1},
		{"a batch in order", randRefs(r, 70, 1_700_000_000_000, 10, 1000), 1 + 69*3},
		{"ties on the timestamp", randRefs(r, 30, 7, 0, 50), 1 + 29*3},
		{"extreme timestamps", []pos{makePos(math.MaxInt64, 3), makePos(math.MaxInt64, 2), makePos(math.MinInt64+maxBlockSpan, 1)}, 40},
		{"sequence zero and the largest", []pos{makePos(0, math.MaxUint64-1), makePos(0, 1), makePos(-1, math.MaxUint64-1)}, 40},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := encodeBlock(tc.refs)
			if len(b) > tc.maxLen {
				t.Errorf("%d positions encoded in %d bytes, want at most %d", len(tc.refs), len(b), tc.maxLen)
			}
			got, err := decodeBlock(nil, tc.refs[0], b, blockSpan(tc.refs))
			if err != nil || !slices.Equal(got, tc.refs) {
				t.Fatalf("decoded %v, %v; want %v", got, err, tc.refs)
			}
			if len(tc.refs) > 1 && blockSpan(tc.refs) > 0 {
				if _, err := decodeBlock(nil, tc.refs[0], b, blockSpan(tc.refs)-1); err == nil {
					t.Error("a block wider than the span decoded")
				}
			}
		})
	}
}

func TestDecodeBlockRejects(t *testing.T) {
	t.Parallel()
	first := makePos(100, 10)
	cases := map[string][]byte{
		"empty":                 nil,
		"count past the bytes":  {3, 1, 1},
		"trailing bytes":        {0, 1},
		"same position again":   {1, 0, 0},
		"sequence wraps":        {1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"timestamp wraps":       {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 2},
		"cut inside a position": {1, 1},
		"wider than the span":   {1, 0x80, 0x01, 2}, // 128 ms, span 100
	}
	for name, b := range cases {
		if got, err := decodeBlock(nil, first, b, 100); err == nil {
			t.Errorf("%s: %x decoded as %v", name, b, got)
		}
	}
}

// TestComparePos: positions order as their bytes do, which keys and page tokens rely on.
func TestComparePos(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	edge := []uint64{0, 1, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64 - 1, math.MaxUint64}
	word := func() uint64 {
		if r.IntN(2) == 0 {
			return edge[r.IntN(len(edge))]
		}
		return r.Uint64()
	}
	for range 10_000 {
		a, b := posOf(word(), word()), posOf(word(), word())
		if r.IntN(4) == 0 {
			b = posOf(a.invTs(), word())
		}
		if got, want := comparePos(a, b), bytes.Compare(a[:], b[:]); got != want {
			t.Fatalf("comparePos(%x, %x) = %d, bytes say %d", a, b, got, want)
		}
	}
}

// TestMergePos: two sorted runs merge into one sorted run holding both.
func TestMergePos(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	for range 200 {
		all := randRefs(r, 1+r.IntN(40), 1_700_000_000_000, 20, 9)
		var a, b []pos
		for _, p := range all {
			if r.IntN(2) == 0 {
				a = append(a, p)
			} else {
				b = append(b, p)
			}
		}
		slices.SortFunc(a, comparePos)
		slices.SortFunc(b, comparePos)
		slices.SortFunc(all, comparePos)
		if got := mergePos(nil, a, b); !slices.Equal(got, all) {
			t.Fatalf("mergePos(%v, %v) = %v, want %v", a, b, got, all)
		}
	}
}

func TestSplitBlocks(t *testing.T) {
	t.Parallel()
	ps := []pos{makePos(3*maxBlockSpan, 9), makePos(2*maxBlockSpan+1, 8), makePos(2*maxBlockSpan, 7), makePos(maxBlockSpan, 6), makePos(0, 5)}
	for _, tc := range []struct {
		limit uint64
		want  [][]pos
	}{
		{maxBlockSpan, [][]pos{ps[:3], ps[3:]}},                       // greedy from the newest: 3W to 2W, then W to 0
		{maxBlockSpan - 1, [][]pos{ps[:2], ps[2:3], ps[3:4], ps[4:]}}, // 3W to 2W+1, then one each: W apart
		{0, [][]pos{ps[:1], ps[1:2], ps[2:3], ps[3:4], ps[4:]}},
	} {
		var runs [][]pos
		must(t, splitBlocks(ps, tc.limit, func(run []pos) error {
			runs = append(runs, run)
			return nil
		}))
		if !slices.EqualFunc(runs, tc.want, slices.Equal) {
			t.Fatalf("limit %d: runs %v, want %v", tc.limit, runs, tc.want)
		}
		for _, run := range runs {
			if blockSpan(run) > tc.limit {
				t.Errorf("limit %d: run %v spans %d ms", tc.limit, run, blockSpan(run))
			}
		}
	}
}

// FuzzDecodeBlock: any bytes either fail to decode or decode to sorted, distinct positions at most the span
// apart, which encode back to a value decoding to the same.
func FuzzDecodeBlock(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 70} {
		refs := randRefs(r, n, 1_700_000_000_000, 50, 77)
		f.Add(refs[0][:], encodeBlock(refs), uint64(50))
	}
	f.Add(make([]byte, posLen), []byte{1, 0, 0}, uint64(0))
	f.Fuzz(func(t *testing.T, key, b []byte, span uint64) {
		var first pos
		copy(first[:], key)
		ps, err := decodeBlock(nil, first, b, span)
		if err != nil {
			return
		}
		if ps[0] != first || blockSpan(ps) > span {
			t.Fatalf("decoded %v from first %v, span %d", ps, first, span)
		}
		for i := 1; i < len(ps); i++ {
			if comparePos(ps[i-1], ps[i]) >= 0 {
				t.Fatalf("positions %d and %d out of order: %v", i-1, i, ps)
			}
		}
		again, err := decodeBlock(nil, first, encodeBlock(ps), span)
		if err != nil || !slices.Equal(again, ps) {
			t.Fatalf("re-encoded: %v, %v; want %v", again, err, ps)
		}
	})
}
