package lookup

import (
	"context"
	"strconv"

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
	// SkipKey is the key_map key filled from the x-prism-lookup-skip
	// header: how many of the route's mailboxes the answer passes over.
	SkipKey = "skip"
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

// RouteLookup answers the key namespace with its mailboxes' proxy clusters,
// the serving mailbox's first and then its in-sync replicas' in order
// (docs/architecture.md#replicas), and the first one's mailbox id as header
// data; anything else with the admin cluster. grpc-go's RLS balancer sends
// a call to the first target whose connection has not failed, so a
// replica takes the queries of a serving runner that cannot be reached.
// The skip key rotates the list by that many, so a gateway's retry after an
// answer it could not use starts at the next copy. It never fails: grpc-go
// would back off an entry whose lookup failed.
func (s *Server) RouteLookup(_ context.Context, req *lookupv1.RouteLookupRequest) (*lookupv1.RouteLookupResponse, error) {
	ids := s.route(req.GetKeyMap()[NamespaceKey])
	if len(ids) == 0 {
		return &lookupv1.RouteLookupResponse{Targets: []string{AdminTarget}}, nil
	}
	if k, err := strconv.ParseUint(req.GetKeyMap()[SkipKey], 10, 32); err == nil {
		k %= uint64(len(ids))
		ids = append(ids[k:], ids[:k]...)
	}
	targets := make([]string, len(ids))
	for i, id := range ids {
		targets[i] = ProxyTarget(id.Proxy)
	}
	return &lookupv1.RouteLookupResponse{Targets: targets, HeaderData: ids[0].String()}, nil
}

// route is the mailboxes namespace ns's alias routes to, the serving one
// first, then its in-sync replicas; none if it is not routed.
func (s *Server) route(ns string) []mesh.MailboxID {
	if ns == "" {
		return nil
	}
	r, ok := s.routes.NamespaceRoute(ns)
	if !ok {
		return nil
	}
	mids := []string{r.GetMailboxId()}
	for _, x := range r.GetInSyncReplicas() {
		mids = append(mids, x.GetMailboxId())
	}
	var out []mesh.MailboxID
	for _, mid := range mids {
		id, err := mesh.ParseMailboxID(mid)
		if err != nil {
			// The FSM grants valid ids only; a bad one routes nowhere.
			s.log.Error("namespace route names an invalid mailbox", "namespace", ns, "mailbox", mid, "err", err)
			continue
		}
		out = append(out, id)
	}
	return out
}
