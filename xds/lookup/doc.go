// Package lookup is the namespace lookup the admin nodes serve to the
// gateways, from their own FSM, so namespace aliases (/v1/namespaces/{ns}/...
// and the x-prism-namespace header) stay out of the xDS route tables: they
// change on every namespace move and number as many as the namespaces,
// while the routes are per proxy (an id "{ns}@{P}" names its proxy).
//
// Two services, one answer (Routes.NamespaceRoute: the mailbox on the
// namespace's assigned proxy when it holds a lease, else its newest grant):
//
//   - RLS, grpc.lookup.v1.RouteLookupService/RouteLookup, for grpc-go, whose
//     only cluster specifier plugin is RLS (gRFC A28). The key namespace
//     (from x-prism-namespace) answers the target "lookup/proxy/{Q}", an
//     aggregate over the cluster of the proxy serving the namespace's
//     mailbox "{ns}@{Q}" (ir.LookupCluster says why not that cluster
//     itself), with that id as header data. An unknown namespace answers
//     "lookup/prism/admin", over the admin nodes' cluster, whose
//     MailboxQuery says NotFound, and is cached like a
//     hit: an RLS error would put grpc-go's entry into backoff, and the next
//     lookup after max_age (kept short for this reason, xds/translator's
//     rls.go) picks a new route up either way.
//   - ext_authz, envoy.service.auth.v3.Authorization/Check, for Envoy. It
//     sets x-mailbox-id: {ns}@{Q} on a request naming a routed namespace,
//     and the filter's clear_route_cache makes Envoy match the routes again,
//     so the per-proxy header route takes it to Q's runner, which serves
//     /v1/namespaces/{ns}/... and x-prism-namespace itself. Under query auth
//     the same call checks every namespace the request names against the
//     namespaces claim of the token jwt_authn verified, by the query-token
//     rules prism gateway applies too (mesh.Claimed), so no route carries
//     RBAC of its own.
//
// Why ext_authz and not an internal redirect for Envoy: a redirect needs an
// upstream that answers 3xx for every aliased request (a full proxied
// request to the admin, body buffered), and Envoy then follows it with a
// rewritten path, so the runner would see /v1/mailboxes/{ns}@{Q}/... and the
// alias's own semantics (and its 404 naming the namespace) would be lost.
// ext_authz is a headers-only gRPC call, changes one request header,
// leaves the path as the client sent it, and is where the claim check has
// to run anyway once no route names a namespace. Its cost is one call to an
// admin node per aliased request (Envoy does not cache ext_authz answers),
// answered from memory in O(1); a mailbox id path or header needs none
// without query auth, since ext_authz is enabled only on the alias routes
// then.
//
// The RLS messages are prism.lookup.v1's wire-compatible copies
// (proto/prism/lookup/v1), served under upstream's service name by a
// hand-written grpc.ServiceDesc.
package lookup
