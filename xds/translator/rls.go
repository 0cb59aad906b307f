package translator

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prism-mesh/prism/mesh"
	lookupv1 "github.com/prism-mesh/prism/proto/prism/lookup/v1"
	"github.com/prism-mesh/prism/xds/ir"
)

// RouteLookupTypeURL is the type grpc-go's RLS cluster specifier plugin is
// registered for. Our messages are the same on the wire under our own
// proto package (proto/prism/lookup/v1 says why), so the Any names
// upstream's type, not ours.
const RouteLookupTypeURL = "type.googleapis.com/grpc.lookup.v1.RouteLookupClusterSpecifier"

// The RLS cache settings. A namespace that moves is picked up within
// rlsMaxAge; an answer older than rlsStaleAge is refreshed in the
// background while still used (RLS requires stale ≤ max). Unknown
// namespaces are answered with lookup/prism/admin and cached alike, so a
// client asking for one does not ask the admin nodes on every call.
const (
	rlsMaxAge        = 10 * time.Second
	rlsStaleAge      = 5 * time.Second
	rlsLookupTimeout = 2 * time.Second
	rlsCacheBytes    = 4 << 20
	// rlsNamespaceKey is the key the admin's lookup reads the namespace
	// from (xds/lookup).
	rlsNamespaceKey = "namespace"
	// mailboxQueryService is the gRPC service the key builder is for.
	mailboxQueryService = "prism.mailbox.v1.MailboxQuery"
)

// routeLookupSpecifier is grpc-go's RLS configuration: a MailboxQuery call's
// x-prism-namespace becomes the lookup's "namespace" key, asked of lookup
// (the admin nodes), whose answer names a cluster of this control plane:
// one of grpc-go's lookup aggregates (ir.LookupCluster), as does the
// default target used while the lookup cannot be reached.
func routeLookupSpecifier(lookup string) (*anypb.Any, error) {
	spec := &lookupv1.RouteLookupClusterSpecifier{RouteLookupConfig: &lookupv1.RouteLookupConfig{
		GrpcKeybuilders: []*lookupv1.GrpcKeyBuilder{{
			Names:   []*lookupv1.GrpcKeyBuilder_Name{{Service: mailboxQueryService}},
			Headers: []*lookupv1.NameMatcher{{Key: rlsNamespaceKey, Names: []string{mesh.HeaderNamespace}}},
		}},
		LookupService:        lookup,
		LookupServiceTimeout: durationpb.New(rlsLookupTimeout),
		MaxAge:               durationpb.New(rlsMaxAge),
		StaleAge:             durationpb.New(rlsStaleAge),
		CacheSizeBytes:       rlsCacheBytes,
		DefaultTarget:        ir.AdminLookupCluster,
	}}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("route lookup config: %w", err)
	}
	return &anypb.Any{TypeUrl: RouteLookupTypeURL, Value: b}, nil
}
