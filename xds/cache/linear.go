package cache

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/log"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// perResourceTypes are the types served resource by resource. State of the
// world lets a response for them carry only the resources that changed
// (LDS and CDS responses must be complete, so those stay in the snapshot
// cache): a runner moving sends its proxy's ClusterLoadAssignment alone,
// not all of them.
var perResourceTypes = []resource.Type{resource.RouteType, resource.EndpointType}

func isPerResource(typeURL string) bool {
	return typeURL == resource.RouteType || typeURL == resource.EndpointType
}

// labelsKept bounds the LinearCache version → label map. A response is
// labelled as it goes out, at most a Set or two after the cache built it;
// an older one falls back to the latest label, which is only ever newer.
const labelsKept = 16

// perResource is one type of one snapshot key, served by a go-control-plane
// LinearCache. The LinearCache numbers its own versions (one per update);
// clients are shown the IR label of the Set that made the update instead,
// the same label the snapshot carries for the type, so versions mean the
// same on every admin node and the server's checks and push latency, which
// read them as Raft indexes, hold for these types too.
type perResource struct {
	*cachev3.LinearCache

	// Only Set updates the LinearCache (under Cache.mu), so it knows the
	// LinearCache's next version; mu guards labels against the server's
	// goroutines labelling responses.
	mu      sync.Mutex
	updates uint64
	labels  map[string]string
	order   []string
	latest  string
}

func newPerResource(typeURL string, l log.Logger) *perResource {
	return &perResource{LinearCache: cachev3.NewLinearCache(typeURL, cachev3.WithLogger(l)), labels: map[string]string{}}
}

// update changes and removes resources, labelled label. It must not be
// called with nothing to do: every call is a version clients are sent.
func (p *perResource) update(label string, changed map[string]types.Resource, removed []string) error {
	p.mu.Lock()
	p.updates++
	v := strconv.FormatUint(p.updates, 10)
	p.labels[v] = label
	p.order = append(p.order, v)
	for len(p.order) > labelsKept {
		delete(p.labels, p.order[0])
		p.order = p.order[1:]
	}
	p.latest = label
	p.mu.Unlock()
	if err := p.UpdateResources(changed, removed); err != nil {
		return fmt.Errorf("update %d resources, remove %d: %w", len(changed), len(removed), err)
	}
	return nil
}

// held is what the LinearCache serves, for a Set with no snapshot to
// compare with.
func (p *perResource) held() map[string]types.ResourceWithTTL {
	out := map[string]types.ResourceWithTTL{}
	for name, r := range p.GetResources() {
		out[name] = types.ResourceWithTTL{Resource: r}
	}
	return out
}

// label is the IR label of the LinearCache's version v.
func (p *perResource) label(v string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.labels[v]; ok {
		return l
	}
	return p.latest
}

// diff compares the resources served with next: the ones to send (new or
// changed), the names to remove, and the resources to serve, where an
// unchanged resource keeps its served object so marshaled bytes stay shared.
func diff(served map[string]types.ResourceWithTTL, next []types.Resource) (changed map[string]types.Resource, removed []string, merged []types.Resource) {
	changed = map[string]types.Resource{}
	merged = make([]types.Resource, 0, len(next))
	names := make(map[string]struct{}, len(next))
	for _, r := range next {
		name := cachev3.GetResourceName(r)
		names[name] = struct{}{}
		if p, ok := served[name]; ok && equal(p.Resource.ProtoReflect(), r.ProtoReflect()) {
			merged = append(merged, p.Resource)
			continue
		}
		changed[name] = r
		merged = append(merged, r)
	}
	for name := range served {
		if _, ok := names[name]; !ok {
			removed = append(removed, name)
		}
	}
	return changed, removed, merged
}
