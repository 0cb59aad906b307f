package identity_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh/identity"
)

func TestParse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want identity.Identity
		err  string
	}{
		{"spiffe://prism.local/proxy/proxy-01", identity.Identity{TrustDomain: "prism.local", Role: identity.Proxy, Name: "proxy-01"}, ""},
		{"spiffe://example.org/operator/alice", identity.Identity{TrustDomain: "example.org", Role: identity.Operator, Name: "alice"}, ""},
		{"spiffe://prism.local/admin/a_1.x", identity.Identity{TrustDomain: "prism.local", Role: identity.Admin, Name: "a_1.x"}, ""},
		{"spiffe://prism.local/root/x", identity.Identity{}, "unknown role"},
		{"spiffe://prism.local/proxy", identity.Identity{}, "/<role>/<name>"},
		{"spiffe://prism.local/proxy/a/b", identity.Identity{}, "/<role>/<name>"},
		{"spiffe://prism.local/proxy/a@b", identity.Identity{}, "path segment characters"},
		{"https://prism.local/proxy/a", identity.Identity{}, "scheme"},
		{"spiffe://Prism.Local/proxy/a", identity.Identity{}, "trust domain"},
		{"", identity.Identity{}, "empty"},
	}
	for _, tc := range cases {
		got, err := identity.Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want || got.String() != tc.in {
			t.Errorf("Parse(%q) = %+v (%q), %v; want %+v", tc.in, got, got.String(), err, tc.want)
		}
	}
}

// FuzzParse: whatever Parse accepts prints back to itself and survives New;
// nothing panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"spiffe://prism.local/proxy/p1", "spiffe://a/admin/", "spiffe://x/y/z/w", "spiffe:///proxy/a", "spiffe://td/proxy/%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := identity.Parse(s)
		if err != nil {
			return
		}
		if id.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, id.String())
		}
		if _, err := identity.New(id.TrustDomain, id.Role, id.Name); err != nil {
			t.Fatalf("Parse(%q) accepted what New refuses: %v", s, err)
		}
	})
}

type acquire struct{ proxy string }

func TestPolicyRules(t *testing.T) {
	t.Parallel()
	td := "prism.local"
	proxyA := identity.Identity{TrustDomain: td, Role: identity.Proxy, Name: "A"}
	op := identity.Identity{TrustDomain: td, Role: identity.Operator, Name: "ops"}
	gw := identity.Identity{TrustDomain: td, Role: identity.Gateway, Name: "gw"}
	own := identity.OwnProxy(func(r acquire) string { return r.proxy }, identity.Admin)
	cases := []struct {
		name   string
		rule   identity.Rule
		caller identity.Identity
		req    any
		ok     bool
	}{
		{"proxy for itself", own, proxyA, acquire{"A"}, true},
		{"proxy for another proxy", own, proxyA, acquire{"B"}, false},
		{"proxy naming no proxy", own, proxyA, acquire{""}, false},
		{"gateway on a proxy call", own, gw, acquire{"A"}, false},
		{"admin on a proxy call", own, identity.Identity{TrustDomain: td, Role: identity.Admin, Name: "a1"}, acquire{"B"}, true},
		{"stream opening by a proxy", own, proxyA, nil, true},
		{"operator write", identity.AnyOf(identity.Operator), op, nil, true},
		{"gateway write", identity.AnyOf(identity.Operator), gw, nil, false},
	}
	for _, tc := range cases {
		err := tc.rule(tc.caller, tc.req)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v; want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: code %v; want PermissionDenied", tc.name, status.Code(err))
		}
	}
}

// TestPolicyClosedByDefault: a call without a TLS peer is Unauthenticated,
// a method the policy does not name is PermissionDenied, and the handler
// never runs for either.
func TestPolicyClosedByDefault(t *testing.T) {
	t.Parallel()
	p := identity.Policy{"/x.S/Open": identity.AnyOf(identity.Operator)}
	ran := false
	h := func(context.Context, any) (any, error) { ran = true; return nil, nil }
	_, err := p.UnaryInterceptor()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.S/Open"}, h)
	if status.Code(err) != codes.Unauthenticated || ran {
		t.Fatalf("no peer: %v (handler ran: %v); want Unauthenticated", err, ran)
	}
}
