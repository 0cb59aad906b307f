package mesh

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// The rules as regexps: the hand-written matchers must agree with them.
var (
	nameRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~-]*$`)
	namespaceRE = regexp.MustCompile(`^\$?[A-Za-z0-9][A-Za-z0-9._~-]*$`)
)

func TestNameRules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		s             string
		name, nsValid bool
	}{
		{"a", true, true},
		{"proxy-01.prism_x~y", true, true},
		{"A9", true, true},
		{"$admin", false, true},
		{"$", false, false},
		{"$$a", false, false},
		{"a$b", false, false},
		{"", false, false},
		{"-a", false, false},
		{".a", false, false},
		{"uni☃", false, false},
		{"a@b", false, false},
		{"a b", false, false},
		{"a/b", false, false},
		{"a%00", false, false},
		{"a\x00", false, false},
		{"a:b", false, false},
		{strings.Repeat("a", MaxIDLen), true, true},
		{strings.Repeat("a", MaxIDLen+1), false, false},
		{"$" + strings.Repeat("a", MaxIDLen-1), false, true},
		{"$" + strings.Repeat("a", MaxIDLen), false, false},
	}
	for _, tc := range cases {
		if got := ValidName(tc.s); got != tc.name {
			t.Errorf("ValidName(%q) = %v, want %v", Echo(tc.s), got, tc.name)
		}
		if got := ValidNamespace(tc.s); got != tc.nsValid {
			t.Errorf("ValidNamespace(%q) = %v, want %v", Echo(tc.s), got, tc.nsValid)
		}
	}
}

func TestCheckErrorsStateTheRule(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		CheckName("proxy_id", "uni☃"),
		CheckNamespace("uni☃"),
		func() error { _, err := CheckMailboxID("uni☃@p"); return err }(),
	} {
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), NameRule) {
			t.Errorf("error %v: want ErrInvalid stating %q", err, NameRule)
		}
	}
	if err := CheckNamespace(strings.Repeat("☃", 5000)); err == nil || len(err.Error()) > 2*MaxEchoLen+len(NamespaceRule) {
		t.Errorf("a 15 KB namespace: %d-byte error, want it echoed truncated", len(err.Error()))
	}
	if id, err := CheckMailboxID("$admin@proxy-1"); err != nil || id.Namespace != "$admin" || id.Proxy != "proxy-1" {
		t.Errorf("CheckMailboxID($admin@proxy-1) = %v, %v", id, err)
	}
	if _, err := CheckMailboxID("a@$p"); err == nil {
		t.Error("a proxy id starting with '$' passed")
	}
}

// FuzzNameRules: the hand-written matchers agree with the regexps, and every
// mailbox id CheckMailboxID accepts is one ParseMailboxID accepts too, so
// every component that reads an id the rules let through can parse it.
func FuzzNameRules(f *testing.F) {
	for _, s := range []string{"a", "$admin", "uni☃", "a@b", "$", "-", "a.b~c_d-e", "a\x00", "%40"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidName(s), len(s) <= MaxIDLen && nameRE.MatchString(s); got != want {
			t.Fatalf("ValidName(%q) = %v, regexp says %v", s, got, want)
		}
		if got, want := ValidNamespace(s), len(s) <= MaxIDLen && namespaceRE.MatchString(s); got != want {
			t.Fatalf("ValidNamespace(%q) = %v, regexp says %v", s, got, want)
		}
		id, err := CheckMailboxID(s)
		if err != nil {
			return
		}
		if id.String() != s {
			t.Fatalf("CheckMailboxID(%q) = %q", s, id)
		}
		if !PathSafe(s) {
			t.Fatalf("valid mailbox id %q is not path safe", s)
		}
		for _, r := range s {
			if r < 0x21 || r > 0x7e {
				t.Fatalf("valid mailbox id %q holds %q, not printable ASCII", s, r)
			}
		}
	})
}
