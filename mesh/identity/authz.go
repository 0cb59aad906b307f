package identity

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Rule decides whether a caller may make one call. req is the request
// message of a unary call and nil when a stream opens (a stream's handler
// checks what its messages name, with Allowed).
type Rule func(caller Identity, req any) error

// Deny is the refusal of an authenticated caller: PermissionDenied naming
// who asked and what they lack.
func Deny(caller Identity, format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, "%s: %s", caller, fmt.Sprintf(format, args...))
}

// AnyOf allows callers with one of the roles.
func AnyOf(roles ...Role) Rule {
	return func(caller Identity, _ any) error {
		if slices.Contains(roles, caller.Role) {
			return nil
		}
		return Deny(caller, "role %s may not make this call (allowed: %v)", caller.Role, roles)
	}
}

// OwnProxy allows a proxy only for its own proxy id, the one proxyOf reads
// from the request ("" for a request that names no proxy is refused). Other
// roles in also are allowed whatever the request names.
func OwnProxy[Req any](proxyOf func(Req) string, also ...Role) Rule {
	return func(caller Identity, req any) error {
		if slices.Contains(also, caller.Role) {
			return nil
		}
		if caller.Role != Proxy {
			return Deny(caller, "role %s may not make this call (allowed: proxy%s)", caller.Role, alsoList(also))
		}
		r, ok := req.(Req)
		if !ok {
			// A stream opening: its handler checks each message.
			if req == nil {
				return nil
			}
			return Deny(caller, "unexpected request %T", req)
		}
		return SameProxy(caller, proxyOf(r))
	}
}

// SameProxy refuses a proxy identity acting for another proxy id.
func SameProxy(caller Identity, proxyID string) error {
	if caller.Role == Proxy && caller.Name == proxyID {
		return nil
	}
	return Deny(caller, "may only act for its own proxy, not proxy %q", proxyID)
}

func alsoList(roles []Role) string {
	s := ""
	for _, r := range roles {
		s += ", " + string(r)
	}
	return s
}

// Policy maps full gRPC method names ("/pkg.Service/Method") to their rule.
// A method without a rule is refused: a new RPC is closed until someone
// says who may call it.
type Policy map[string]Rule

// authorize applies the policy to a call; a caller without an identity is
// Unauthenticated.
func (p Policy) authorize(ctx context.Context, method string, req any) (Identity, error) {
	caller, err := FromContext(ctx)
	if err != nil {
		return Identity{}, status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
	}
	rule, ok := p[method]
	if !ok {
		return caller, Deny(caller, "%s is not open to any identity", method)
	}
	if err := rule(caller, req); err != nil {
		return caller, err
	}
	return caller, nil
}

type callerKey struct{}

// Caller is the authorized identity of the call ctx belongs to, put there by
// the policy's interceptors.
func Caller(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(callerKey{}).(Identity)
	return id, ok
}

// WithCaller is ctx carrying caller, for servers that authorize without the
// interceptors (HTTP) and for tests.
func WithCaller(ctx context.Context, caller Identity) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// UnaryInterceptor authorizes each unary call before its handler runs.
func (p Policy) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		caller, err := p.authorize(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(WithCaller(ctx, caller), req)
	}
}

// StreamInterceptor authorizes a stream when it opens (the rule sees a nil
// request).
func (p Policy) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		caller, err := p.authorize(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &callerStream{ServerStream: ss, ctx: WithCaller(ss.Context(), caller)})
	}
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }
