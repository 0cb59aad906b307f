package fsm

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestFirstAfter(t *testing.T) {
	t.Parallel()
	keys := map[string]struct{}{"d": {}, "a": {}, "e": {}, "c": {}, "b": {}, "f": {}}
	vowel := func(k string) bool { return strings.ContainsAny(k, "ae") }
	for _, tc := range []struct {
		name     string
		after    string
		limit    int
		keep     func(string) bool
		want     []string
		wantMore bool
	}{
		{"first page", "", 2, nil, []string{"a", "b"}, true},
		{"middle page", "b", 2, nil, []string{"c", "d"}, true},
		{"last page exactly full", "d", 2, nil, []string{"e", "f"}, false},
		{"last page short", "d", 5, nil, []string{"e", "f"}, false},
		{"after a key that is gone", "bb", 2, nil, []string{"c", "d"}, true},
		{"after every key", "f", 2, nil, nil, false},
		{"everything in one", "", 10, nil, []string{"a", "b", "c", "d", "e", "f"}, false},
		{"kept only", "", 1, vowel, []string{"a"}, true},
		{"kept only, last", "a", 1, vowel, []string{"e"}, false},
		{"limit 0 says whether any remain", "", 0, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, more := firstAfter(maps.Keys(keys), tc.after, tc.limit, tc.keep)
			if !slices.Equal(got, tc.want) || more != tc.wantMore {
				t.Errorf("firstAfter(%q, %d) = %q, more %v; want %q, more %v", tc.after, tc.limit, got, more, tc.want, tc.wantMore)
			}
		})
	}
}
