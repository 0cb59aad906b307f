package gateway

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// grpcProxy is the MailboxQuery front door: each call goes upstream as it
// came, naming its mailbox the way the caller did, and the runner's answer,
// code and x-prism-* headers come back unchanged.
type grpcProxy struct {
	mailboxv1.UnimplementedMailboxQueryServer
	g *Gateway
}

// forward makes one upstream call for the incoming call req in ctx, once
// checkCall accepts it.
func (p *grpcProxy) forward(ctx context.Context, method string, req any, fn func(context.Context, ...grpc.CallOption) error) error {
	start := time.Now()
	up, err := checkCall(ctx, req)
	if err == nil {
		var hdr metadata.MD
		hdr, err = p.g.call(ctx, up, fn)
		if len(hdr) > 0 {
			_ = grpc.SetHeader(ctx, hdr) // fails only once headers are sent, never here
		}
	}
	p.g.metrics.grpc(method, status.Code(err), start)
	return err
}

func (p *grpcProxy) QueryEvents(ctx context.Context, req *mailboxv1.QueryEventsRequest) (resp *mailboxv1.QueryEventsResponse, err error) {
	err = p.forward(ctx, "QueryEvents", req, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.g.client.QueryEvents(ctx, req, opts...)
		return err
	})
	return resp, err
}

func (p *grpcProxy) GetEvent(ctx context.Context, req *mailboxv1.GetEventRequest) (resp *mailboxv1.GetEventResponse, err error) {
	err = p.forward(ctx, "GetEvent", req, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.g.client.GetEvent(ctx, req, opts...)
		return err
	})
	return resp, err
}

func (p *grpcProxy) GetStats(ctx context.Context, req *mailboxv1.GetStatsRequest) (resp *mailboxv1.GetStatsResponse, err error) {
	err = p.forward(ctx, "GetStats", req, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.g.client.GetStats(ctx, req, opts...)
		return err
	})
	return resp, err
}

// GRPCInterceptor checks the MailboxQuery calls of the server RegisterGRPC
// registers on before they reach the gateway's handlers: first that the
// call is well formed (checkCall: InvalidArgument, before credentials are
// looked at), then as the options say (WithAuth); other services (health)
// pass. Install it with grpc.ChainUnaryInterceptor.
func (g *Gateway) GRPCInterceptor(opts ...Option) grpc.UnaryServerInterceptor {
	var d door
	for _, o := range opts {
		o(&d)
	}
	prefix := "/" + mailboxv1.MailboxQuery_ServiceDesc.ServiceName + "/"
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method, ok := strings.CutPrefix(info.FullMethod, prefix)
		if !ok {
			return handler(ctx, req)
		}
		start := time.Now()
		up, err := checkCall(ctx, req)
		if err != nil {
			g.metrics.grpc(method, status.Code(err), start)
			return nil, err
		}
		if d.auth == nil {
			return handler(ctx, req)
		}
		p, err := d.auth.Call(ctx)
		if err == nil {
			err = mayRead(p, up)
		}
		if err == nil {
			return handler(ctx, req)
		}
		var refusal *mesh.AuthError
		if errors.As(err, &refusal) {
			g.refused("grpc", method, up, refusal)
		}
		g.metrics.grpc(method, status.Code(err), start)
		return nil, err
	}
}
