package mesh

// Header and gRPC metadata names. gRPC metadata keys are lower case, and
// Envoy matches HTTP header names case-insensitively, so one spelling serves
// both.
const (
	// HeaderMailboxID names the mailbox a query is for; the xDS routes match
	// on it to pick the runner holding the mailbox's lease.
	HeaderMailboxID = "x-mailbox-id"
	// HeaderNamespace names the namespace of a query without a mailbox id;
	// a route on it sends the call to the namespace's current mailbox.
	HeaderNamespace = "x-prism-namespace"
	// HeaderMailbox, in a response, names the mailbox that answered.
	HeaderMailbox = "x-prism-mailbox"
	// HeaderEpoch, in a response, is the lease epoch under which the mailbox
	// answered, when it is known.
	HeaderEpoch = "x-prism-epoch"
	// HeaderLookupNonce, on a namespace query, is a value the gateway
	// makes up to have grpc-go's namespace lookup asked anew rather than
	// answered from its cache: it is part of the lookup's cache key
	// (xds/translator's RLS key builder). Runners ignore it.
	HeaderLookupNonce = "x-prism-lookup-nonce"
	// HeaderLookupSkip, on a namespace query, is how many of the
	// namespace's route's mailboxes (the serving one, then its in-sync
	// replicas) the lookup passes over: a gateway's retry after the
	// mailbox it was sent to could not answer sets it to go to the next
	// (docs/architecture.md#replicas). Part of the lookup's cache key like
	// HeaderLookupNonce; runners ignore it.
	HeaderLookupSkip = "x-prism-lookup-skip"
)

// QueryListenerName is the xDS listener the admin nodes serve for gRPC
// clients of the query API: the gateway dials "xds:///" + QueryListenerName
// and the translator names the listener so.
const QueryListenerName = "mailbox-query"

// CertProviderInstance is the certificate provider instance of a grpc-go
// gateway's xDS bootstrap that holds its certificate and trust bundle; the
// translator's clusters name it in their UpstreamTlsContext.
const CertProviderInstance = "prism"

// DefaultNamespacesClaim is the JWT claim that lists the namespaces a query
// token may read (names, or "*" for all), checked alike by prism gateway and
// by Envoy's RBAC rules (docs/security.md#query-tokens).
const DefaultNamespacesClaim = "prism_namespaces"
