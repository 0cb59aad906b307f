package translator

import (
	"regexp"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/prism-mesh/prism/xds/ir"
)

// route returns the first route matching path the way Envoy and grpc-go
// match (prefix, or RE2 on the whole path without the query), or nil.
func route(routes []*routev3.Route, path string) *routev3.Route {
	for _, r := range routes {
		m := r.GetMatch()
		switch {
		case m.GetSafeRegex() != nil:
			if regexp.MustCompile("^(?:" + m.GetSafeRegex().GetRegex() + ")$").MatchString(path) {
				return r
			}
		case strings.HasPrefix(path, m.GetPrefix()):
			return r
		}
	}
	return nil
}

// rewrite applies r's path rewrite as Envoy does.
func rewrite(r *routev3.Route, path string) string {
	a := r.GetRoute()
	if a.GetPrefixRewrite() != "" {
		return a.GetPrefixRewrite() + strings.TrimPrefix(path, r.GetMatch().GetPrefix())
	}
	if rw := a.GetRegexRewrite(); rw != nil {
		return regexp.MustCompile(rw.GetPattern().GetRegex()).ReplaceAllLiteralString(path, rw.GetSubstitution())
	}
	return path
}

func TestPathRoutesMatchRawAndEncodedIDs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		mailbox   ir.Mailbox
		wantRegex bool
		match     []string
		miss      []string
	}{
		{
			name:    "one encodable character",
			mailbox: ir.Mailbox{ID: "audit.v2@proxy-01", Namespace: "audit.v2", RunnerID: "r", Epoch: 1},
			match:   []string{"/v1/mailboxes/audit.v2@proxy-01/events", "/v1/mailboxes/audit.v2%40proxy-01/stats", "/v1/mailboxes/audit.v2@proxy-01/"},
			miss:    []string{"/v1/mailboxes/audit.v2@proxy-01", "/v1/mailboxes/auditXv2@proxy-01/events", "/v1/mailboxes/audit.v2@proxy-011/events"},
		},
		{
			name:    "admin mailbox, every mix of encodings",
			mailbox: ir.Mailbox{ID: "$admin@proxy-01", Namespace: "$admin", RunnerID: "r", Epoch: 1},
			match: []string{"/v1/mailboxes/$admin@proxy-01/events", "/v1/mailboxes/%24admin%40proxy-01/events",
				"/v1/mailboxes/$admin%40proxy-01/stats", "/v1/mailboxes/%24admin@proxy-01/events/m-1"},
			miss: []string{"/v1/mailboxes/admin@proxy-01/events", "/v1/mailboxes/$admin@proxy-0/events"},
		},
		{
			name:      "more encodable characters than prefixes allow",
			mailbox:   ir.Mailbox{ID: "$a$b@p.1", Namespace: "$a$b", RunnerID: "r", Epoch: 1},
			wantRegex: true,
			match:     []string{"/v1/mailboxes/$a$b@p.1/events", "/v1/mailboxes/%24a$b%40p.1/events", "/v1/mailboxes/%24a%24b%40p.1/stats"},
			miss:      []string{"/v1/mailboxes/$a$b@pX1/events", "/v1/mailboxes/$a$b@p.1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			routes := mailboxPathRoutes(tt.mailbox)
			if got := routes[0].GetMatch().GetSafeRegex() != nil; got != tt.wantRegex {
				t.Fatalf("regex route = %v, want %v", got, tt.wantRegex)
			}
			for _, p := range tt.match {
				if route(routes, p) == nil {
					t.Errorf("%q does not route", p)
				}
			}
			for _, p := range tt.miss {
				if route(routes, p) != nil {
					t.Errorf("%q routes, want no match", p)
				}
			}
		})
	}
}

func TestAliasRoutesRewriteToTheMailbox(t *testing.T) {
	t.Parallel()
	for _, ns := range []string{"$admin", "$a$b@"[:4]} {
		m := ir.Mailbox{ID: ns + "@proxy-01", Namespace: ns, RunnerID: "r", Epoch: 1}
		routes := namespaceAliasRoutes(ir.Alias{Namespace: ns, MailboxID: m.ID}, m)
		for _, p := range []string{"/v1/namespaces/" + ns + "/events/m-1", "/v1/namespaces/" + strings.ReplaceAll(ns, "$", "%24") + "/events/m-1"} {
			r := route(routes, p)
			if r == nil {
				t.Errorf("%q does not route", p)
				continue
			}
			if got, want := rewrite(r, p), "/v1/mailboxes/"+m.ID+"/events/m-1"; got != want {
				t.Errorf("%q rewritten to %q, want %q", p, got, want)
			}
		}
		if route(routes, "/v1/namespaces/"+ns+"x/events") != nil {
			t.Errorf("alias %q matches a longer namespace", ns)
		}
	}
}

// TestHeaderRoutesComeFirst pins the order grpc-go's performance relies on: a
// gRPC call matches on its header before any path route is looked at.
func TestHeaderRoutesComeFirst(t *testing.T) {
	t.Parallel()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
		Runners: []ir.Runner{{ID: "r", Address: "127.0.0.1:1", Healthy: true}}}
	for _, id := range []string{"a@p", "b@p", "c@p"} {
		x.Mailboxes = append(x.Mailboxes, ir.Mailbox{ID: id, Namespace: id[:1], RunnerID: "r", Epoch: 1})
	}
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	kinds := ""
	for _, r := range res.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		switch {
		case len(r.GetMatch().GetHeaders()) > 0:
			kinds += "h"
		case r.GetDirectResponse() != nil:
			kinds += "4"
		case r.GetRoute().GetCluster() == NotFoundCluster:
			kinds += "n"
		default:
			kinds += "p"
		}
	}
	if want := "hhh" + "pppppp" + "n4"; kinds != want {
		t.Fatalf("route kinds in order = %q, want %q", kinds, want)
	}
}
