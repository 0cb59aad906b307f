package cache

import (
	"context"
	"io"
	"log/slog"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/prism-mesh/prism/xds/translator"
)

// TestSotWResponsesShareMarshaledResources: two clients asking for the route
// table at the same version get the very same marshaled bytes, equal to what
// go-control-plane would have built, each in its own response.
func TestSotWResponsesShareMarshaledResources(t *testing.T) {
	t.Parallel()
	c := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	res, err := translator.Translate(state(4, 4))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(context.Background(), 4, res); err != nil {
		t.Fatal(err)
	}
	get := func(node string) *discoveryv3.DiscoveryResponse {
		t.Helper()
		return sotw(t, c, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resource.RouteType, ResourceNames: []string{translator.RouteConfigName}})
	}
	a, b := get("gw-1"), get("gw-2")
	if a == b {
		t.Fatal("two clients got the same response object; the server sets a nonce on each")
	}
	if len(a.GetResources()) != 1 || a.GetResources()[0] != b.GetResources()[0] {
		t.Fatal("the route table was marshaled once per client")
	}
	var table types.Resource
	for _, rc := range res.Routes {
		if rc.GetName() == translator.RouteConfigName {
			table = rc
		}
	}
	want, err := cachev3.MarshalResource(table)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.GetResources()[0]; !proto.Equal(got, &anypb.Any{TypeUrl: resource.RouteType, Value: want}) {
		t.Fatal("shared bytes differ from go-control-plane's")
	}
	if a.GetVersionInfo() != "4" || a.GetTypeUrl() != resource.RouteType {
		t.Fatalf("response version %q type %q", a.GetVersionInfo(), a.GetTypeUrl())
	}
}
