// Package mesh holds the rules every Prism component must agree on to talk
// to another: the header and metadata names a query carries through Envoy,
// the gateway and a runner; the mailbox id "{namespace}@{proxy_id}" and the
// id rules behind it; how a lease refusal travels as a gRPC status; the
// query-token rules both query gateways apply (which namespaces a token's
// claim lets it read, and how a refusal is answered); and how a paged List
// call of the admin API is walked to its last page.
//
// It is the bottom of the import graph: besides the standard library it
// imports only grpc's codes and status and the generated admin API
// (proto/prism/admin/v1, for the LeaseRefusal the refusal codec carries), so
// the gateway and the sidecar can depend on it without linking the store,
// the FSM or the xDS translator.
package mesh
