// Package request holds the rules every door of the query API checks a
// request against before anything acts on it: prism gateway's HTTP and gRPC
// front doors and a runner's HTTP and gRPC query servers refuse the same
// inputs, with the same messages, as InvalidArgument (HTTP 400). A request
// these rules accept can travel on: its ids can become gRPC metadata and
// HTTP headers, and its strings protobuf strings (docs/query-api.md#errors).
//
// It links neither the store nor the HTTP rendering, so the gateway can
// check what the runners check without linking them.
package request

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Target is what a call names its mailbox by: the mailbox id
// (mesh.HeaderMailboxID) or the namespace (mesh.HeaderNamespace), and the
// value.
type Target struct {
	Key, Value string
}

// FromMetadata reads a gRPC call's target: x-mailbox-id, else
// x-prism-namespace, each given at most once and following the mesh's name
// rules (MailboxID, Namespace); errors name the metadata key. An empty
// value is no value, as the runners read it.
func FromMetadata(md metadata.MD) (Target, error) {
	for _, k := range []string{mesh.HeaderMailboxID, mesh.HeaderNamespace} {
		switch v := md.Get(k); {
		case len(v) == 1 && v[0] == "":
		case len(v) > 1:
			return Target{}, fmt.Errorf("%s: given %d times, want once", k, len(v))
		case len(v) == 1 && k == mesh.HeaderMailboxID:
			return Target{Key: k, Value: v[0]}, MailboxID(k, v[0])
		case len(v) == 1:
			return Target{Key: k, Value: v[0]}, Namespace(k, v[0])
		}
	}
	return Target{}, fmt.Errorf("%s (or %s) metadata is required", mesh.HeaderMailboxID, mesh.HeaderNamespace)
}

// MailboxID refuses a mailbox id no route can carry: it must be
// {namespace}@{proxy_id} with the namespace following mesh.NamespaceRule
// and the proxy id mesh.NameRule (docs/architecture.md#identities). Those
// are the names the admin nodes place and route, and printable ASCII, the
// only thing gRPC metadata and HTTP headers carry as it is. The error
// names field.
func MailboxID(field, s string) error {
	if _, err := mesh.CheckMailboxID(s); err != nil {
		return fmt.Errorf("%s: %s is not a mailbox id: want {namespace}@{proxy_id}, each part %s (the namespace optionally after one leading '$')",
			field, quote(s), mesh.NameRule)
	}
	return nil
}

// Namespace refuses a namespace that does not follow mesh.NamespaceRule,
// for the reason MailboxID states.
func Namespace(field, s string) error {
	if !mesh.ValidNamespace(s) {
		return fmt.Errorf("%s: %s must be %s", field, quote(s), mesh.NamespaceRule)
	}
	return nil
}

// quote is s as a refusal repeats it: cut to mesh.MaxEchoLen, in Go
// syntax, so control characters and bytes that are not UTF-8 show escaped.
func quote(s string) string { return fmt.Sprintf("%q", mesh.Echo(s)) }

// MessageID refuses a message id no event can have: empty, or not UTF-8
// (a protobuf string cannot carry it).
func MessageID(s string) error {
	switch {
	case s == "":
		return errors.New("message_id: required")
	case !utf8.ValidString(s):
		return fmt.Errorf("message_id: %s is not UTF-8", quote(s))
	}
	return nil
}

// Filter checks what the store does not: timestamps in range, a non-empty
// range, no empty values, at most mesh.MaxFilterValues values per list,
// every string UTF-8 (as a protobuf string must be, to be sent on), and a
// page token of the form mesh.CheckPageToken states. Errors name the field
// (of EventFilter).
func Filter(f *mailboxv1.EventFilter) error {
	if f.GetLimit() < 0 {
		return fmt.Errorf("limit: must not be negative, got %d", f.GetLimit())
	}
	if ts := f.GetStartTime(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			return fmt.Errorf("start_time: %w", err)
		}
	}
	if ts := f.GetEndTime(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			return fmt.Errorf("end_time: %w", err)
		}
	}
	if f.GetStartTime() != nil && f.GetEndTime() != nil && !f.GetStartTime().AsTime().Before(f.GetEndTime().AsTime()) {
		return errors.New("start_time: must be before end_time")
	}
	for _, l := range []struct {
		field string
		vals  []string
	}{{"topics", f.GetTopics()}, {"principals", f.GetPrincipals()}} {
		if len(l.vals) > mesh.MaxFilterValues {
			return fmt.Errorf("%s: at most %d values, got %d", l.field, mesh.MaxFilterValues, len(l.vals))
		}
		for _, v := range l.vals {
			if v == "" {
				return fmt.Errorf("%s: empty value", l.field)
			}
			if !utf8.ValidString(v) {
				return fmt.Errorf("%s: %s is not UTF-8", l.field, quote(v))
			}
		}
	}
	for _, s := range []struct{ field, v string }{{"correlation_id", f.GetCorrelationId()}, {"trace_id", f.GetTraceId()}, {"page_token", f.GetPageToken()}} {
		if !utf8.ValidString(s.v) {
			return fmt.Errorf("%s: %s is not UTF-8", s.field, quote(s.v))
		}
	}
	if tok := f.GetPageToken(); tok != "" {
		if err := mesh.CheckPageToken(tok); err != nil {
			return errors.New(Reason(err))
		}
	}
	return nil
}

// QueryEvents checks a QueryEvents request; errors name the field from the
// request down ("filter.page_token: ...").
func QueryEvents(req *mailboxv1.QueryEventsRequest) error {
	if err := Filter(req.GetFilter()); err != nil {
		return fmt.Errorf("filter.%w", err)
	}
	return nil
}

// GetEvent checks a GetEvent request.
func GetEvent(req *mailboxv1.GetEventRequest) error {
	return MessageID(req.GetMessageId())
}

// Call checks a MailboxQuery request message: QueryEvents and GetEvent as
// above; GetStats has nothing to check.
func Call(req any) error {
	switch r := req.(type) {
	case *mailboxv1.QueryEventsRequest:
		return QueryEvents(r)
	case *mailboxv1.GetEventRequest:
		return GetEvent(r)
	}
	return nil
}

// Invalid is err as a gRPC InvalidArgument status.
func Invalid(err error) error {
	return status.Error(codes.InvalidArgument, err.Error())
}

// Reason is the message of an error of mesh's id and token checks without
// the "invalid argument: " they start with: a refusal's status says that,
// and its message starts with the field at fault.
func Reason(err error) string {
	return strings.TrimPrefix(err.Error(), mesh.ErrInvalid.Error()+": ")
}
