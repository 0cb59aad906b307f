package client

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TrackSent is a dial option that marks the error of every failed unary
// call with whether its request may have reached a server, so that NotSent
// and Do tell "certainly did not run" from "may have run" by a fact gRPC
// reports rather than by reading error text. It also tells Do which method
// a call was, for its errors.
//
// The fact is gRPC's Peer call option: it is filled in only when the call's
// last attempt got a stream on a connection. A call that failed before that
// (no connection could be made, the deadline passed while connecting, the
// connection closed before the stream opened) never left this process.
// Earlier attempts do not blur this as long as the connection has no retry
// policy in its service config (ours set none, and the DNS resolver reads
// none by default): gRPC then makes another attempt only transparently, when
// the server certainly did not process the previous one.
func TrackSent() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(trackSent)
}

func trackSent(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if rec, ok := ctx.Value(recordKey{}).(*record); ok {
		rec.method.Store(&method)
	}
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(slices.Clip(opts), grpc.Peer(&p))...)
	if err == nil {
		return nil
	}
	return &callError{sent: p.Addr != nil, err: err}
}

// callError is a failed call's error as gRPC returned it, plus what
// trackSent learned. It reads as the original: same text, same status
// (details included), so callers that only look at codes see no difference.
type callError struct {
	sent bool
	err  error
}

func (e *callError) Error() string              { return e.err.Error() }
func (e *callError) Unwrap() error              { return e.err }
func (e *callError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// NotSent reports whether err is from a call made over a TrackSent
// connection that failed before its request could reach any server, so no
// server ran it and it may be issued again whatever it does.
func NotSent(err error) bool {
	var ce *callError
	return errors.As(err, &ce) && !ce.sent
}
