package httpapi

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/query/request"
	"github.com/prism-mesh/prism/mesh"
)

// params is n parameters of the form name=value joined by '&'.
func params(n int, piece string) string {
	return strings.TrimSuffix(strings.Repeat(piece+"&", n), "&")
}

// A query string is refused whole, naming the parameter, for every input
// url.ParseQuery would have partly skipped or that cannot travel on.
func TestParseQueryRefuses(t *testing.T) {
	t.Parallel()
	token := "AQAAAAAAAAAAAAAAAAAAAAA" // a store token's form: base64url of 17 bytes
	for _, tc := range []struct {
		name, raw, err string // err: the whole message
	}{
		{"bad escape in a value", "limit=%zz", `limit: invalid URL escape "%zz"`},
		{"bad escape after a good parameter", "topic=a&limit=%zz", `limit: invalid URL escape "%zz"`},
		{"escape cut short", "topic=%4", `topic: invalid URL escape "%4"`},
		{"lone percent", "principal=%", `principal: invalid URL escape "%"`},
		{"half-hex escape", "trace_id=%g0", `trace_id: invalid URL escape "%g0"`},
		{"bad escape in a name", "%zz=1", `"%zz": invalid URL escape "%zz" in the parameter name`},
		{"bad escape in an unknown name's value", "x=%zz", `"x": unknown parameter (accepted: [topic principal correlation_id trace_id start end limit page_token])`},
		{"one parameter too many", params(MaxParams+1, "topic=a"), `query: 257 parameters, at most 256`},
		{"ParseQuery's bound plus one", params(10_001, "limit=5"), `query: 10001 parameters, at most 256`},
		{"ParseQuery's bound", params(10_000, "limit=5"), `query: 10000 parameters, at most 256`},
		{"empty pieces count", strings.Repeat("&", MaxParams), `query: 257 parameters, at most 256`},
		{"repeated single", "limit=1&limit=2", `limit: given 2 times, want at most once`},
		{"repeated page token", "page_token=" + token + "&page_token=" + token, `page_token: given 2 times, want at most once`},
		{"unknown", "principals=a", `"principals": unknown parameter (accepted: [topic principal correlation_id trace_id start end limit page_token])`},
		{"unknown after an escape", "topic%73=a", `"topics": unknown parameter (accepted: [topic principal correlation_id trace_id start end limit page_token])`},
		{"not UTF-8", "topic=%ff", `topic: "\xff" is not UTF-8`},
		{"page token not UTF-8", "page_token=%ff%fe", `page_token: "\xff\xfe" is not UTF-8`},
		{"page token of garbage", "page_token=%21%21", `page_token: "!!" is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came`},
		{"page token with a NUL", "page_token=AQ%00A", `page_token: "AQ\x00A" is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came`},
		{"page token padded", "page_token=AQ%3D%3D", `page_token: "AQ==" is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came`},
		{"page token in standard base64", "page_token=A%2BB%2F", `page_token: "A+B/" is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came`},
		{"page token overlong", "page_token=" + strings.Repeat("A", mesh.MaxPageTokenLen+1), `page_token: 65 characters, at most 64: send the next_page_token of an earlier answer as it came`},
		{"empty page token", "page_token=", `page_token: empty value`},
		{"limit overlong", "limit=" + strings.Repeat("9", 10_000), `limit: want a whole number from 0 to 1000, got "` + strings.Repeat("9", mesh.MaxEchoLen) + `…"`},
		{"semicolon is no separator", "limit=5;topic=a", `limit: want a whole number from 0 to 1000, got "5;topic=a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := ParseQuery(tc.raw)
			if err == nil || err.Error() != tc.err {
				t.Fatalf("ParseQuery(%.60q) = %v, %v; want error %q", tc.raw, f, err, tc.err)
			}
		})
	}
}

// The inputs just inside each bound are accepted.
func TestParseQueryAccepts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw string
	}{
		// As many topics as a filter may hold, and empty pieces up to the bound.
		{"as many parameters as the bound", params(mesh.MaxFilterValues, "topic=a") + "&" + params(MaxParams-mesh.MaxFilterValues, "")},
		{"a valid escape", "topic=%61udit.events"},
		{"plus is a space", "principal=a+b"},
		{"empty pieces skipped", "&&topic=a&&"},
		{"a page token at the bound", "page_token=" + strings.Repeat("A", mesh.MaxPageTokenLen)},
		{"no query", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := ParseQuery(tc.raw)
			if err != nil {
				t.Fatalf("ParseQuery(%.60q): %v", tc.raw, err)
			}
			if err := request.Filter(f); err != nil {
				t.Fatalf("ParseQuery(%.60q) gave a filter request.Filter refuses: %v", tc.raw, err)
			}
		})
	}
	f, err := ParseQuery("topic=%61udit.events&principal=a+b")
	if err != nil || !slices.Equal(f.Topics, []string{"audit.events"}) || !slices.Equal(f.Principals, []string{"a b"}) {
		t.Errorf("escapes: %v, %v", f, err)
	}
}

func TestParseNoParams(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"":              "",
		"&&":            "",
		"limit=5":       `"limit": unknown parameter (this path takes none)`,
		"%zz":           `"%zz": invalid URL escape "%zz" in the parameter name`,
		params(257, ""): `query: 257 parameters, at most 256`,
	} {
		got := ""
		if err := ParseNoParams(raw); err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("ParseNoParams(%.40q) = %q, want %q", raw, got, want)
		}
	}
}

// FuzzParseQuery: no query string panics the parser; a refusal starts with
// the parameter at fault (or "query:" for the count); an accepted one gives
// a filter request.Filter accepts and that protobuf can marshal (so the
// gateway can send it on), from no more than MaxParams pieces, holding
// exactly what url.ParseQuery reads from the same string without error (so
// nothing was skipped).
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{
		"topic=a,b&principal=u&principal=v,w&limit=5",
		"start=2026-01-02T03:04:05Z&end=1767323045000",
		"correlation_id=c&trace_id=t&page_token=AQAAAAAAAAAAAAAAAAAAAAA",
		"limit=99999999999999999999", "start=-1", "principal=,", "x=1", "%zz",
		"limit=%zz", "page_token=%ff%fe", "page_token=%00", "topic=%ff", "limit=5;topic=a",
		params(MaxParams, "topic=a"), params(MaxParams+1, "limit=5"), params(10_001, "limit=5"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		filter, err := ParseQuery(raw)
		if err != nil {
			msg := err.Error()
			named := strings.HasPrefix(msg, "query: ") || strings.HasPrefix(msg, `"`)
			for _, p := range queryParams {
				named = named || strings.HasPrefix(msg, p+": ")
			}
			if !named {
				t.Fatalf("error names no parameter: %v", err)
			}
			return
		}
		if n := strings.Count(raw, "&") + 1; n > MaxParams {
			t.Fatalf("accepted %d parameters", n)
		}
		if filter.Limit < 0 || filter.Limit > mesh.MaxQueryLimit {
			t.Fatalf("limit %d out of range", filter.Limit)
		}
		if err := request.Filter(filter); err != nil {
			t.Fatalf("accepted query gives invalid filter: %v", err)
		}
		if _, err := proto.Marshal(filter); err != nil {
			t.Fatalf("accepted query gives a filter protobuf cannot marshal: %v", err)
		}
		if strings.Contains(raw, ";") {
			return // url.ParseQuery refuses what ParseQuery reads as part of a value
		}
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("accepted what url.ParseQuery refuses: %v", err)
		}
		again, err := ParseQuery(q.Encode())
		if err != nil || !proto.Equal(again, filter) {
			t.Fatalf("url.ParseQuery reads %v, parsed as %v, %v; ParseQuery read %v", q, again, err, filter)
		}
	})
}
