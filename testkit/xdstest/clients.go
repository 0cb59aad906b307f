package xdstest

import (
	"context"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Types are the four resource types we serve, in the order Envoy asks.
var Types = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

// DeltaClient is a raw incremental ADS client subscribed to every resource of
// every type. It ACKs each response it returns. Its node names no user
// agent, so it is served grpc-go's variant (the API listener, not the
// gateway's).
type DeltaClient struct {
	conn   *grpc.ClientConn
	stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node   *corev3.Node
}

// DialDelta opens a delta ADS stream to addr and subscribes.
func DialDelta(ctx context.Context, addr, nodeID string) (*DeltaClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("delta stream: %w", err)
	}
	d := &DeltaClient{conn: conn, stream: stream, node: &corev3.Node{Id: nodeID, Cluster: "prism-gateway"}}
	for _, t := range Types {
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: d.node, TypeUrl: t, ResourceNamesSubscribe: []string{"*"}}); err != nil {
			conn.Close()
			return nil, fmt.Errorf("subscribe %s: %w", t, err)
		}
	}
	return d, nil
}

// Next returns the next response, after ACKing it.
func (d *DeltaClient) Next() (*discoveryv3.DeltaDiscoveryResponse, error) {
	resp, err := d.stream.Recv()
	if err != nil {
		return nil, err
	}
	ack := &discoveryv3.DeltaDiscoveryRequest{Node: d.node, TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
	if err := d.stream.Send(ack); err != nil {
		return nil, fmt.Errorf("ack %s: %w", resp.GetTypeUrl(), err)
	}
	return resp, nil
}

// Close ends the stream.
func (d *DeltaClient) Close() { d.conn.Close() }

// SotWClient is a raw state-of-the-world ADS client asking for every
// resource of every type, served grpc-go's variant as DeltaClient is. It
// ACKs each response it returns.
type SotWClient struct {
	conn   *grpc.ClientConn
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
}

// DialSotW opens a state-of-the-world ADS stream to addr and subscribes.
func DialSotW(ctx context.Context, addr, nodeID string) (*SotWClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("sotw stream: %w", err)
	}
	s := &SotWClient{conn: conn, stream: stream, node: &corev3.Node{Id: nodeID, Cluster: "prism-gateway"}}
	for _, t := range Types {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: t}); err != nil {
			conn.Close()
			return nil, fmt.Errorf("subscribe %s: %w", t, err)
		}
	}
	return s, nil
}

// Next returns the next response, after ACKing it.
func (s *SotWClient) Next() (*discoveryv3.DiscoveryResponse, error) {
	resp, err := s.stream.Recv()
	if err != nil {
		return nil, err
	}
	ack := &discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	if err := s.stream.Send(ack); err != nil {
		return nil, fmt.Errorf("ack %s: %w", resp.GetTypeUrl(), err)
	}
	return resp, nil
}

// Close ends the stream.
func (s *SotWClient) Close() { s.conn.Close() }
