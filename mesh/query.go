package mesh

import (
	"encoding/base64"
	"strings"
)

// Bounds of one mailbox query. The store enforces them; the front ends (a
// runner's HTTP API, the gateway) check a request against them before it
// travels, so both name the same numbers in their errors.
const (
	// DefaultQueryLimit is the page size of a query that sets no limit.
	DefaultQueryLimit = 100
	// MaxQueryLimit caps a query's limit; a larger one is clamped.
	MaxQueryLimit = 1000
	// MaxFilterValues bounds the values of one repeated filter field
	// (topics, principals): each value is one index range merged into the
	// result, so the bound keeps one query from opening thousands of
	// iterators.
	MaxFilterValues = 100
)

// MaxPageTokenLen bounds a page token: the store's tokens are 23 characters
// (docs/query-api.md#pagination); the bound leaves room for a later format
// and still keeps a garbage token short.
const MaxPageTokenLen = 64

// CheckPageToken checks that s has the form of a page token, the
// next_page_token of an earlier answer: 1 to MaxPageTokenLen characters of
// base64url without padding (RFC 4648 section 5) that decode as such. What
// a token holds is the store's to read; a front end that cannot read it
// still refuses anything that is no token at all, so garbage (a NUL, bytes
// that are not UTF-8 and cannot travel in a protobuf string) never goes
// further. The error names the parameter and says what a token is.
func CheckPageToken(s string) error {
	switch {
	case s == "":
		return invalid("page_token", "empty")
	case len(s) > MaxPageTokenLen:
		return invalid("page_token", "%d characters, at most %d: send the next_page_token of an earlier answer as it came", len(s), MaxPageTokenLen)
	}
	// The decoder skips '\r' and '\n' wherever they are; a token has neither.
	_, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || strings.ContainsAny(s, "\r\n") {
		return invalid("page_token", "%q is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came", s)
	}
	return nil
}
