package mesh

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseMailboxID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("n", MaxIDLen) + "@" + strings.Repeat("p", MaxIDLen) // MaxMailboxIDLen bytes: a namespace and a proxy id of MaxIDLen each
	cases := []struct {
		in   string
		want MailboxID
		err  string // the whole message; empty when in parses
	}{
		{in: "audit-logs@proxy-01", want: MailboxID{"audit-logs", "proxy-01"}},
		{in: "$admin@proxy-01", want: MailboxID{"$admin", "proxy-01"}},
		{in: "ns@p.default.svc", want: MailboxID{"ns", "p.default.svc"}},
		{in: "ünï@cödé", want: MailboxID{"ünï", "cödé"}},
		{in: long, want: MailboxID{strings.Repeat("n", MaxIDLen), strings.Repeat("p", MaxIDLen)}},
		{in: "", err: `invalid argument: mailbox_id: empty`},
		{in: long + "p", err: `invalid argument: mailbox_id: 508 bytes, at most 507`},
		{in: "ns@\xff", err: `invalid argument: mailbox_id: not UTF-8`},
		{in: "a b@p", err: `invalid argument: mailbox_id: "a b@p" contains whitespace or control characters`},
		{in: "ns@p\x00", err: `invalid argument: mailbox_id: "ns@p\x00" contains whitespace or control characters`},
		{in: "ns@p\n", err: `invalid argument: mailbox_id: "ns@p\n" contains whitespace or control characters`},
		{in: "audit-logs", err: `invalid argument: mailbox_id: "audit-logs" is not of the form namespace@proxy_id`},
		{in: "@p", err: `mailbox_id "@p": invalid argument: namespace: empty`},
		{in: "ns@", err: `mailbox_id "ns@": invalid argument: proxy_id: empty`},
		{in: "a@b@c", err: `mailbox_id "a@b@c": invalid argument: proxy_id: "b@c" contains '@'`},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%.24q", tc.in), func(t *testing.T) {
			t.Parallel()
			got, err := ParseMailboxID(tc.in)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !errors.Is(err, ErrInvalid) {
					t.Fatalf("ParseMailboxID(%q) = %v, %v; want ErrInvalid %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || got.String() != tc.in {
				t.Fatalf("ParseMailboxID(%q) = %#v, %v; want %#v formatting back to the input", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestNewMailboxID(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, ns, proxy string
		err             string
	}{
		{name: "valid", ns: "audit-logs", proxy: "proxy-01"},
		{name: "admin namespace", ns: "$admin", proxy: "proxy-01"},
		{name: "empty namespace", proxy: "p", err: `invalid argument: namespace: empty`},
		{name: "namespace with @", ns: "a@b", proxy: "p", err: `invalid argument: namespace: "a@b" contains '@'`},
		{name: "namespace with a space", ns: "a b", proxy: "p", err: `invalid argument: namespace: "a b" contains whitespace or control characters`},
		{name: "empty proxy", ns: "ns", err: `invalid argument: proxy_id: empty`},
		{name: "proxy with @", ns: "ns", proxy: "p@q", err: `invalid argument: proxy_id: "p@q" contains '@'`},
		{name: "proxy too long", ns: "ns", proxy: strings.Repeat("p", MaxIDLen+1), err: `invalid argument: proxy_id: 254 bytes, at most 253`},
		{name: "joined too long", ns: strings.Repeat("n", 200), proxy: strings.Repeat("p", 53), err: `invalid argument: mailbox_id: 254 bytes, at most 253`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id, err := NewMailboxID(tc.ns, tc.proxy)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !errors.Is(err, ErrInvalid) {
					t.Fatalf("NewMailboxID(%q, %q) = %v, %v; want ErrInvalid %q", tc.ns, tc.proxy, id, err, tc.err)
				}
				return
			}
			back, err := ParseMailboxID(id.String())
			if err != nil || back != id || id != (MailboxID{tc.ns, tc.proxy}) {
				t.Fatalf("NewMailboxID(%q, %q) = %#v; parsed back %#v, %v", tc.ns, tc.proxy, id, back, err)
			}
		})
	}
}

func TestValidateID(t *testing.T) {
	t.Parallel()
	cases := []struct {
		id, err string
	}{
		{id: "runner-a"},
		{id: "10.0.0.1:9000"},
		{id: "a/b@c"},
		{id: strings.Repeat("r", MaxIDLen)},
		{id: "", err: `invalid argument: runner_id: empty`},
		{id: strings.Repeat("r", MaxIDLen+1), err: `invalid argument: runner_id: 254 bytes, at most 253`},
		{id: "r\xc3", err: `invalid argument: runner_id: not UTF-8`},
		{id: "r\t1", err: `invalid argument: runner_id: "r\t1" contains whitespace or control characters`},
		{id: "r\u00a01", err: `invalid argument: runner_id: "r\u00a01" contains whitespace or control characters`},
		{id: "r\x7f", err: `invalid argument: runner_id: "r\x7f" contains whitespace or control characters`},
	}
	for _, tc := range cases {
		err := ValidateID("runner_id", tc.id)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || err.Error() != tc.err || !errors.Is(err, ErrInvalid)) {
			t.Errorf("ValidateID(%q) = %v, want %q", tc.id, err, tc.err)
		}
	}
}

func TestPathSafe(t *testing.T) {
	t.Parallel()
	cases := []struct {
		id   string
		safe bool
	}{
		{"$admin@proxy-01", true},
		{"dev", true},
		{"...", true},
		{"a b", true}, // a directory name may hold a space; ParseMailboxID is the stricter rule
		{"", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"a\\b", false},
		{"a\x00b", false},
	}
	for _, tc := range cases {
		if got := PathSafe(tc.id); got != tc.safe {
			t.Errorf("PathSafe(%q) = %v, want %v", tc.id, got, tc.safe)
		}
	}
}

// FuzzParseMailboxID: whatever parses formats back to itself with valid
// parts; whatever does not is refused as ErrInvalid.
func FuzzParseMailboxID(f *testing.F) {
	for _, s := range []string{"audit-logs@proxy-01", "$admin@proxy-01", "a@b@c", "@p", "ns@", "", "a b@p", "ns@p\x00", "ns@\xff", "ünï@cödé"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseMailboxID(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		again, err := ParseMailboxID(id.String())
		if err != nil || again != id || id.String() != s {
			t.Fatalf("%q parsed into %#v, which formats to %q and parses into %#v, %v", s, id, id.String(), again, err)
		}
		if ValidateNamespaceName(id.Namespace) != nil || ValidateProxyID(id.Proxy) != nil {
			t.Fatalf("%q parsed into invalid parts %#v", s, id)
		}
		if built, err := NewMailboxID(id.Namespace, id.Proxy); err != nil || built != id {
			t.Fatalf("NewMailboxID%v = %#v, %v", id, built, err)
		}
	})
}

func TestEcho(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 10_000)
	snowmen := strings.Repeat("a", MaxEchoLen-1) + strings.Repeat("☃", 10) // 3-byte runes across the cut
	tests := []struct {
		name, id, want string
	}{
		{"short", "audit@proxy-1", "audit@proxy-1"},
		{"empty", "", ""},
		{"exactly the bound", long[:MaxEchoLen], long[:MaxEchoLen]},
		{"10 KB", long, long[:MaxEchoLen] + "…"},
		{"rune across the cut", snowmen, snowmen[:MaxEchoLen-1] + "…"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Echo(tc.id)
			if got != tc.want {
				t.Fatalf("Echo = %q (%d bytes), want %q", got, len(got), tc.want)
			}
			if !utf8.ValidString(got) || len(got) > MaxEchoLen+len("…") {
				t.Fatalf("Echo = %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
}
