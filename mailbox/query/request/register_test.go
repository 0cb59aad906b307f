package request

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// checker answers each call with its request's refusal by Call, or OK.
type checker struct {
	mailboxv1.UnimplementedMailboxQueryServer
}

func (checker) QueryEvents(_ context.Context, req *mailboxv1.QueryEventsRequest) (*mailboxv1.QueryEventsResponse, error) {
	if err := Call(req); err != nil {
		return nil, Invalid(err)
	}
	return &mailboxv1.QueryEventsResponse{}, nil
}

func (checker) GetEvent(_ context.Context, req *mailboxv1.GetEventRequest) (*mailboxv1.GetEventResponse, error) {
	if err := Call(req); err != nil {
		return nil, Invalid(err)
	}
	return &mailboxv1.GetEventResponse{}, nil
}

// rawCodec sends a []byte as the request message as it is, and reads no answer.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }

// str is field n holding s, as protobuf's wire format has it.
func str(n protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, n, protowire.BytesType), s)
}

// A request message the server cannot read is InvalidArgument, not the
// Internal grpc-go answers it with, and one holding a string that is not
// UTF-8 decodes and is refused by Call naming the field.
func TestRegisterRefusesUnreadableRequests(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	Register(s, checker{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	filter := func(b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), b)
	}
	const query, get = "/prism.mailbox.v1.MailboxQuery/QueryEvents", "/prism.mailbox.v1.MailboxQuery/GetEvent"
	for _, tc := range []struct {
		name, method string
		msg          []byte
		code         codes.Code
		text         string // the start of the message
	}{
		{"a good query", query, filter(str(3, "audit.events")), codes.OK, ""},
		{"a topic that is not UTF-8", query, filter(str(3, "\xff")), codes.InvalidArgument, `filter.topics: "\xff" is not UTF-8`},
		{"a principal that is not UTF-8", query, filter(str(4, "p\xc3")), codes.InvalidArgument, `filter.principals: "p\xc3" is not UTF-8`},
		{"a correlation id that is not UTF-8", query, filter(str(5, "\xed\xa0\x80")), codes.InvalidArgument, `filter.correlation_id: "\xed\xa0\x80" is not UTF-8`},
		{"a trace id that is not UTF-8", query, filter(str(6, "\xfe")), codes.InvalidArgument, `filter.trace_id: "\xfe" is not UTF-8`},
		{"a page token that is not UTF-8", query, filter(str(8, "\xff\xfe")), codes.InvalidArgument, `filter.page_token: "\xff\xfe" is not UTF-8`},
		{"a message id that is not UTF-8", get, str(1, "m\xff"), codes.InvalidArgument, `message_id: "m\xff" is not UTF-8`},
		{"a truncated field", query, filter(str(3, "audit"))[:4], codes.InvalidArgument, "request: "},
		{"a length past the end", get, []byte{0x0a, 0x7f, 'm'}, codes.InvalidArgument, "request: "},
		{"bytes of garbage", get, []byte{0xff, 0xff, 0xff, 0xff}, codes.InvalidArgument, "request: "},
		{"a field of wire type 7", get, []byte{0x0f}, codes.InvalidArgument, "request: "},
	} {
		err := conn.Invoke(t.Context(), tc.method, tc.msg, new([]byte), grpc.ForceCodecV2(rawCodec{}))
		if st := status.Convert(err); st.Code() != tc.code || !strings.HasPrefix(st.Message(), tc.text) {
			t.Errorf("%s: %v %q, want %v starting %q", tc.name, st.Code(), st.Message(), tc.code, tc.text)
		}
	}
}
