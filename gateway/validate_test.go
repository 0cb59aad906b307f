package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// TestBadInputRefusedBeforeAnythingElse: what the query API does not
// accept is refused 400 / InvalidArgument naming the parameter by either
// door, with or without a valid token, and never reaches the runner (where
// a NUL or non-ASCII id became a header grpc-go would not send, a 500, and
// a page token that is not UTF-8 a message it would not marshal).
func TestBadInputRefusedBeforeAnythingElse(t *testing.T) {
	t.Parallel()
	m := startAuthMesh(t)
	tok := token(t, m.key, nil, "*")
	for _, tc := range []struct{ path, msg string }{
		{"/v1/mailboxes/demo%00@p1/stats", `mailbox_id: "demo\x00@p1" is not a mailbox id`},
		{"/v1/mailboxes/d%C3%A9mo@p1/stats", `mailbox_id: "démo@p1" is not a mailbox id`},
		{"/v1/mailboxes/demo@p1%7F/events", `mailbox_id: "demo@p1\x7f" is not a mailbox id`},
		{"/v1/mailboxes/" + strings.Repeat("n", mesh.MaxIDLen+1) + "@p1/stats", `mailbox_id: "nnnn`},
		{"/v1/namespaces/de%0Amo/stats", `namespace: "de\nmo" must be `},
		{"/v1/mailboxes/demo@p1/events?limit=%zz", `limit: invalid URL escape "%zz"`},
		{"/v1/mailboxes/demo@p1/events?" + strings.Repeat("limit=5&", 10_000) + "limit=5", "query: 10001 parameters, at most 256"},
		{"/v1/mailboxes/demo@p1/events?page_token=%ff%fe", `page_token: "\xff\xfe" is not UTF-8`},
		{"/v1/mailboxes/demo@p1/events?page_token=" + url.QueryEscape("not a token"), `page_token: "not a token" is not a page token`},
		{"/v1/mailboxes/demo@p1/events/m%ff", `message_id: "m\xff" is not UTF-8`},
		{"/v1/mailboxes/demo@p1/stats?x=1", `"x": unknown parameter (this path takes none)`},
	} {
		for _, withToken := range []string{tok, ""} {
			before := m.runner.calls.Load()
			r := m.httpGet(t, "", withToken, tc.path)
			var body map[string]string
			if r.code != http.StatusBadRequest || json.Unmarshal([]byte(r.body), &body) != nil || !strings.Contains(body["error"], tc.msg) {
				t.Errorf("GET %.60s (token %t) = %d %.200s, want 400 with an error containing %q", tc.path, withToken != "", r.code, r.body, tc.msg)
			}
			if n := m.runner.calls.Load() - before; n != 0 {
				t.Errorf("GET %.60s: the runner was called %d times", tc.path, n)
			}
		}
	}

	// The gRPC door, through the interceptor as the server runs it: metadata
	// a grpc-go client would not even send arrives from other clients.
	intercept := m.gw.GRPCInterceptor(gateway.WithAuth(m.auth))
	stats := &grpc.UnaryServerInfo{FullMethod: "/prism.mailbox.v1.MailboxQuery/GetStats"}
	events := &grpc.UnaryServerInfo{FullMethod: "/prism.mailbox.v1.MailboxQuery/QueryEvents"}
	type call struct {
		name string
		md   metadata.MD
		info *grpc.UnaryServerInfo
		req  any
		msg  string
	}
	calls := []call{
		{"non-ASCII id", metadata.Pairs(mesh.HeaderMailboxID, "démo@p1"), stats, &mailboxv1.GetStatsRequest{}, `x-mailbox-id: "démo@p1" is not a mailbox id`},
		{"id not UTF-8", metadata.Pairs(mesh.HeaderMailboxID, "d\xffmo@p1"), stats, &mailboxv1.GetStatsRequest{}, `x-mailbox-id: "d\xffmo@p1" is not a mailbox id`},
		{"overlong id", metadata.Pairs(mesh.HeaderMailboxID, "demo@"+strings.Repeat("p", mesh.MaxIDLen+1)), stats, &mailboxv1.GetStatsRequest{}, "is not a mailbox id"},
		{"id twice", metadata.Pairs(mesh.HeaderMailboxID, "demo@p1", mesh.HeaderMailboxID, "other@p1"), stats, &mailboxv1.GetStatsRequest{}, "x-mailbox-id: given 2 times"},
		{"bad namespace", metadata.Pairs(mesh.HeaderNamespace, "dé"), stats, &mailboxv1.GetStatsRequest{}, `x-prism-namespace: "dé" must be `},
		{"no target", metadata.MD{}, stats, &mailboxv1.GetStatsRequest{}, "x-mailbox-id (or x-prism-namespace) metadata is required"},
		{"page token not UTF-8", metadata.Pairs(mesh.HeaderMailboxID, "demo@p1"), events,
			&mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: "\xff"}}, `filter.page_token: "\xff" is not UTF-8`},
	}
	for c := range 0x20 {
		calls = append(calls, call{"control character", metadata.Pairs(mesh.HeaderMailboxID, "demo"+string(rune(c))+"@p1"), stats, &mailboxv1.GetStatsRequest{}, "is not a mailbox id"})
	}
	for _, c := range calls {
		for _, withToken := range []string{tok, ""} {
			md := c.md.Copy()
			if withToken != "" {
				md.Set("authorization", "Bearer "+withToken)
			}
			called := false
			_, err := intercept(metadata.NewIncomingContext(context.Background(), md), c.req, c.info, func(context.Context, any) (any, error) {
				called = true
				return nil, nil
			})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.msg) || called {
				t.Errorf("%s (token %t): %v, handler called %t; want InvalidArgument containing %q", c.name, withToken != "", err, called, c.msg)
			}
		}
	}
	if _, err := m.grpcStats(t, "", tok, mesh.HeaderMailboxID, "demo@p1"); err != nil {
		t.Errorf("a good call after the bad ones: %v", err)
	}
}
