package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc/resolver"
)

// AdminScheme is the resolver scheme of a bootstrap's one xDS server:
// "prism-admins:///host:port,host:port,..." resolves to every admin node.
//
// One server that resolves to all nodes, rather than one bootstrap server per
// node, is what makes the gateway follow the mesh when its admin node dies:
// grpc-go falls back to a later bootstrap server only while it lacks a
// resource, so with routes cached it would keep retrying the dead node and
// miss every later change. One channel over all addresses instead reconnects
// (pick_first, in the listed order) to the next live node, which serves the
// same versions from its own copy of the Raft log.
const AdminScheme = "prism-admins"

// DefaultNodeCluster is the xDS node cluster the gateway reports.
const DefaultNodeCluster = "prism-gateway"

// Bootstrap returns a grpc-go xDS bootstrap whose ADS server is the admin
// nodes at admins (host:port each), tried in order.
func Bootstrap(admins []string, nodeID string) ([]byte, error) {
	if len(admins) == 0 {
		return nil, errors.New("bootstrap: no admin node")
	}
	for _, a := range admins {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("bootstrap: admin %q: %w", a, err)
		}
	}
	if nodeID == "" {
		return nil, errors.New("bootstrap: node id is required")
	}
	return json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      AdminScheme + ":///" + strings.Join(admins, ","),
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": nodeID, "cluster": DefaultNodeCluster},
	})
}

// grpc-go resolves a bootstrap's server_uri through its global resolver
// registry, which is only safe to fill at init time.
func init() { resolver.Register(adminsBuilder{}) }

// adminsBuilder resolves AdminScheme targets to their static address list.
type adminsBuilder struct{}

func (adminsBuilder) Scheme() string { return AdminScheme }

func (adminsBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(t.Endpoint(), ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, resolver.Address{Addr: a})
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s target %q: no address", AdminScheme, t.URL.String())
	}
	if err := cc.UpdateState(resolver.State{Addresses: addrs}); err != nil {
		return nil, fmt.Errorf("%s target %q: %w", AdminScheme, t.URL.String(), err)
	}
	return staticResolver{}, nil
}

type staticResolver struct{}

func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (staticResolver) Close()                                {}
