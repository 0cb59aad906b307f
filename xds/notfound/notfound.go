// Package notfound is the MailboxQuery service behind the "prism/notfound"
// cluster. Routes send every MailboxQuery call that names no known mailbox
// here, because a direct response cannot answer gRPC (grpc-go fails calls on
// non-forwarding routes with UNAVAILABLE). The admin nodes register it on
// their gRPC server, so the answer comes from the same place as the routes.
package notfound

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Server answers every MailboxQuery call with NotFound naming the mailbox or
// namespace, or InvalidArgument when the call names neither.
type Server struct {
	mailboxv1.UnimplementedMailboxQueryServer
}

// Register adds the service to s.
func Register(s grpc.ServiceRegistrar) {
	mailboxv1.RegisterMailboxQueryServer(s, Server{})
}

// QueryEvents answers NotFound.
func (Server) QueryEvents(ctx context.Context, _ *mailboxv1.QueryEventsRequest) (*mailboxv1.QueryEventsResponse, error) {
	return nil, notFound(ctx)
}

// GetEvent answers NotFound.
func (Server) GetEvent(ctx context.Context, _ *mailboxv1.GetEventRequest) (*mailboxv1.GetEventResponse, error) {
	return nil, notFound(ctx)
}

// GetStats answers NotFound.
func (Server) GetStats(ctx context.Context, _ *mailboxv1.GetStatsRequest) (*mailboxv1.GetStatsResponse, error) {
	return nil, notFound(ctx)
}

func notFound(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if id := first(md, mesh.HeaderMailboxID); id != "" {
		return status.Errorf(codes.NotFound, "mailbox %q not found: no live lease routes it", mesh.Echo(id))
	}
	if ns := first(md, mesh.HeaderNamespace); ns != "" {
		return status.Errorf(codes.NotFound, "namespace %q is not routed: no live lease serves it", mesh.Echo(ns))
	}
	return status.Error(codes.InvalidArgument, "missing x-mailbox-id (or x-prism-namespace) metadata naming the mailbox")
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
