package gateway

import (
	"context"
	"net/http"

	"google.golang.org/grpc/metadata"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/query/request"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// The front doors refuse a request the query API does not accept before
// anything else sees it: before the token check, and before any of it
// becomes upstream metadata or a protobuf message (mailbox/query/request
// holds the rules, which the runners apply too). So client input is
// answered 400 / InvalidArgument naming what is wrong, never a 5xx from a
// header or message grpc-go cannot send (docs/query-api.md#errors).

// checkPath refuses the mailbox id or namespace of an HTTP path; the error
// names the path parameter as the OpenAPI document does.
func checkPath(up upstream) error {
	if up.key == mesh.HeaderNamespace {
		return request.Namespace("namespace", up.value)
	}
	return request.MailboxID("mailbox_id", up.value)
}

// parseEvents reads GET .../events: its filter from the query string.
func parseEvents(r *http.Request) (*mailboxv1.QueryEventsRequest, error) {
	f, err := httpapi.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, err
	}
	return &mailboxv1.QueryEventsRequest{Filter: f}, nil
}

// parseEvent reads GET .../events/{message_id}, which takes no parameters.
func parseEvent(r *http.Request) (*mailboxv1.GetEventRequest, error) {
	if err := httpapi.ParseNoParams(r.URL.RawQuery); err != nil {
		return nil, err
	}
	req := &mailboxv1.GetEventRequest{MessageId: r.PathValue("message_id")}
	return req, request.GetEvent(req)
}

// parseStats reads GET .../stats, which takes no parameters.
func parseStats(r *http.Request) (*mailboxv1.GetStatsRequest, error) {
	return &mailboxv1.GetStatsRequest{}, httpapi.ParseNoParams(r.URL.RawQuery)
}

// checkCall refuses a MailboxQuery call whose metadata names no mailbox
// the API accepts or whose request message is malformed, as
// InvalidArgument; it returns the call's target.
func checkCall(ctx context.Context, req any) (upstream, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	t, err := request.FromMetadata(md)
	if err == nil {
		err = request.Call(req)
	}
	if err != nil {
		return upstream{}, request.Invalid(err)
	}
	return upstream{key: t.Key, value: t.Value}, nil
}
