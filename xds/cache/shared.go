package cache

import (
	"fmt"
	"log/slog"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/prism-mesh/prism/xds/translator"
)

// sharedMarshal makes state-of-the-world responses share marshaled
// resources. go-control-plane's snapshot cache marshals every resource once
// per response, so with N clients each change marshals the 2.5 MB route
// table of 10,000 mailboxes N times; here it is marshaled once per type and
// version. A type's version changes whenever any of its resources does, so
// (type, version, name) names one content.
type sharedMarshal struct {
	cachev3.Cache
	log *slog.Logger

	mu sync.Mutex
	// memo holds the latest version only, by type URL; clusters and
	// listeners by type URL and snapshot key, the types whose resources of
	// one name differ between the Envoy and grpc-go snapshots under the same
	// version (upstream TLS, query auth). Envoy's route table under query
	// auth has a name of its own.
	memo map[string]*typeMemo
}

type typeMemo struct {
	version string
	anys    map[string]func() (*anypb.Any, error)
}

func newSharedMarshal(c cachev3.Cache, log *slog.Logger) *sharedMarshal {
	return &sharedMarshal{Cache: c, log: log, memo: map[string]*typeMemo{}}
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
	stop := make(chan struct{})
	go func() {
		select {
		case r := <-inner:
			select {
			case value <- s.wrap(r):
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
	}, nil
}

func (s *sharedMarshal) wrap(r cachev3.Response) cachev3.Response {
	raw, ok := r.(*cachev3.RawResponse)
	if !ok || raw.Heartbeat {
		return r
	}
	return &sharedResponse{RawResponse: raw, s: s}
}

// marshal returns the memoized Any for one resource of typeURL at version,
// served to a client of the given snapshot key.
func (s *sharedMarshal) marshal(typeURL, version, key string, res types.Resource) (*anypb.Any, error) {
	name := cachev3.GetResourceName(res)
	memoKey := typeURL
	if typeURL == resource.ClusterType || typeURL == resource.ListenerType {
		memoKey += "\x00" + key
	}
	s.mu.Lock()
	m := s.memo[memoKey]
	if m == nil || m.version != version {
		m = &typeMemo{version: version, anys: map[string]func() (*anypb.Any, error){}}
		s.memo[memoKey] = m
	}
	build, ok := m.anys[name]
	if !ok {
		build = sync.OnceValues(func() (*anypb.Any, error) {
			b, err := cachev3.MarshalResource(res)
			if err != nil {
				return nil, fmt.Errorf("marshal %s %s: %w", typeURL, name, err)
			}
			// Envoy takes messages of any size, and only Envoy asks for its
			// gateway table (query auth makes it several times grpc-go's).
			envoyOnly := typeURL == resource.RouteType && name == translator.GatewayRouteConfigName
			if len(b) > grpcMaxMessage && !envoyOnly {
				s.log.Error("xds resource exceeds grpc-go's default 4 MiB message limit; proxyless clients will reject it",
					"type", typeURL, "name", name, "version", version, "bytes", len(b))
			}
			return &anypb.Any{TypeUrl: typeURL, Value: b}, nil
		})
		m.anys[name] = build
	}
	s.mu.Unlock()
	return build()
}

// sharedResponse is a RawResponse whose resources come from the memo. Each
// call returns a new DiscoveryResponse (the server sets its nonce); the Anys
// in it are shared and never modified.
type sharedResponse struct {
	*cachev3.RawResponse
	s *sharedMarshal
}

func (r *sharedResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	typeURL := r.GetRequest().GetTypeUrl()
	key := sharedHash{}.ID(r.GetRequest().GetNode())
	raw := r.GetRawResources()
	anys := make([]*anypb.Any, 0, len(raw))
	for _, res := range raw {
		if res.TTL != nil {
			return r.RawResponse.GetDiscoveryResponse()
		}
		a, err := r.s.marshal(typeURL, r.Version, key, res.Resource)
		if err != nil {
			return nil, err
		}
		anys = append(anys, a)
	}
	return &discoveryv3.DiscoveryResponse{VersionInfo: r.Version, Resources: anys, TypeUrl: typeURL}, nil
}
