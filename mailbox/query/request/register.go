package request

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Register adds srv to s as prism.mailbox.v1.MailboxQuery, as
// mailboxv1.RegisterMailboxQueryServer does, except that a request message
// that is not protobuf is refused as InvalidArgument ("request: ...").
//
// grpc-go decodes a unary call's request message in the generated handler,
// before any interceptor, and answers a message its codec cannot decode
// Internal, writing that status before the handler sees the error. No
// client input may be answered as a server fault (docs/query-api.md#errors),
// so the handlers here take the message's bytes as they came (wire, which
// every codec of protobuf's Go API reads whole) and decode them themselves.
// Strings that are not UTF-8 decode (mailbox.proto says why) and Call
// refuses them naming the field.
func Register(s grpc.ServiceRegistrar, srv mailboxv1.MailboxQueryServer) {
	desc := mailboxv1.MailboxQuery_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i, m := range desc.Methods {
		handler := m.Handler
		desc.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			return handler(srv, ctx, func(v any) error {
				var w wire
				if err := dec(&w); err != nil {
					return err
				}
				if err := proto.Unmarshal(w.b, v.(proto.Message)); err != nil {
					return Invalid(fmt.Errorf("request: %w", err))
				}
				return nil
			}, in)
		}
	}
	s.RegisterService(&desc, srv)
}

// wire is a request message's bytes, undecoded. It is a message of
// protobuf's Go API version 1 with its own Unmarshal, which that API calls
// with the bytes, so grpc-go's codec stores them here whatever they hold.
type wire struct{ b []byte }

func (w *wire) Reset()         { w.b = nil }
func (w *wire) String() string { return fmt.Sprintf("%d bytes", len(w.b)) }
func (*wire) ProtoMessage()    {}

// Unmarshal keeps b, which the codec reuses once it returns.
func (w *wire) Unmarshal(b []byte) error {
	w.b = slices.Clone(b)
	return nil
}
