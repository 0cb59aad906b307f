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

// The RLS cache settings. grpc-go keeps every answer, a hit or the
// admin cluster for an unrouted namespace, for rlsMaxAge: RLS has one age
// for both, and no way for the lookup to withdraw an answer it gave, so
// the age is the bound on how long a namespace granted a lease is still
// answered "not routed" and a moved one still sent to its old proxy. It
// is kept at 250 ms, which costs a gateway at most one lookup per
// namespace in use per stale age (Envoy asks once per request), answered
// from memory: an answer older than rlsStaleAge is refreshed in the
// background while still used (RLS requires stale ≤ max), so a namespace
// queried steadily never waits for a lookup, and one queried more rarely
// than every 250 ms waits one lookup as each Envoy request does. Expired
// answers stay in the cache until grpc-go's purge, so their child
// policies, and the connections behind them, are kept across refreshes.
//
// rlsNonceKey is a second key, filled from mesh.HeaderLookupNonce, which a
// gateway sets to a value of its own to take a lookup past the cache: a
// retry after the answer it had failed (gateway.Gateway.call) asks the
// admin anew under a key no cached answer has. rlsSkipKey, from
// mesh.HeaderLookupSkip, has the answer start at the route's next in-sync
// replica, so a retry after a mailbox could not answer fails over to another
// copy (docs/architecture.md#replicas).
const (
	rlsMaxAge        = 250 * time.Millisecond
	rlsStaleAge      = 200 * time.Millisecond
	rlsLookupTimeout = 2 * time.Second
	rlsCacheBytes    = 4 << 20
	// rlsNamespaceKey is the key the admin's lookup reads the namespace
	// from (xds/lookup).
	rlsNamespaceKey = "namespace"
	rlsNonceKey     = "nonce"
	// rlsSkipKey is filled from mesh.HeaderLookupSkip: a retry's lookup
	// answers the route's next mailbox first (xds/lookup).
	rlsSkipKey = "skip"
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
			Names: []*lookupv1.GrpcKeyBuilder_Name{{Service: mailboxQueryService}},
			Headers: []*lookupv1.NameMatcher{
				{Key: rlsNamespaceKey, Names: []string{mesh.HeaderNamespace}},
				{Key: rlsNonceKey, Names: []string{mesh.HeaderLookupNonce}},
				{Key: rlsSkipKey, Names: []string{mesh.HeaderLookupSkip}},
			},
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
