package server

import (
	"bytes"
	"slices"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/anypb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/xdstest"
)

const (
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	endpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// The node serves the proxies over ADS (issue 13): a registered proxy has
// its cluster proxy/P, whose endpoint is the runner's registered address; a
// lease granted, released and granted again leaves the proxy routes as they
// were; a re-registration at a new address moves the endpoint.
func TestXDSFollowsProxies(t *testing.T) {
	t.Parallel()
	n, cp, _, _ := startSingle(t)
	c := ctx(t)
	placeOn(t, c, cp, "p1", "runner-a", "audit")
	ads, err := xdstest.DialSotW(c, n.GRPCAddr(), "gateway-test")
	if err != nil {
		t.Fatal(err)
	}
	defer ads.Close()
	// await reads responses until, for every want, one of its type has a
	// resource it likes (in any order: the cache sends each type alone).
	type want struct {
		what, typeURL string
		ok            func(*anypb.Any) bool
	}
	await := func(wants ...want) {
		t.Helper()
		for len(wants) > 0 {
			resp, err := ads.Next()
			if err != nil {
				t.Fatalf("waiting for %s: %v", wants[0].what, err)
			}
			wants = slices.DeleteFunc(wants, func(w want) bool {
				return resp.GetTypeUrl() == w.typeURL && slices.ContainsFunc(resp.GetResources(), w.ok)
			})
		}
	}
	endpointAt := func(port uint32) func(*anypb.Any) bool {
		return func(r *anypb.Any) bool {
			la := &endpointv3.ClusterLoadAssignment{}
			if err := r.UnmarshalTo(la); err != nil || la.GetClusterName() != "proxy/p1" {
				return false
			}
			for _, l := range la.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					if e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue() == port {
						return true
					}
				}
			}
			return false
		}
	}
	await(want{"proxy/p1's cluster", clusterType, func(r *anypb.Any) bool { return bytes.Contains(r.GetValue(), []byte("proxy/p1")) }},
		want{"proxy/p1's endpoint", endpointType, endpointAt(9000)})

	before := n.FSM.ProxyRoutesIndex()
	for _, step := range []func() error{
		func() error {
			_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "audit@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:9000"})
			return err
		},
		func() error {
			_, err := cp.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "audit@p1", RunnerId: "runner-a"})
			return err
		},
		func() error {
			_, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "audit@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:9000"})
			return err
		},
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if after := n.FSM.ProxyRoutesIndex(); after != before {
		t.Fatalf("lease changes moved the proxy routes index %d -> %d", before, after)
	}
	reg := &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9100", RunnerId: "runner-a"}
	if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: reg}); err != nil {
		t.Fatal(err)
	}
	await(want{"proxy/p1's endpoint at its new address", endpointType, endpointAt(9100)})
}
