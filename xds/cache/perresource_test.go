package cache

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/prism-mesh/prism/xds/translator"
)

const (
	testListener = "mailbox-query"
	testGateway  = "gateway"
	testRoutes   = "mailbox-routes"
)

// proxyState is a routing state of n proxies built directly, not by the
// translator, so the test holds whatever shape the IR takes: one route
// table with a route per proxy, named by a listener of each kind (Envoy's
// socket listener, grpc-go's API listener), and per proxy an EDS cluster
// and its ClusterLoadAssignment; moved gives proxy i another port.
func proxyState(t *testing.T, n int, moved map[int]uint32) *translator.Resources {
	t.Helper()
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: testListener,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: testRoutes,
			ConfigSource:    &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Each data plane is served its own kind of listener, both on the one
	// table here.
	res := &translator.Resources{
		Listeners: []*listenerv3.Listener{
			{Name: testGateway, FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
				Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm},
			}}}}},
			{Name: testListener, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}},
		},
	}
	vh := &routev3.VirtualHost{Name: "mailboxes", Domains: []string{"*"}}
	for i := range n {
		name := fmt.Sprintf("proxy/p%04d", i)
		vh.Routes = append(vh.Routes, &routev3.Route{
			Match: &routev3.RouteMatch{
				PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
				Headers:       []*routev3.HeaderMatcher{{Name: "x-mailbox-id", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: fmt.Sprintf("@p%04d", i)}}}}},
			},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}},
		})
		res.Clusters = append(res.Clusters, &clusterv3.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
				EdsConfig: &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
			},
		})
		port := uint32(9000)
		if p, ok := moved[i]; ok {
			port = p
		}
		res.Endpoints = append(res.Endpoints, &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
					Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
					}},
				}}},
			}}}},
		})
	}
	res.Routes = []*routev3.RouteConfiguration{{Name: testRoutes, VirtualHosts: []*routev3.VirtualHost{vh}}}
	return res
}

// received is what a client was sent, by type: resources, bytes, and the
// version of the last response.
type received map[string]struct {
	resources, bytes int
	version          string
}

func (r received) add(typeURL string, resources, bytes int, version string) {
	e := r[typeURL]
	e.resources += resources
	e.bytes += bytes
	e.version = version
	r[typeURL] = e
}

// counts is r without bytes, to compare with what a step expects.
func (r received) counts() map[string]int {
	out := map[string]int{}
	for t, e := range r {
		out[t] = e.resources
	}
	return out
}

// adsClient is one data plane's ADS stream: it subscribes, ACKs every
// response and reports each on got.
type adsClient struct {
	got chan received
}

// sotwClient subscribes as grpc-go does: every type by name, in state of
// the world.
func sotwClient(ctx context.Context, t *testing.T, conn *grpc.ClientConn, names map[string][]string) *adsClient {
	t.Helper()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "grpc", UserAgentName: "gRPC Go"}
	for typ, n := range names {
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typ, ResourceNames: n}); err != nil {
			t.Fatal(err)
		}
	}
	c := &adsClient{got: make(chan received, 64)}
	go func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				return
			}
			r := received{}
			r.add(resp.GetTypeUrl(), len(resp.GetResources()), proto.Size(resp), resp.GetVersionInfo())
			c.got <- r
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: names[resp.GetTypeUrl()]}
			if err := s.Send(ack); err != nil {
				return
			}
		}
	}()
	return c
}

// deltaClient subscribes as Envoy does: listeners and clusters wildcard,
// routes and endpoints by name, in delta.
func deltaClient(ctx context.Context, t *testing.T, conn *grpc.ClientConn, names map[string][]string) *adsClient {
	t.Helper()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy", UserAgentName: "envoy"}
	for typ, n := range names {
		if err := s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typ, ResourceNamesSubscribe: n}); err != nil {
			t.Fatal(err)
		}
	}
	c := &adsClient{got: make(chan received, 64)}
	go func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				return
			}
			r := received{}
			r.add(resp.GetTypeUrl(), len(resp.GetResources())+len(resp.GetRemovedResources()), proto.Size(resp), resp.GetSystemVersionInfo())
			c.got <- r
			if err := s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
				return
			}
		}
	}()
	return c
}

// quiet is how long a client must receive nothing more before a step is
// taken as complete. Every response a Set causes is queued while Set runs,
// so this only covers forwarding it to the stream.
const quiet = 300 * time.Millisecond

// await collects responses until want is reached, then for quiet more,
// and returns all of it.
func (c *adsClient) await(t *testing.T, want map[string]int) received {
	t.Helper()
	all := received{}
	deadline := time.After(10 * time.Second)
	reached := func() bool {
		got := all.counts()
		for typ, n := range want {
			if got[typ] < n {
				return false
			}
		}
		return true
	}
	for !reached() {
		select {
		case r := <-c.got:
			for typ, e := range r {
				all.add(typ, e.resources, e.bytes, e.version)
			}
		case <-deadline:
			t.Fatalf("received %v, want %v", all.counts(), want)
		}
	}
	for {
		select {
		case r := <-c.got:
			for typ, e := range r {
				all.add(typ, e.resources, e.bytes, e.version)
			}
		case <-time.After(quiet):
			return all
		}
	}
}

// TestChangesSendOnlyWhatChanged: with 1,000 proxies served, a runner
// moving sends a grpc-go-style state-of-the-world client and an Envoy-style
// delta client one ClusterLoadAssignment and nothing else; a Set that
// changes nothing sends nothing; a proxy joining sends the route table
// once, the clusters whole in state of the world (CDS must be complete)
// and only the new one in delta.
func TestChangesSendOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	const proxies = 1000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.Set(ctx, 10, proxyState(t, proxies, nil)); err != nil {
		t.Fatal(err)
	}

	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, c.Watcher(), nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()

	clusters := make([]string, proxies)
	for i := range clusters {
		clusters[i] = fmt.Sprintf("proxy/p%04d", i)
	}
	grpcGo := sotwClient(ctx, t, conn, map[string][]string{
		resource.ListenerType: {testListener}, resource.RouteType: {testRoutes},
		resource.ClusterType: clusters, resource.EndpointType: clusters,
	})
	envoy := deltaClient(ctx, t, conn, map[string][]string{
		resource.ListenerType: nil, resource.ClusterType: nil,
		resource.RouteType: {testRoutes}, resource.EndpointType: clusters,
	})
	initial := map[string]int{resource.ListenerType: 1, resource.RouteType: 1, resource.ClusterType: proxies, resource.EndpointType: proxies}
	for name, client := range map[string]*adsClient{"sotw": grpcGo, "delta": envoy} {
		if got := client.await(t, initial).counts(); !equalCounts(got, initial) {
			t.Fatalf("%s: initial state %v, want %v", name, got, initial)
		}
	}

	steps := []struct {
		name      string
		version   uint64
		res       *translator.Resources
		sotw      map[string]int
		delta     map[string]int
		sotwBytes int // most bytes the state-of-the-world client may receive; 0 no bound
	}{
		{
			name: "a runner moves", version: 11, res: proxyState(t, proxies, map[int]uint32{500: 9500}),
			sotw:  map[string]int{resource.EndpointType: 1},
			delta: map[string]int{resource.EndpointType: 1},
			// the xds.eds_bytes_per_runner_move budget (BENCHMARKS.md).
			sotwBytes: 1024,
		},
		{
			name: "nothing changes under a new version", version: 12, res: proxyState(t, proxies, map[int]uint32{500: 9500}),
			sotw: map[string]int{}, delta: map[string]int{},
		},
		{
			name: "a proxy joins", version: 13, res: proxyState(t, proxies+1, map[int]uint32{500: 9500}),
			// Neither client has asked for the new proxy's endpoints yet, nor
			// grpc-go for its cluster (it asks by name, once the route names
			// it); its clusters come whole all the same.
			sotw:  map[string]int{resource.RouteType: 1, resource.ClusterType: proxies},
			delta: map[string]int{resource.RouteType: 1, resource.ClusterType: 1},
		},
	}
	for _, s := range steps {
		if err := c.Set(ctx, s.version, s.res); err != nil {
			t.Fatal(err)
		}
		got := grpcGo.await(t, s.sotw)
		t.Logf("%s: sotw received %v", s.name, got)
		if !equalCounts(got.counts(), s.sotw) {
			t.Errorf("%s: sotw client received %v resources by type, want %v", s.name, got.counts(), s.sotw)
		}
		if s.sotwBytes > 0 && got[resource.EndpointType].bytes > s.sotwBytes {
			t.Errorf("%s: sotw client received %d bytes of endpoints, want at most %d", s.name, got[resource.EndpointType].bytes, s.sotwBytes)
		}
		sotwGot := got
		got = envoy.await(t, s.delta)
		t.Logf("%s: delta received %v", s.name, got)
		if !equalCounts(got.counts(), s.delta) {
			t.Errorf("%s: delta client received %v resources by type, want %v", s.name, got.counts(), s.delta)
		}
		// Both protocols label what they send with the IR version that
		// changed it, never the LinearCache's own count.
		want := strconv.FormatUint(s.version, 10)
		for typ := range s.sotw {
			if v := sotwGot[typ].version; v != want {
				t.Errorf("%s: sotw %s version %q, want %q", s.name, typ, v, want)
			}
		}
		for typ := range s.delta {
			if v := got[typ].version; v != want {
				t.Errorf("%s: delta %s system version %q, want %q", s.name, typ, v, want)
			}
		}
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
