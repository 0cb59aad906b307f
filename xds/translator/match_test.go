package translator

import (
	"regexp"
	"testing"

	"github.com/prism-mesh/prism/xds/ir"
)

// TestPathRoutesMatchRawAndEncodedIDs runs the generated path regexes the way
// Envoy and grpc-go do (RE2, whole path without the query string).
func TestPathRoutesMatchRawAndEncodedIDs(t *testing.T) {
	t.Parallel()
	m := ir.Mailbox{ID: "$admin@proxy-01.x", Namespace: "$admin", RunnerID: "r", Epoch: 1}
	mailbox := regexp.MustCompile("^" + pathRoute(m).GetMatch().GetSafeRegex().GetRegex() + "$")
	alias := aliasRoute(ir.Alias{Namespace: "$admin", MailboxID: m.ID}, m)
	namespace := regexp.MustCompile("^" + alias.GetMatch().GetSafeRegex().GetRegex() + "$")
	tests := []struct {
		re   *regexp.Regexp
		path string
		want bool
	}{
		{mailbox, "/v1/mailboxes/$admin@proxy-01.x/events", true},
		{mailbox, "/v1/mailboxes/%24admin%40proxy-01.x/events", true},
		{mailbox, "/v1/mailboxes/$admin%40proxy-01.x/stats", true},
		{mailbox, "/v1/mailboxes/%24admin@proxy-01.x/events/m-1", true},
		{mailbox, "/v1/mailboxes/$admin@proxy-01.x/", true},
		{mailbox, "/v1/mailboxes/$admin@proxy-01.x", false},
		{mailbox, "/v1/mailboxes/$admin@proxy-01Xx/events", false},
		{mailbox, "/v1/mailboxes/$admin@proxy-01.xy/events", false},
		{mailbox, "/v1/mailboxes/admin@proxy-01.x/events", false},
		{namespace, "/v1/namespaces/$admin/events", true},
		{namespace, "/v1/namespaces/%24admin/stats", true},
		{namespace, "/v1/namespaces/$administrators/stats", false},
	}
	for _, tt := range tests {
		if got := tt.re.MatchString(tt.path); got != tt.want {
			t.Errorf("%s matches %q = %v, want %v", tt.re, tt.path, got, tt.want)
		}
	}

	rw := alias.GetRoute().GetRegexRewrite()
	got := regexp.MustCompile(rw.GetPattern().GetRegex()).ReplaceAllLiteralString("/v1/namespaces/%24admin/events/m-1", rw.GetSubstitution())
	if want := "/v1/mailboxes/$admin@proxy-01.x/events/m-1"; got != want {
		t.Errorf("alias rewrite gives %q, want %q", got, want)
	}
}

// TestHeaderRoutesComeFirst pins the order grpc-go's performance relies on: a
// gRPC call matches on its header before any path regex is evaluated.
func TestHeaderRoutesComeFirst(t *testing.T) {
	t.Parallel()
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"},
		Runners: []ir.Runner{{ID: "r", Address: "127.0.0.1:1", Healthy: true}}}
	for _, id := range []string{"a@p", "b@p", "c@p"} {
		ns := id[:1]
		x.Mailboxes = append(x.Mailboxes, ir.Mailbox{ID: id, Namespace: ns, RunnerID: "r", Epoch: 1})
	}
	res, err := Translate(x)
	if err != nil {
		t.Fatal(err)
	}
	routes := res.Routes[0].GetVirtualHosts()[0].GetRoutes()
	kinds := ""
	for _, r := range routes {
		switch {
		case len(r.GetMatch().GetHeaders()) > 0:
			kinds += "h"
		case r.GetMatch().GetSafeRegex() != nil:
			kinds += "p"
		case r.GetAction() != nil && r.GetDirectResponse() != nil:
			kinds += "4"
		case r.GetRoute().GetCluster() == NotFoundCluster:
			kinds += "n"
		}
	}
	if kinds != "hhhpppn4" {
		t.Fatalf("route kinds in order = %q, want hhhpppn4", kinds)
	}
}
