package translator

import (
	"regexp"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/prism-mesh/prism/mesh"
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

// TestHeaderRoutesComeFirst pins the order grpc-go's performance and
// correctness rely on: a gRPC call matches on its header before any path
// route is looked at, a call naming a mailbox is routed by it even when it
// names a namespace too, and every header route precedes the catch-alls.
func TestHeaderRoutesComeFirst(t *testing.T) {
	t.Parallel()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
		Runners: []ir.Runner{{ID: "r", Address: "127.0.0.1:1", Healthy: true}}}
	for _, id := range []string{"a@p", "b@p", "c@p"} {
		x.Mailboxes = append(x.Mailboxes, ir.Mailbox{ID: id, Namespace: id[:1], RunnerID: "r", Epoch: 1})
	}
	x.Aliases = []ir.Alias{{Namespace: "a", MailboxID: "a@p"}, {Namespace: "c", MailboxID: "c@p"}}
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	kinds := ""
	for _, r := range res.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		switch {
		case len(r.GetMatch().GetHeaders()) > 0:
			kinds += map[string]string{mesh.HeaderMailboxID: "m", mesh.HeaderNamespace: "s"}[r.GetMatch().GetHeaders()[0].GetName()]
		case r.GetDirectResponse() != nil:
			kinds += "4"
		case r.GetRoute().GetCluster() == NotFoundCluster:
			kinds += "n"
		default:
			kinds += "p"
		}
	}
	if want := "mmm" + "ss" + "pppppp" + "pp" + "n4"; kinds != want {
		t.Fatalf("route kinds in order = %q, want %q", kinds, want)
	}
}

// TestNamespaceHeaderRoutes checks the route a gRPC call naming only its
// namespace takes: the alias's mailbox's runner, answering with that
// mailbox's id and epoch, and nothing for a namespace with no alias.
func TestNamespaceHeaderRoutes(t *testing.T) {
	t.Parallel()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
		Runners: []ir.Runner{{ID: "r1", Address: "127.0.0.1:1", Healthy: true}, {ID: "r2", Address: "127.0.0.1:2", Healthy: true}},
		Mailboxes: []ir.Mailbox{
			{ID: "$admin@p1", Namespace: "$admin", RunnerID: "r1", Epoch: 4},
			{ID: "audit@p2", Namespace: "audit", RunnerID: "r2", Epoch: 9},
			{ID: "plain@p1", Namespace: "plain", RunnerID: "r1", Epoch: 2},
		},
		Aliases: []ir.Alias{{Namespace: "$admin", MailboxID: "$admin@p1"}, {Namespace: "audit", MailboxID: "audit@p2"}},
	}
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	routes := res.Routes[0].GetVirtualHosts()[0].GetRoutes()
	tests := []struct {
		ns, cluster, mailbox, epoch string
	}{
		{"$admin", "runner/r1", "", ""},
		{"audit", "runner/r2", "", ""},
		{"plain", NotFoundCluster, "", ""}, // a mailbox but no alias
		{"audi", NotFoundCluster, "", ""},
		{"audit-logs", NotFoundCluster, "", ""},
	}
	for _, tt := range tests {
		r := grpcRoute(routes, map[string]string{mesh.HeaderNamespace: tt.ns})
		if r == nil {
			t.Fatalf("namespace %q: no route", tt.ns)
		}
		if got := r.GetRoute().GetCluster(); got != tt.cluster {
			t.Errorf("namespace %q: cluster %q, want %q", tt.ns, got, tt.cluster)
		}
		hdr := map[string]string{}
		for _, h := range r.GetResponseHeadersToAdd() {
			hdr[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
		if hdr[mesh.HeaderMailbox] != tt.mailbox || hdr[mesh.HeaderEpoch] != tt.epoch {
			t.Errorf("namespace %q: response headers %v, want mailbox %q epoch %q", tt.ns, hdr, tt.mailbox, tt.epoch)
		}
	}
	both := grpcRoute(routes, map[string]string{mesh.HeaderMailboxID: "plain@p1", mesh.HeaderNamespace: "audit"})
	if got := both.GetRoute().GetCluster(); got != "runner/r1" {
		t.Errorf("call naming mailbox plain@p1 and namespace audit routed to %q, want the mailbox's runner/r1", got)
	}
}

// grpcRoute returns the first route a MailboxQuery call with the given
// metadata matches, as grpc-go matches (path prefix and exact headers).
func grpcRoute(routes []*routev3.Route, md map[string]string) *routev3.Route {
	const path = MailboxQueryPrefix + "GetStats"
next:
	for _, r := range routes {
		if r.GetMatch().GetSafeRegex() != nil || !strings.HasPrefix(path, r.GetMatch().GetPrefix()) {
			continue
		}
		for _, h := range r.GetMatch().GetHeaders() {
			if v, ok := md[h.GetName()]; !ok || v != h.GetStringMatch().GetExact() {
				continue next
			}
		}
		return r
	}
	return nil
}
