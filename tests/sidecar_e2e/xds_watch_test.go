package sidecare2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/xdstest"
)

// xdsUpdate is one delta-ADS response as the gateway would read it.
type xdsUpdate struct {
	at      time.Time
	typ     string
	names   []string
	removed []string
}

func (u xdsUpdate) String() string {
	return fmt.Sprintf("%s %s sent %v removed %v", u.at.Format("15:04:05.000"), u.typ, u.names, u.removed)
}

// xdsWatch is a delta-ADS stream to an admin node with the gateway's
// identity, subscribed to every resource of every type, recording every
// response it ACKs.
type xdsWatch struct {
	mu      sync.Mutex
	updates []xdsUpdate
	err     error
}

// watchXDS starts an xdsWatch on n until the test ends.
func watchXDS(t *testing.T, n *e2e.AdminNode) *xdsWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const gateway = "gateway-1" // the node id must name the caller's identity
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(n.ConnAs(identity.Gateway, gateway)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatalf("delta ADS: %v", err)
	}
	node := &corev3.Node{Id: gateway, Cluster: "prism-gateway"}
	for _, typ := range xdstest.Types {
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typ, ResourceNamesSubscribe: []string{"*"}}); err != nil {
			t.Fatalf("subscribe %s: %v", typ, err)
		}
	}
	w := &xdsWatch{}
	go func() {
		for {
			resp, err := stream.Recv()
			if err == nil {
				err = stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
			}
			w.mu.Lock()
			if err != nil {
				if ctx.Err() == nil {
					w.err = err
				}
				w.mu.Unlock()
				return
			}
			u := xdsUpdate{at: time.Now(), typ: resp.GetTypeUrl()[strings.LastIndexByte(resp.GetTypeUrl(), '.')+1:], removed: resp.GetRemovedResources()}
			for _, r := range resp.GetResources() {
				u.names = append(u.names, r.GetName())
			}
			w.updates = append(w.updates, u)
			w.mu.Unlock()
		}
	}()
	return w
}

// since are the responses received at or after from, and the stream's
// error if it broke.
func (w *xdsWatch) since(from time.Time) ([]xdsUpdate, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []xdsUpdate
	for _, u := range w.updates {
		if !u.at.Before(from) {
			out = append(out, u)
		}
	}
	return out, w.err
}

// count is how many responses the stream has received, and its error if
// it broke.
func (w *xdsWatch) count() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.updates), w.err
}
