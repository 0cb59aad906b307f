package ir

// Cluster names. The translator serves clusters under these names and the
// namespace lookup (xds/lookup) answers grpc-go's RLS with them, so both
// take them from here; neither imports the other.
const (
	// AdminCluster is served by the admin nodes: xds/notfound's
	// MailboxQuery, the namespace lookup and Envoy's ext_authz.
	AdminCluster = "prism/admin"
	// AdminLookupCluster is AdminCluster as grpc-go's RLS reaches it
	// (LookupCluster): the lookup's answer for an unknown namespace and
	// the RLS default target.
	AdminLookupCluster = lookupClusterPrefix + AdminCluster

	proxyClusterPrefix  = "proxy/"
	lookupClusterPrefix = "lookup/"
)

// ProxyCluster is the cluster of the runner serving proxy id's mailboxes.
func ProxyCluster(id string) string { return proxyClusterPrefix + id }

// LookupCluster is the name grpc-go's RLS reaches cluster by: an aggregate
// cluster over cluster alone that no route names. grpc-go v1.85's cds
// policy under RLS subscribes to its target and waits for the next xDS
// update, which never comes for a cluster a route already subscribed to
// (xdsdepmgr's SubscribeToCluster sends none for a cluster it tracks), so
// an RLS target that is also a route's cluster stalls calls until some
// unrelated resource changes. An aggregate only RLS names is subscribed
// afresh, and its leaf keeps its own endpoints and TLS settings.
func LookupCluster(cluster string) string { return lookupClusterPrefix + cluster }
