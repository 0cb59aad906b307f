package mesh

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func TestCheckPageToken(t *testing.T) {
	t.Parallel()
	const notToken = " is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came"
	for _, tc := range []struct{ in, err string }{
		{base64.RawURLEncoding.EncodeToString(make([]byte, 17)), ""},
		{"-_-_", ""},
		{strings.Repeat("A", MaxPageTokenLen), ""},
		{"", "invalid argument: page_token: empty"},
		{strings.Repeat("A", MaxPageTokenLen+1), "invalid argument: page_token: 65 characters, at most 64: send the next_page_token of an earlier answer as it came"},
		{"!!", `invalid argument: page_token: "!!"` + notToken},
		{"AQ==", `invalid argument: page_token: "AQ=="` + notToken},
		{"A+B/", `invalid argument: page_token: "A+B/"` + notToken},
		{"A", `invalid argument: page_token: "A"` + notToken}, // no base64 is one character long
		{"AQ\x00A", `invalid argument: page_token: "AQ\x00A"` + notToken},
		{"\xff\xfe", `invalid argument: page_token: "\xff\xfe"` + notToken},
		{"AQ\nA", `invalid argument: page_token: "AQ\nA"` + notToken},
		{"AQ\rA", `invalid argument: page_token: "AQ\rA"` + notToken},
	} {
		err := CheckPageToken(tc.in)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || err.Error() != tc.err || !errors.Is(err, ErrInvalid)) {
			t.Errorf("CheckPageToken(%q) = %v, want %q", tc.in, err, tc.err)
		}
	}
}
