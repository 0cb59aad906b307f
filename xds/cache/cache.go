// Package cache holds the xDS resources every client is served and the
// Updater that turns a stream of IR states into snapshots.
//
// All clients share one routing state: the routing table is global. Envoy
// and grpc-go get one snapshot each (the node hash tells them apart by user
// agent): the same endpoints, each its own listener and the route table it
// names (Envoy the socket listener, grpc-go the API listener: Envoy skips
// an api_listener with a warning, and a client binds no socket), and each
// its own clusters (translator.Resources.ForEnvoy, ForGRPC).
// Each resource type is versioned with the IR version (the Raft applied
// index) at which it last changed, so admin nodes label the same state
// alike, and a state-of-the-world client is sent only the types that
// changed.
//
// Listeners and clusters are served from go-control-plane's snapshot cache:
// state of the world must send them whole, and a client that reconnects to
// another node at the same version is not re-sent them. Routes and
// endpoints are served resource by resource, one go-control-plane
// LinearCache per type and snapshot key behind a MuxCache: a runner moving
// sends its proxy's ClusterLoadAssignment alone, in state of the world (which
// lets EDS and RDS responses carry only what changed; grpc-go asks for each
// by name and keeps what a response leaves out) as in delta. A state-of-the-
// world stream that reconnects is sent the routes and endpoints it asks for
// again: only delta carries what a client already holds. Delta versions each
// resource by a hash of its bytes, in either cache, so a delta client that
// reconnects to another node is sent only what differs.
package cache

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/translator"
)

// Snapshot keys: every Envoy hashes to EnvoyNodeKey, every other client
// (grpc-go) to NodeKey; translator.Resources.ForEnvoy and ForGRPC are what
// each is served.
const (
	NodeKey      = "prism"
	EnvoyNodeKey = "prism-envoy"
)

// envoyUserAgent is the user_agent_name every Envoy reports in its node;
// grpc-go reports "gRPC Go", whatever its bootstrap says (the bootstrap sets
// the node's id, cluster, metadata and locality, not its user agent).
const envoyUserAgent = "envoy"

type sharedHash struct{}

func (sharedHash) ID(n *corev3.Node) string {
	if n.GetUserAgentName() == envoyUserAgent {
		return EnvoyNodeKey
	}
	return NodeKey
}

// Cache is the snapshot every xDS client is served.
type Cache struct {
	snapshots cachev3.SnapshotCache
	// linear serves the per-resource types, by snapshot key and type URL.
	linear  map[string]map[string]*perResource
	watcher *sharedMarshal

	mu      sync.Mutex
	version string
	// prev is the snapshot served under each key: the per-resource types'
	// resources too, which the snapshot cache is not handed (see apply).
	prev map[string]*cachev3.Snapshot
	// lastIR and again label a changed state that arrives under the IR
	// version already served ("N.1", "N.2", ...), so SotW clients, which
	// only compare version strings, still receive it.
	lastIR uint64
	again  int
}

// keys are the snapshot keys, grpc-go's first: the admin's own readiness
// waits on it.
var keys = []string{NodeKey, EnvoyNodeKey}

// New returns an empty cache. Clients that connect before the first Set wait
// for it.
func New(log *slog.Logger) *Cache {
	// ads=false: in ADS mode the cache answers only requests naming every
	// resource of a type, but grpc-go asks for the one listener it needs
	// (mailbox-query) while Envoy asks for all; both must be served.
	snapshots := cachev3.NewSnapshotCache(false, sharedHash{}, logger{log})
	caches := map[string]cachev3.Cache{}
	linear := map[string]map[string]*perResource{}
	for _, key := range keys {
		caches[key] = snapshots
		linear[key] = map[string]*perResource{}
		for _, typ := range perResourceTypes {
			p := newPerResource(typ, linearLogger{logger{log}})
			linear[key][typ] = p
			caches[muxKey(key, typ)] = p
		}
	}
	classify := func(node *corev3.Node, typeURL string) string {
		key := sharedHash{}.ID(node)
		if isPerResource(typeURL) {
			return muxKey(key, typeURL)
		}
		return key
	}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return classify(r.GetNode(), r.GetTypeUrl()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return classify(r.GetNode(), r.GetTypeUrl()) },
		Caches:        caches,
	}
	return &Cache{snapshots: snapshots, linear: linear, watcher: newSharedMarshal(mux, linear, log)}
}

func muxKey(key, typeURL string) string { return key + " " + typeURL }

// Watcher is what the xDS server serves from.
func (c *Cache) Watcher() cachev3.Cache { return c.watcher }

// servedTypes are the types every snapshot holds, even when empty, so a
// client always has an answer for each.
var servedTypes = []resource.Type{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// perResourceUpdate is what one Set changes in one per-resource cache.
type perResourceUpdate struct {
	cache   *perResource
	changed map[string]types.Resource
	removed []string
}

// Set replaces the served resources with res, labelled version. A resource
// type whose resources are unchanged keeps the version it had, so
// state-of-the-world clients are not re-sent every cluster when only the
// route table changed. Routes and endpoints go out resource by resource:
// a client is sent the ones that changed, in either protocol.
func (c *Cache) Set(ctx context.Context, version uint64, res *translator.Resources) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := strconv.FormatUint(version, 10)
	label := v
	if c.prev != nil && version == c.lastIR {
		label = v + "." + strconv.Itoa(c.again+1)
	}
	next := map[string]*cachev3.Snapshot{}
	var updates []perResourceUpdate
	// snapshotChanged: listeners or clusters changed for some key, which
	// the snapshot cache must be told.
	snapshotChanged := c.prev == nil
	for _, key := range keys {
		byType := res.ForGRPC()
		if key == EnvoyNodeKey {
			byType = res.ForEnvoy()
		}
		prev := c.prev[key]
		snap := &cachev3.Snapshot{}
		for _, typ := range servedTypes {
			i := cachev3.GetResponseType(typ)
			items := byType[typ]
			var served cachev3.Resources
			if prev != nil {
				served = prev.Resources[i]
			}
			if p := c.linear[key][typ]; p != nil {
				held := served.Items
				if prev == nil {
					// The first Set, or one after a failed one: compare
					// with what the cache really holds.
					held = p.held()
				}
				changed, removed, merged := diff(held, items)
				if prev != nil && len(changed) == 0 && len(removed) == 0 {
					snap.Resources[i] = served
					continue
				}
				snap.Resources[i] = cachev3.NewResources(label, merged)
				if len(changed) > 0 || len(removed) > 0 {
					updates = append(updates, perResourceUpdate{cache: p, changed: changed, removed: removed})
				}
				continue
			}
			if prev != nil && sameResources(served.Items, items) {
				snap.Resources[i] = served
				continue
			}
			snap.Resources[i] = cachev3.NewResources(label, items)
			snapshotChanged = true
		}
		if err := consistent(snap); err != nil {
			return fmt.Errorf("snapshot %d for %s: %w", version, key, err)
		}
		next[key] = snap
	}
	if err := c.apply(ctx, next, updates, snapshotChanged, label); err != nil {
		// Partly applied: the next Set compares with what each cache
		// holds, not with a snapshot that was not all served.
		c.prev = nil
		return fmt.Errorf("set %d: %w", version, err)
	}
	if label != v {
		c.again++
	} else {
		c.again = 0
	}
	c.prev, c.version, c.lastIR = next, v, version
	for _, key := range keys {
		c.watcher.prune(key, next[key])
	}
	return nil
}

// apply serves next. Routes and endpoints arrive before the listeners and
// clusters that name them and leave after, so a client never waits on a
// resource the control plane has not published yet.
//
// The snapshot cache serves listeners and clusters alone, so it is handed
// those alone, and only when they changed: each SetSnapshot with a delta
// client connected hashes every resource of the new snapshot (go-control-
// plane's version map), which at 1,000 proxies was most of a runner move's
// remaining admin CPU although a runner move changes neither.
func (c *Cache) apply(ctx context.Context, next map[string]*cachev3.Snapshot, updates []perResourceUpdate, snapshotChanged bool, label string) error {
	for _, u := range updates {
		if len(u.changed) == 0 {
			continue
		}
		if err := u.cache.update(label, u.changed, nil); err != nil {
			return err
		}
	}
	for _, key := range keys {
		if !snapshotChanged {
			break
		}
		served := *next[key]
		for _, typ := range perResourceTypes {
			served.Resources[cachev3.GetResponseType(typ)] = cachev3.Resources{}
		}
		if err := c.snapshots.SetSnapshot(ctx, key, &served); err != nil {
			return fmt.Errorf("set snapshot for %s: %w", key, err)
		}
	}
	for _, u := range updates {
		if len(u.removed) == 0 {
			continue
		}
		if err := u.cache.update(label, nil, u.removed); err != nil {
			return err
		}
	}
	return nil
}

func sameResources(prev map[string]types.ResourceWithTTL, next []types.Resource) bool {
	if len(prev) != len(next) {
		return false
	}
	for _, r := range next {
		p, ok := prev[cachev3.GetResourceName(r)]
		if !ok || !equal(p.Resource.ProtoReflect(), r.ProtoReflect()) {
			return false
		}
	}
	return true
}

// consistent is snap.Consistent counting the route tables API listeners
// name as referenced: go-control-plane counts socket listeners only, and
// grpc-go's table is named by its API listener alone.
func consistent(snap *cachev3.Snapshot) error {
	api := map[string]bool{}
	for _, r := range snap.Resources[types.Listener].Items {
		a := r.Resource.(*listenerv3.Listener).GetApiListener().GetApiListener()
		if a == nil {
			continue
		}
		hcm := &hcmv3.HttpConnectionManager{}
		if err := a.UnmarshalTo(hcm); err != nil {
			return fmt.Errorf("API listener %s: %w", cachev3.GetResourceName(r.Resource), err)
		}
		api[hcm.GetRds().GetRouteConfigName()] = true
	}
	if len(api) == 0 {
		return snap.Consistent()
	}
	socket := cachev3.GetAllResourceReferences(snap.Resources)[resource.RouteType]
	routes := snap.Resources[types.Route]
	c := *snap
	c.Resources[types.Route] = cachev3.Resources{Version: routes.Version, Items: map[string]types.ResourceWithTTL{}}
	for name, r := range routes.Items {
		if !api[name] || socket[name] {
			c.Resources[types.Route].Items[name] = r
		}
	}
	return c.Consistent()
}

// Snapshot is every resource being served to grpc-go.
func (c *Cache) Snapshot() (cachev3.ResourceSnapshot, error) { return c.snapshot(NodeKey) }

// EnvoySnapshot is every resource being served to Envoy.
func (c *Cache) EnvoySnapshot() (cachev3.ResourceSnapshot, error) { return c.snapshot(EnvoyNodeKey) }

func (c *Cache) snapshot(key string) (cachev3.ResourceSnapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.prev[key]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("no snapshot served for %s", key)
}

// Version is the IR version being served, or "" before the first Set.
func (c *Cache) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// logger adapts slog to go-control-plane's logger interface. It formats
// only what the handler takes: go-control-plane logs every watch with the
// names it asks for, and a grpc-go client at 1,000 proxies asks for 1,000
// endpoints on every ACK, so formatting debug lines nobody keeps cost more
// than the rest of a runner move.
type logger struct{ l *slog.Logger }

func (l logger) logf(level slog.Level, format string, args ...any) {
	if !l.l.Enabled(context.Background(), level) {
		return
	}
	l.l.Log(context.Background(), level, fmt.Sprintf(format, args...))
}

func (l logger) Debugf(format string, args ...any) { l.logf(slog.LevelDebug, format, args...) }
func (l logger) Infof(format string, args ...any)  { l.logf(slog.LevelInfo, format, args...) }
func (l logger) Warnf(format string, args ...any)  { l.logf(slog.LevelWarn, format, args...) }
func (l logger) Errorf(format string, args ...any) { l.logf(slog.LevelError, format, args...) }

// linearLogger demotes a LinearCache's info logs, one per watch opened, to
// debug.
type linearLogger struct{ logger }

func (l linearLogger) Infof(format string, args ...any) { l.Debugf(format, args...) }
