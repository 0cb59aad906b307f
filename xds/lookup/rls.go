package lookup

import (
	"context"

	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	lookupv1 "github.com/prism-mesh/prism/proto/prism/lookup/v1"
	"github.com/prism-mesh/prism/xds/ir"
)

// Routes answers where a namespace's alias routes; *fsm.FSM implements it.
type Routes interface {
	NamespaceRoute(ns string) (*adminv1.NamespaceRoute, bool)
}

const (
	// ServiceName is the RLS service grpc-go's RLS client calls.
	ServiceName = "grpc.lookup.v1.RouteLookupService"
	// RouteLookupMethod is its one method, as a full gRPC method name.
	RouteLookupMethod = "/" + ServiceName + "/RouteLookup"
	// NamespaceKey is the key_map key the route's key builder fills from
	// the x-prism-namespace header.
	NamespaceKey = "namespace"
	// AdminTarget is the admin nodes' cluster as RLS reaches it, the
	// answer for an unrouted namespace: they answer the call NotFound
	// (xds/notfound).
	AdminTarget = ir.AdminLookupCluster
)

// ProxyTarget is proxy P's runner's cluster as RLS reaches it: not
// proxy/P, which a route names, but the aggregate over it that only RLS
// names (ir.LookupCluster says why).
func ProxyTarget(proxy string) string { return ir.LookupCluster(ir.ProxyCluster(proxy)) }

// RouteLookupServer is the RLS service.
type RouteLookupServer interface {
	RouteLookup(context.Context, *lookupv1.RouteLookupRequest) (*lookupv1.RouteLookupResponse, error)
}

// routeLookupDesc is what protoc-gen-go-grpc would write for upstream's
// service, over our copies of its messages (see proto/prism/lookup/v1).
var routeLookupDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*RouteLookupServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "RouteLookup",
		Handler:    routeLookupHandler,
	}},
	Metadata: "prism/lookup/v1/rls.proto",
}

func routeLookupHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(lookupv1.RouteLookupRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(RouteLookupServer).RouteLookup(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: RouteLookupMethod}
	handler := func(ctx context.Context, req any) (any, error) {
		return srv.(RouteLookupServer).RouteLookup(ctx, req.(*lookupv1.RouteLookupRequest))
	}
	return interceptor(ctx, in, info, handler)
}

// RegisterRouteLookupServer adds the RLS service to s.
func RegisterRouteLookupServer(s grpc.ServiceRegistrar, srv RouteLookupServer) {
	s.RegisterService(&routeLookupDesc, srv)
}

// RouteLookup answers the key namespace with its proxy's cluster and the
// mailbox id as header data, and anything else with the admin cluster. It
// never fails: grpc-go would back off an entry whose lookup failed.
func (s *Server) RouteLookup(_ context.Context, req *lookupv1.RouteLookupRequest) (*lookupv1.RouteLookupResponse, error) {
	if id, ok := s.route(req.GetKeyMap()[NamespaceKey]); ok {
		return &lookupv1.RouteLookupResponse{Targets: []string{ProxyTarget(id.Proxy)}, HeaderData: id.String()}, nil
	}
	return &lookupv1.RouteLookupResponse{Targets: []string{AdminTarget}}, nil
}

// route is the mailbox namespace ns's alias routes to, if it is routed.
func (s *Server) route(ns string) (mesh.MailboxID, bool) {
	if ns == "" {
		return mesh.MailboxID{}, false
	}
	r, ok := s.routes.NamespaceRoute(ns)
	if !ok {
		return mesh.MailboxID{}, false
	}
	id, err := mesh.ParseMailboxID(r.GetMailboxId())
	if err != nil {
		// The FSM grants valid ids only; a bad one routes nowhere.
		s.log.Error("namespace route names an invalid mailbox", "namespace", ns, "mailbox", r.GetMailboxId(), "err", err)
		return mesh.MailboxID{}, false
	}
	return id, true
}
