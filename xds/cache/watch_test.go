package cache

import (
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
)

// sotw is the cache's state-of-the-world answer to req, as a new stream gets
// it (a wildcard subscription when req names no resources).
func sotw(t *testing.T, c *Cache, req *discoveryv3.DiscoveryRequest) *discoveryv3.DiscoveryResponse {
	t.Helper()
	ch := make(chan cachev3.Response, 1)
	names := req.GetResourceNames()
	cancel, err := c.Watcher().CreateWatch(req, stream.NewSotwSubscription(names, len(names) == 0), ch)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	select {
	case r := <-ch:
		out, err := r.GetDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		return out
	case <-time.After(10 * time.Second):
		t.Fatal("no response")
		return nil
	}
}
