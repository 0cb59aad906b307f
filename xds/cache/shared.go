package cache

import (
	"fmt"
	"log/slog"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// sharedMarshal stands between the caches and the xDS server. It makes
// state-of-the-world responses share marshaled resources: go-control-plane
// builds a new Any for every resource of every response, so with N clients
// each change would marshal what it sends N times; here each resource
// object is marshaled once per snapshot key. The caches keep the object of
// an unchanged resource from one Set to the next, so an object names one
// content. It also labels the per-resource types' responses (both
// protocols) with the IR label their LinearCache version stands for.
type sharedMarshal struct {
	cachev3.Cache
	linear map[string]map[string]*perResource
	log    *slog.Logger

	mu sync.Mutex
	// memo holds, by type URL and snapshot key, the marshaled form of the
	// resources being served. Clusters of one name differ between the
	// Envoy and grpc-go snapshots (upstream TLS), so the key is part of
	// it; prune drops what is no longer served.
	memo map[memoKey]map[string]*memoEntry
}

type memoKey struct{ typeURL, key string }

type memoEntry struct {
	res   types.Resource
	build func() (*anypb.Any, error)
}

func newSharedMarshal(c cachev3.Cache, linear map[string]map[string]*perResource, log *slog.Logger) *sharedMarshal {
	return &sharedMarshal{Cache: c, linear: linear, log: log, memo: map[memoKey]map[string]*memoEntry{}}
}

// grpcMaxMessage is grpc-go's default receive limit, which its xDS client
// does not raise: a bigger resource is refused by every proxyless client.
const grpcMaxMessage = 4 << 20

// CreateWatch forwards the cache's one response for the watch, wrapped.
func (s *sharedMarshal) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, value chan cachev3.Response) (func(), error) {
	inner := make(chan cachev3.Response, 1)
	cancel, err := s.Cache.CreateWatch(req, sub, inner)
	if err != nil {
		return cancel, err
	}
	return forward(inner, value, s.wrap, cancel), nil
}

// CreateDeltaWatch relabels the per-resource types' responses; the snapshot
// cache's already carry the IR label.
func (s *sharedMarshal) CreateDeltaWatch(req *cachev3.DeltaRequest, sub cachev3.Subscription, value chan cachev3.DeltaResponse) (func(), error) {
	p := s.linear[sharedHash{}.ID(req.GetNode())][req.GetTypeUrl()]
	if p == nil {
		return s.Cache.CreateDeltaWatch(req, sub, value)
	}
	inner := make(chan cachev3.DeltaResponse, 1)
	cancel, err := s.Cache.CreateDeltaWatch(req, sub, inner)
	if err != nil {
		return cancel, err
	}
	relabel := func(r cachev3.DeltaResponse) cachev3.DeltaResponse {
		return &labelledDelta{DeltaResponse: r, version: p.label(r.GetResponseVersion())}
	}
	return forward(inner, value, relabel, cancel), nil
}

// forward hands the one response of a watch on, transformed by wrap, until
// the returned cancel is called.
func forward[R any](inner <-chan R, value chan<- R, wrap func(R) R, cancel func()) func() {
	stop := make(chan struct{})
	go func() {
		select {
		case r := <-inner:
			select {
			case value <- wrap(r):
			case <-stop:
			}
		case <-stop:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			if cancel != nil {
				cancel()
			}
		})
	}
}

func (s *sharedMarshal) wrap(r cachev3.Response) cachev3.Response {
	raw, ok := r.(*cachev3.RawResponse)
	if !ok || raw.Heartbeat {
		return r
	}
	key := sharedHash{}.ID(raw.GetRequest().GetNode())
	version := raw.Version
	if p := s.linear[key][raw.GetRequest().GetTypeUrl()]; p != nil {
		version = p.label(version)
	}
	return &sharedResponse{RawResponse: raw, s: s, key: key, version: version}
}

// marshal returns the memoized Any for one resource of typeURL served to a
// client of the given snapshot key.
func (s *sharedMarshal) marshal(typeURL, key string, res types.Resource) (*anypb.Any, error) {
	name := cachev3.GetResourceName(res)
	k := memoKey{typeURL, key}
	s.mu.Lock()
	m := s.memo[k]
	if m == nil {
		m = map[string]*memoEntry{}
		s.memo[k] = m
	}
	e := m[name]
	if e == nil || e.res != res {
		e = &memoEntry{res: res, build: sync.OnceValues(func() (*anypb.Any, error) {
			b, err := cachev3.MarshalResource(res)
			if err != nil {
				return nil, fmt.Errorf("marshal %s %s: %w", typeURL, name, err)
			}
			// Envoy takes messages of any size (query auth makes its
			// gateway table several times grpc-go's).
			if len(b) > grpcMaxMessage && key == NodeKey {
				s.log.Error("xds resource exceeds grpc-go's default 4 MiB message limit; proxyless clients will reject it",
					"type", typeURL, "name", name, "bytes", len(b))
			}
			return &anypb.Any{TypeUrl: typeURL, Value: b}, nil
		})}
		m[name] = e
	}
	s.mu.Unlock()
	return e.build()
}

// prune forgets the marshaled resources snap no longer serves under key.
func (s *sharedMarshal) prune(key string, snap *cachev3.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, typ := range servedTypes {
		m := s.memo[memoKey{typ, key}]
		served := snap.Resources[cachev3.GetResponseType(typ)].Items
		for name, e := range m {
			if r, ok := served[name]; !ok || r.Resource != e.res {
				delete(m, name)
			}
		}
	}
}

// sharedResponse is a RawResponse whose resources come from the memo. Each
// call returns a new DiscoveryResponse (the server sets its nonce); the Anys
// in it are shared and never modified.
type sharedResponse struct {
	*cachev3.RawResponse
	s       *sharedMarshal
	key     string
	version string
}

func (r *sharedResponse) GetResponseVersion() string { return r.version }

func (r *sharedResponse) GetVersion() (string, error) { return r.version, nil }

func (r *sharedResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	typeURL := r.GetRequest().GetTypeUrl()
	raw := r.GetRawResources()
	anys := make([]*anypb.Any, 0, len(raw))
	for _, res := range raw {
		if res.TTL != nil {
			return r.RawResponse.GetDiscoveryResponse()
		}
		a, err := r.s.marshal(typeURL, r.key, res.Resource)
		if err != nil {
			return nil, err
		}
		anys = append(anys, a)
	}
	return &discoveryv3.DiscoveryResponse{VersionInfo: r.version, Resources: anys, TypeUrl: typeURL}, nil
}

// labelledDelta is a per-resource type's delta response under its IR label.
type labelledDelta struct {
	cachev3.DeltaResponse
	version string
}

func (r *labelledDelta) GetResponseVersion() string { return r.version }

func (r *labelledDelta) GetSystemVersion() (string, error) { return r.version, nil }

// GetDeltaDiscoveryResponse returns a new response each call: the server
// sets its nonce, and the wrapped one is kept by the response it came from.
func (r *labelledDelta) GetDeltaDiscoveryResponse() (*discoveryv3.DeltaDiscoveryResponse, error) {
	out, err := r.DeltaResponse.GetDeltaDiscoveryResponse()
	if err != nil {
		return nil, err
	}
	return &discoveryv3.DeltaDiscoveryResponse{
		SystemVersionInfo: r.version,
		Resources:         out.GetResources(),
		TypeUrl:           out.GetTypeUrl(),
		RemovedResources:  out.GetRemovedResources(),
		ControlPlane:      out.GetControlPlane(),
	}, nil
}
