package mesh

import (
	"errors"
	"slices"
	"testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func TestAllPages(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		// pages[token] answers a request with that token.
		pages map[string]*adminv1.ListNamespacesResponse
		// fail is the token whose request fails.
		fail    string
		want    []string
		wantErr bool
	}{
		{"one page", map[string]*adminv1.ListNamespacesResponse{"": page("", "a", "b")}, "never", []string{"a", "b"}, false},
		{"three pages", map[string]*adminv1.ListNamespacesResponse{
			"": page("t1", "a"), "t1": page("t2", "b", "c"), "t2": page("", "d"),
		}, "never", []string{"a", "b", "c", "d"}, false},
		{"a page fails", map[string]*adminv1.ListNamespacesResponse{"": page("t1", "a")}, "t1", []string{"a"}, true},
		{"the token does not move", map[string]*adminv1.ListNamespacesResponse{"": page("t1", "a"), "t1": page("t1", "b")}, "never", []string{"a", "b"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			asked := 0
			err := AllPages(func(tok string) (*adminv1.ListNamespacesResponse, error) {
				if asked++; asked > 10 {
					t.Fatal("asked more than 10 pages")
				}
				if tok == tc.fail {
					return nil, boom
				}
				return tc.pages[tok], nil
			}, func(p *adminv1.ListNamespacesResponse) {
				for _, n := range p.GetNamespaces() {
					got = append(got, n.GetName())
				}
			})
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Errorf("got %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func page(next string, names ...string) *adminv1.ListNamespacesResponse {
	p := &adminv1.ListNamespacesResponse{NextPageToken: next, Index: uint64(len(names))}
	for _, n := range names {
		p.Namespaces = append(p.Namespaces, &adminv1.Namespace{Name: n})
	}
	return p
}
