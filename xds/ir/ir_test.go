package ir

import (
	"errors"
	"strings"
	"testing"
)

func valid() *IR {
	return &IR{
		Version: 7,
		Gateway: Gateway{Address: "0.0.0.0:8080"},
		Admins:  []string{"10.0.0.9:9000"},
		Lookup:  "dns:///10.0.0.9:9000",
		Proxies: []Proxy{
			{ID: "proxy-b", RunnerID: "runner-b", Address: "10.0.0.2:8982", Healthy: true},
			{ID: "proxy-a", Address: "10.0.0.1:8982", Healthy: true},
		},
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
		{name: "proxy host name", mutate: func(x *IR) { x.Proxies[0].Address = "proxy-b.prism.local:8982" }, want: []error{ErrAddress},
			kept: func(x *IR) bool { return len(x.Proxies) == 1 && x.Proxies[0].ID == "proxy-a" }},
		{name: "proxy id with @", mutate: func(x *IR) { x.Proxies[1].ID = "a@b" }, want: []error{ErrProxyID},
			kept: func(x *IR) bool { return len(x.Proxies) == 1 }},
		{name: "unicode proxy id", mutate: func(x *IR) { x.Proxies[1].ID = "uni☃" }, want: []error{ErrProxyID},
			kept: func(x *IR) bool { return len(x.Proxies) == 1 }},
		{name: "bad runner id", mutate: func(x *IR) { x.Proxies[0].RunnerID = "a/b" }, want: []error{ErrRunnerID}},
		{name: "duplicate proxy", mutate: func(x *IR) { x.Proxies = append(x.Proxies, x.Proxies[0]) }, want: []error{ErrDuplicate},
			kept: func(x *IR) bool { return len(x.Proxies) == 2 }},
		{name: "invalid duplicate is not the one kept", mutate: func(x *IR) {
			x.Proxies = append([]Proxy{{ID: "proxy-a", Address: "nowhere"}}, x.Proxies...)
		}, want: []error{ErrAddress},
			kept: func(x *IR) bool { return len(x.Proxies) == 2 && x.Proxies[0].Address == "10.0.0.1:8982" }},
		{name: "gateway without port", mutate: func(x *IR) { x.Gateway.Address = "0.0.0.0" }, want: []error{ErrGatewayListener}},
		{name: "admin endpoint", mutate: func(x *IR) { x.Admins = append(x.Admins, "admin-0:9000") }, want: []error{ErrAddress},
			kept: func(x *IR) bool { return len(x.Admins) == 1 }},
		{name: "lookup host:port", mutate: func(x *IR) { x.Lookup = "10.0.0.9:9000" }, kept: func(x *IR) bool { return x.Lookup == "10.0.0.9:9000" }},
		{name: "lookup with space", mutate: func(x *IR) { x.Lookup = "dns:///admin 0:9000" }, want: []error{ErrLookup},
			kept: func(x *IR) bool { return x.Lookup == "" && len(x.Proxies) == 2 }},
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
	b.Proxies[0], b.Proxies[1] = b.Proxies[1], b.Proxies[0]
	if !a.Equal(b) {
		t.Fatal("reordered IR with a new version is not Equal")
	}
	for name, mutate := range map[string]func(*IR){
		"unhealthy": func(x *IR) { x.Proxies[0].Healthy = false },
		"moved":     func(x *IR) { x.Proxies[1].Address = "10.0.0.3:8982" },
		"lookup":    func(x *IR) { x.Lookup = "" },
		"admins":    func(x *IR) { x.Admins = nil },
	} {
		c := valid()
		mutate(c)
		if a.Equal(c) {
			t.Errorf("IR %s is Equal", name)
		}
	}
	if (*IR)(nil).Equal(a) || !(*IR)(nil).Equal(nil) {
		t.Fatal("nil handling")
	}
}

func TestSortedDoesNotAliasInput(t *testing.T) {
	t.Parallel()
	x := valid()
	s := x.Sorted()
	s.Proxies[0].ID = "changed"
	if x.Proxies[0].ID == "changed" || x.Proxies[1].ID == "changed" {
		t.Fatal("Sorted shares its slices with the input")
	}
	if s.Proxies[1].ID != "proxy-b" {
		t.Fatalf("Sorted order = %+v", s.Proxies)
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
