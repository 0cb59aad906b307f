package server

import (
	"encoding/base64"
	"encoding/json"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Paging of the List calls (admin.proto, above the service; Google's
// AIP-158, etcd's range continuation): a page is the items whose keys sort
// after the previous page's last, in key order, so an item present from the
// first page to the last is listed once however the table changed between.
const (
	// defaultPageSize is a page_size of 0.
	defaultPageSize = 1000
	// maxPageSize caps page_size: a caller asking more gets this many.
	maxPageSize = 10000
	// pageBytes bounds a page's items, encoded, so a page fits gRPC's
	// default 4 MiB receive limit with room for the rest of the answer
	// unless one item alone is larger: 10,000 namespaces of the largest
	// config validation allows would be ~400 MiB.
	pageBytes = 2 << 20
)

// pageToken is what a next_page_token holds, base64 (URL alphabet) of its
// JSON: opaque to callers, who only hand it back.
type pageToken struct {
	// List is the call that issued it.
	List string `json:"l"`
	// Filter is the request's filters, encoded by the call; a token used
	// with other filters would skip or repeat items of the other listing.
	Filter string `json:"f,omitempty"`
	// After is the key of the last item listed.
	After string `json:"a"`
	// Namespaces: ListRoutes' cursor is past the routes, among the
	// namespace routes (After is a namespace).
	Namespaces bool `json:"n,omitempty"`
}

func (t pageToken) encode() string {
	b, err := json.Marshal(t)
	if err != nil {
		// A struct of strings and a bool always marshals.
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// page is a List request's paging, checked: how many items, after where.
type page struct {
	size int
	tok  pageToken
}

// pageOf checks a List request's page_size and page_token against the call
// (list) and its filters: INVALID_ARGUMENT for a negative size, a token that
// does not decode, or one issued by another call or for other filters.
func pageOf(list, filter string, size int32, token string) (page, error) {
	p := page{size: int(size), tok: pageToken{List: list, Filter: filter}}
	switch {
	case size < 0:
		return p, status.Errorf(codes.InvalidArgument, "page_size %d: must not be negative (0: %d)", size, defaultPageSize)
	case size == 0:
		p.size = defaultPageSize
	case size > maxPageSize:
		p.size = maxPageSize
	}
	if token == "" {
		return p, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	var t pageToken
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	switch {
	case err != nil || t.List == "" || t.After == "":
		return p, status.Error(codes.InvalidArgument, "page_token: malformed; pass a next_page_token as it came, or none for the first page")
	case t.List != list:
		return p, status.Errorf(codes.InvalidArgument, "page_token: issued by %s, not %s", t.List, list)
	case t.Filter != filter:
		return p, status.Errorf(codes.InvalidArgument, "page_token: issued for other filters than this %s's; ask again without a token", list)
	}
	p.tok = t
	return p, nil
}

// next is the next_page_token of a page whose last item has key after.
func (p page) next(after string, namespaces bool) string {
	t := p.tok
	t.After, t.Namespaces = after, namespaces
	return t.encode()
}

// fit is how many of items, from the first, a page with used bytes on it
// already holds, and its bytes then: those within pageBytes encoded, but at
// least one on an empty page, so every page moves on.
func fit[T proto.Message](items []T, used int) (int, int) {
	for i, it := range items {
		n := proto.Size(it)
		if used+n > pageBytes && (i > 0 || used > 0) {
			return i, used
		}
		used += n
	}
	return len(items), used
}

// paged cuts items (up to p.size, more telling whether more follow) to what
// a page holds and gives its next_page_token ("" on the last page), key
// naming each item's.
func paged[T proto.Message](p page, items []T, more bool, key func(T) string) ([]T, string) {
	n, _ := fit(items, 0)
	if n == len(items) && !more {
		return items, ""
	}
	return items[:n], p.next(key(items[n-1]), false)
}
