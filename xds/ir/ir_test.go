package ir

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func valid() *IR {
	return &IR{
		Version:  7,
		Gateway:  Gateway{Address: "0.0.0.0:8080"},
		NotFound: []string{"10.0.0.9:9000"},
		Runners: []Runner{
			{ID: "runner-b", Address: "10.0.0.2:8982", Healthy: true},
			{ID: "runner-a", Address: "10.0.0.1:8982", Healthy: true},
		},
		Mailboxes: []Mailbox{
			{ID: "audit-logs@proxy-02", Namespace: "audit-logs", RunnerID: "runner-b", Epoch: 5},
			{ID: "$admin@proxy-01", Namespace: "$admin", RunnerID: "runner-a", Epoch: 3},
		},
		Aliases: []Alias{{Namespace: "audit-logs", MailboxID: "audit-logs@proxy-02"}},
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*IR)
		want   []error
		kept   func(*IR) bool
	}{
		{name: "valid", mutate: func(*IR) {}},
		{name: "zero version", mutate: func(x *IR) { x.Version = 0 }, want: []error{ErrVersion}},
		{name: "runner host name", mutate: func(x *IR) { x.Runners[0].Address = "proxy-01.prism.local:8982" },
			want: []error{ErrAddress, ErrUnknownRunner, ErrUnknownMailbox},
			kept: func(x *IR) bool { return len(x.Runners) == 1 && len(x.Mailboxes) == 1 && len(x.Aliases) == 0 }},
		{name: "bad runner id", mutate: func(x *IR) { x.Runners[1].ID = "a/b" }, want: []error{ErrRunnerID, ErrUnknownRunner}},
		{name: "mailbox id without proxy", mutate: func(x *IR) { x.Mailboxes[1].ID = "$admin" }, want: []error{ErrMailboxID}},
		{name: "mailbox namespace mismatch", mutate: func(x *IR) { x.Mailboxes[1].Namespace = "other" }, want: []error{ErrMailboxID}},
		{name: "zero epoch", mutate: func(x *IR) { x.Mailboxes[1].Epoch = 0 }, want: []error{ErrEpoch}},
		{name: "duplicate mailbox", mutate: func(x *IR) { x.Mailboxes = append(x.Mailboxes, x.Mailboxes[0]) }, want: []error{ErrDuplicate},
			kept: func(x *IR) bool { return len(x.Mailboxes) == 2 }},
		{name: "alias to unknown mailbox", mutate: func(x *IR) { x.Aliases[0].MailboxID = "audit-logs@proxy-09" }, want: []error{ErrUnknownMailbox}},
		{name: "alias to other namespace", mutate: func(x *IR) { x.Aliases[0].Namespace = "$admin" }, want: []error{ErrAliasNamespace}},
		{name: "gateway without port", mutate: func(x *IR) { x.Gateway.Address = "0.0.0.0" }, want: []error{ErrGatewayListener}},
		{name: "not-found endpoint", mutate: func(x *IR) { x.NotFound = append(x.NotFound, "admin-0:9000") }, want: []error{ErrAddress},
			kept: func(x *IR) bool { return len(x.NotFound) == 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			x := valid()
			tt.mutate(x)
			got, err := x.Valid()
			if len(tt.want) == 0 && err != nil {
				t.Fatalf("Valid() = %v, want no error", err)
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("Valid() = %v, want it to wrap %v", err, w)
				}
			}
			if tt.kept != nil && !tt.kept(got) {
				t.Errorf("Valid() kept %+v", got)
			}
		})
	}
}

func TestEqualIgnoresVersionAndOrder(t *testing.T) {
	t.Parallel()
	a, b := valid(), valid()
	b.Version = 99
	b.Runners[0], b.Runners[1] = b.Runners[1], b.Runners[0]
	if !a.Equal(b) {
		t.Fatal("reordered IR with a new version is not Equal")
	}
	b.Mailboxes[0].Epoch++
	if a.Equal(b) {
		t.Fatal("IR with a new epoch is Equal")
	}
	if (*IR)(nil).Equal(a) || !(*IR)(nil).Equal(nil) {
		t.Fatal("nil handling")
	}
}

func TestSortedDoesNotAliasInput(t *testing.T) {
	t.Parallel()
	x := valid()
	s := x.Sorted()
	s.Runners[0].ID = "changed"
	if x.Runners[0].ID == "changed" || x.Runners[1].ID == "changed" {
		t.Fatal("Sorted shares its slices with the input")
	}
	if s.Runners[1].ID != "runner-b" {
		t.Fatalf("Sorted order = %+v", s.Runners)
	}
}

// TestNameMatchersFollowPatterns checks the hand-written matchers against the
// documented patterns.
func TestNameMatchersFollowPatterns(t *testing.T) {
	t.Parallel()
	ns := regexp.MustCompile(`^` + namespacePattern + `$`)
	id := regexp.MustCompile(`^` + runnerIDPattern + `$`)
	for _, s := range []string{"", "a", "$admin", "a$b", "-a", ".a", "a-b.c_d~e", "a/b", "a@b", "é", "A9", "$", "a b", "_x", "x_"} {
		if got, want := namespaceName.MatchString(s), ns.MatchString(s); got != want {
			t.Errorf("namespace %q: %v, pattern says %v", s, got, want)
		}
		if got, want := runnerIDName.MatchString(s), id.MatchString(s); got != want {
			t.Errorf("runner id %q: %v, pattern says %v", s, got, want)
		}
	}
}

func TestQueryAuthValidate(t *testing.T) {
	t.Parallel()
	base := QueryAuth{Issuer: "https://idp.example", Audience: "prism", JWKSFile: "/etc/prism/jwks.json"}
	tests := []struct {
		name    string
		mutate  func(*QueryAuth)
		wantErr string // "" is valid
	}{
		{name: "file", mutate: func(*QueryAuth) {}},
		{name: "url", mutate: func(q *QueryAuth) { q.JWKSFile, q.JWKSURL = "", "https://idp.example:8443/keys" }},
		{name: "url with ca", mutate: func(q *QueryAuth) { q.JWKSFile, q.JWKSURL, q.JWKSCA = "", "https://idp.example/keys", "/ca.pem" }},
		{name: "no issuer", mutate: func(q *QueryAuth) { q.Issuer = "" }, wantErr: "issuer"},
		{name: "no audience", mutate: func(q *QueryAuth) { q.Audience = "" }, wantErr: "audience"},
		{name: "no jwks", mutate: func(q *QueryAuth) { q.JWKSFile = "" }, wantErr: "JWKS file or URL is required"},
		{name: "both jwks", mutate: func(q *QueryAuth) { q.JWKSURL = "https://idp.example/keys" }, wantErr: "not both"},
		{name: "http url", mutate: func(q *QueryAuth) { q.JWKSFile, q.JWKSURL = "", "http://idp.example/keys" }, wantErr: "want https"},
		{name: "url without host", mutate: func(q *QueryAuth) { q.JWKSFile, q.JWKSURL = "", "https:///keys" }, wantErr: "want https"},
		{name: "url with user", mutate: func(q *QueryAuth) { q.JWKSFile, q.JWKSURL = "", "https://u:p@idp.example/keys" }, wantErr: "want https"},
		{name: "url port zero", mutate: func(q *QueryAuth) { q.JWKSFile, q.JWKSURL = "", "https://idp.example:0/keys" }, wantErr: "bad port"},
		{name: "ca without url", mutate: func(q *QueryAuth) { q.JWKSCA = "/ca.pem" }, wantErr: "only for a JWKS URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := base
			tt.mutate(&q)
			err := q.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrQueryAuth) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want ErrQueryAuth naming %q", err, tt.wantErr)
			}
			x := valid()
			x.Gateway.QueryAuth = q
			got, verr := x.Valid()
			if !errors.Is(verr, ErrQueryAuth) || got.Gateway.QueryAuth != q {
				t.Fatalf("Valid() = %v, kept %+v; want ErrQueryAuth and the setting kept (fail closed)", verr, got.Gateway.QueryAuth)
			}
		})
	}
}

func TestQueryAuthDefaults(t *testing.T) {
	t.Parallel()
	var q QueryAuth
	if q.Enabled() || q.Claim() != "prism_namespaces" || q.CA() != DefaultJWKSCA {
		t.Fatalf("zero QueryAuth: enabled %v, claim %q, CA %q", q.Enabled(), q.Claim(), q.CA())
	}
	q = QueryAuth{Issuer: "i", NamespacesClaim: "ns", JWKSCA: "/ca.pem"}
	if !q.Enabled() || q.Claim() != "ns" || q.CA() != "/ca.pem" {
		t.Fatalf("QueryAuth: enabled %v, claim %q, CA %q", q.Enabled(), q.Claim(), q.CA())
	}
	host, port, err := QueryAuth{JWKSURL: "https://idp.example/keys"}.JWKSHost()
	if err != nil || host != "idp.example" || port != 443 {
		t.Fatalf("JWKSHost() = %q, %d, %v; want idp.example, 443", host, port, err)
	}
}
