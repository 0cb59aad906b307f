package server

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// A gateway subscribes to xDS only as its own node: gateway/gw-1 as node
// gw-1 or gw-1/<replica>; another gateway's node id, a longer name sharing
// the prefix, no node at all, or switching nodes on a later request ends
// the stream PermissionDenied before anything is served for it. Both ADS
// protocols are checked.
func TestXDSNodeIsTheCallersOwn(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	n := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, XDS: true, GatewayAddr: "127.0.0.1:8080"})
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(as(t, p, n.GRPCAddr(), identity.Gateway, "gw-1"))
	node := func(id string) *corev3.Node {
		if id == "" {
			return nil
		}
		return &corev3.Node{Id: id, Cluster: "prism-gateway"}
	}
	// sotw subscribes to listeners as first, and on the answer sends an
	// ACK as then; it returns the code the stream ends with and how many
	// responses came before (the ACK's answer, if any, is never awaited).
	sotw := func(c context.Context, first, then string) (codes.Code, int) {
		s, err := ads.StreamAggregatedResources(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node(first), TypeUrl: resource.ListenerType}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			return status.Code(err), 0
		}
		if then == "" {
			return codes.OK, 1
		}
		ack := &discoveryv3.DiscoveryRequest{Node: node(then), TypeUrl: resource.ListenerType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if err := s.Send(ack); err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		return status.Code(err), 1
	}
	delta := func(c context.Context, first string) (codes.Code, int) {
		s, err := ads.DeltaAggregatedResources(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(first), TypeUrl: resource.ListenerType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			return status.Code(err), 0
		}
		return codes.OK, 1
	}
	cases := []struct {
		name      string
		call      func(context.Context) (codes.Code, int)
		code      codes.Code
		responses int
	}{
		{"sotw as its own node", func(c context.Context) (codes.Code, int) { return sotw(c, "gw-1", "") }, codes.OK, 1},
		{"sotw as a replica of its own node", func(c context.Context) (codes.Code, int) { return sotw(c, "gw-1/replica-0", "") }, codes.OK, 1},
		{"sotw as another gateway", func(c context.Context) (codes.Code, int) { return sotw(c, "gw-2", "") }, codes.PermissionDenied, 0},
		{"sotw as a name it is a prefix of", func(c context.Context) (codes.Code, int) { return sotw(c, "gw-10", "") }, codes.PermissionDenied, 0},
		{"sotw naming no node", func(c context.Context) (codes.Code, int) { return sotw(c, "", "") }, codes.PermissionDenied, 0},
		{"sotw switching to another node", func(c context.Context) (codes.Code, int) { return sotw(c, "gw-1", "gw-2") }, codes.PermissionDenied, 1},
		{"delta as its own node", func(c context.Context) (codes.Code, int) { return delta(c, "gw-1") }, codes.OK, 1},
		{"delta as another gateway", func(c context.Context) (codes.Code, int) { return delta(c, "gw-2") }, codes.PermissionDenied, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			code, responses := tc.call(c)
			if code != tc.code || responses != tc.responses {
				t.Fatalf("ended %s after %d responses, want %s after %d", code, responses, tc.code, tc.responses)
			}
		})
	}
}
