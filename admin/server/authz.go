package server

import (
	"context"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/xds/lookup"
)

// callerKey carries the identity of the client a follower forwards for. The
// leader believes it only from an admin node (which authorized the call
// itself and whose certificate proves it is one), and applies the policy to
// that caller, not to the forwarding node.
const callerKey = "x-prism-caller"

// Policy says who may call each method the admin gRPC listener serves when
// it runs over mutual TLS (docs/security.md has the table). Every method is
// listed: one without a rule is refused, so a new RPC stays closed until it
// gets one.
func Policy() identity.Policy {
	ops := identity.AnyOf(identity.Operator)
	readers := identity.AnyOf(identity.Operator, identity.Reader)
	gateway := identity.AnyOf(identity.Gateway)
	admins := identity.AnyOf(identity.Admin)
	anyone := identity.AnyOf(identity.Roles...)
	return identity.Policy{
		adminv1.ControlPlane_RegisterProxy_FullMethodName: identity.OwnProxy(func(r *adminv1.RegisterProxyRequest) string {
			return r.GetRegistration().GetProxyId()
		}),
		adminv1.ControlPlane_ProxyHeartbeat_FullMethodName: identity.OwnProxy((*adminv1.ProxyHeartbeatRequest).GetProxyId),
		// A stream: the rule admits proxies, WatchAssignments checks the
		// proxy id its request names.
		adminv1.ControlPlane_WatchAssignments_FullMethodName: identity.OwnProxy((*adminv1.WatchAssignmentsRequest).GetProxyId),
		adminv1.ControlPlane_AcquireLease_FullMethodName: identity.OwnProxy(func(r *adminv1.AcquireLeaseRequest) string {
			return mailboxProxy(r.GetMailboxId())
		}),
		adminv1.ControlPlane_MailboxHeartbeat_FullMethodName: identity.OwnProxy(func(r *adminv1.MailboxHeartbeatRequest) string {
			return mailboxProxy(r.GetMailboxId())
		}),
		adminv1.ControlPlane_ReleaseLease_FullMethodName: identity.OwnProxy(func(r *adminv1.ReleaseLeaseRequest) string {
			return mailboxProxy(r.GetMailboxId())
		}),
		adminv1.ControlPlane_CreateNamespace_FullMethodName: ops,
		// The proxy's own drain (its pod stopping); an operator drains a
		// proxy with Admin.CordonProxy.
		adminv1.ControlPlane_DrainProxy_FullMethodName: identity.OwnProxy((*adminv1.DrainProxyRequest).GetProxyId),

		// Sessions name their proxy; a session of another proxy is refused
		// by the handler (PermissionDenied), which knows whose it is.
		adminv1.Sessions_OpenSession_FullMethodName:      identity.OwnProxy((*adminv1.OpenSessionRequest).GetProxyId),
		adminv1.Sessions_KeepAliveSession_FullMethodName: identity.OwnProxy((*adminv1.KeepAliveSessionRequest).GetProxyId),
		adminv1.Sessions_CloseSession_FullMethodName:     identity.OwnProxy((*adminv1.CloseSessionRequest).GetProxyId),
		adminv1.Sessions_AcquireLeases_FullMethodName:    ownMailboxes[*adminv1.AcquireLeasesRequest](),
		adminv1.Sessions_ReleaseLeases_FullMethodName:    ownMailboxes[*adminv1.ReleaseLeasesRequest](),

		adminv1.ControlPlane_DeleteNamespace_FullMethodName: ops,

		adminv1.Admin_GetClusterStatus_FullMethodName: readers,
		adminv1.Admin_ListNamespaces_FullMethodName:   readers,
		adminv1.Admin_GetNamespace_FullMethodName:     readers,
		adminv1.Admin_ListProxies_FullMethodName:      readers,
		adminv1.Admin_GetProxy_FullMethodName:         readers,
		adminv1.Admin_ListLeases_FullMethodName:       readers,
		adminv1.Admin_GetLease_FullMethodName:         readers,
		adminv1.Admin_ListRoutes_FullMethodName:       readers,
		adminv1.Admin_GetRoute_FullMethodName:         readers,
		adminv1.Admin_ListSessions_FullMethodName:     readers,
		adminv1.Admin_GetSession_FullMethodName:       readers,
		adminv1.Admin_AddVoter_FullMethodName:         ops,
		adminv1.Admin_RemoveServer_FullMethodName:     ops,
		// A copy of every table: as much as all reads together, and the
		// means to rebuild the cluster, so operators only.
		adminv1.Admin_SaveSnapshot_FullMethodName:  ops,
		adminv1.Admin_MoveNamespace_FullMethodName: ops,
		adminv1.Admin_CancelMove_FullMethodName:    ops,
		adminv1.Admin_CordonProxy_FullMethodName:   ops,
		adminv1.Admin_ListMoves_FullMethodName:     readers,

		adminv1.Peer_Term_FullMethodName: admins,
		adminv1.Peer_Join_FullMethodName: joinRule,

		discoveryv3.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName: gateway,
		discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName:  gateway,
		// The not-found answers Envoy routes unknown mailboxes to.
		mailboxv1.MailboxQuery_QueryEvents_FullMethodName: gateway,
		mailboxv1.MailboxQuery_GetEvent_FullMethodName:    gateway,
		mailboxv1.MailboxQuery_GetStats_FullMethodName:    gateway,
		// The namespace lookup: grpc-go's RLS and Envoy's ext_authz. Both
		// tell where every namespace is served, and ext_authz also rules on
		// query tokens, so only the gateways ask.
		lookup.RouteLookupMethod:                  gateway,
		authv3.Authorization_Check_FullMethodName: gateway,

		healthpb.Health_Check_FullMethodName: anyone,
		healthpb.Health_Watch_FullMethodName: anyone,
		healthpb.Health_List_FullMethodName:  anyone,
	}
}

// mailboxProxy is the proxy id of a mailbox id, "" (refused) when it does
// not parse.
func mailboxProxy(id string) string {
	m, err := mesh.ParseMailboxID(id)
	if err != nil {
		return ""
	}
	return m.Proxy
}

// authorizer applies a Policy to the caller of each call: the peer's
// certificate identity, or the original caller an admin node forwarded for.
type authorizer struct {
	policy identity.Policy
}

func (a authorizer) authorize(ctx context.Context, method string, req any) (identity.Identity, error) {
	caller, err := callerOf(ctx)
	if err != nil {
		return identity.Identity{}, err
	}
	rule, ok := a.policy[method]
	if !ok {
		return caller, identity.Deny(caller, "%s is not open to any identity", method)
	}
	return caller, rule(caller, req)
}

// callerOf is who a call acts for: the peer's identity, or the identity in
// callerKey when the peer is an admin node. Anyone else presenting a call as
// forwarded is refused rather than ignored, since only a forgery would (and
// a forwarded call is not audited again on the leader).
func callerOf(ctx context.Context) (identity.Identity, error) {
	peer, err := identity.FromContext(ctx)
	if err != nil {
		return identity.Identity{}, status.Errorf(codes.Unauthenticated, "%v", err)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	named := md.Get(callerKey)
	if peer.Role != identity.Admin {
		if len(named) > 0 || len(md.Get(forwardedKey)) > 0 {
			return peer, identity.Deny(peer, "only an admin node may forward a call (%s, %s)", callerKey, forwardedKey)
		}
		return peer, nil
	}
	if len(named) == 0 {
		// An admin node's own call (Peer/Term).
		return peer, nil
	}
	if len(named) != 1 {
		return peer, identity.Deny(peer, "%s given %d times", callerKey, len(named))
	}
	orig, err := identity.Parse(named[0])
	if err != nil {
		return peer, identity.Deny(peer, "forwarded caller: %v", err)
	}
	if orig.TrustDomain != peer.TrustDomain {
		return peer, identity.Deny(peer, "forwarded caller %s is outside trust domain %s", orig, peer.TrustDomain)
	}
	return orig, nil
}

func (a authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	caller, err := a.authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return handler(identity.WithCaller(ctx, caller), req)
}

func (a authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	caller, err := a.authorize(ss.Context(), info.FullMethod, nil)
	if err != nil {
		return err
	}
	cs := callerStream{ServerStream: ss, ctx: identity.WithCaller(ss.Context(), caller)}
	if !adsStreams[info.FullMethod] {
		return handler(srv, cs)
	}
	ns := &nodeStream{ServerStream: cs, caller: caller}
	err = handler(srv, ns)
	if refused := ns.refusal(); refused != nil {
		// The xDS server ends a stream whose Recv failed without an error
		// of its own; the client must learn why.
		return refused
	}
	return err
}

// adsStreams are the xDS streams whose requests name the client's node.
var adsStreams = map[string]bool{
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName: true,
	discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName:  true,
}

// nodeAllowed says whether caller may subscribe to xDS as node id: a
// gateway/<name> identity as node <name>, or <name>/<anything> (replicas
// sharing one certificate telling themselves apart). Identity names hold no
// '/', so no gateway's node ids are another's, and the node a stream names
// (in the logs, and to anything served per node) is its caller's own.
func nodeAllowed(caller identity.Identity, node string) bool {
	return node == caller.Name || strings.HasPrefix(node, caller.Name+"/")
}

// nodeStream checks the node every xDS request names (the first must name
// one; later ones may leave it out) before the xDS server sees the request:
// a request naming a node its caller may not be is refused, and with it the
// whole stream, before anything is served for it.
type nodeStream struct {
	grpc.ServerStream
	caller identity.Identity

	mu      sync.Mutex
	named   bool
	refused error
}

func (s *nodeStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	r, ok := m.(interface{ GetNode() *corev3.Node })
	if !ok {
		return s.refuse(status.Errorf(codes.Internal, "xDS request of unexpected type %T", m))
	}
	s.mu.Lock()
	first := !s.named
	s.named = true
	s.mu.Unlock()
	switch node := r.GetNode(); {
	case node == nil && first:
		return s.refuse(identity.Deny(s.caller, "the first xDS request names no node"))
	case node != nil && !nodeAllowed(s.caller, node.GetId()):
		return s.refuse(identity.Deny(s.caller, "xDS node id %q is not %q or %q", node.GetId(), s.caller.Name, s.caller.Name+"/..."))
	}
	return nil
}

func (s *nodeStream) refuse(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused = err
	return err
}

func (s *nodeStream) refusal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s callerStream) Context() context.Context { return s.ctx }

// forwardCaller adds the authorized caller of ctx, if any, to a call a
// follower re-issues on the leader.
func forwardCaller(in, out context.Context) context.Context {
	if caller, ok := identity.Caller(in); ok {
		return metadata.AppendToOutgoingContext(out, callerKey, caller.String())
	}
	return out
}
