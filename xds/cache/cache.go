// Package cache holds the xDS resources every client is served and the
// Updater that turns a stream of IR states into snapshots.
//
// All clients share one routing state: the routing table is global. Envoy
// and grpc-go get one snapshot each (the node hash tells them apart by user
// agent), the same resources but for the clusters under upstream TLS, where
// each data plane takes its certificates its own way, and Envoy's gateway
// listener and route table under query auth (translator.Resources.Envoy*). Each resource
// type is versioned with the IR version (the Raft applied index) at which it
// last changed, so admin nodes label the same state alike, a client that
// reconnects to another node is rarely re-sent what it has, and a
// state-of-the-world client is sent only the types that changed. go-control-plane's snapshot
// cache serves state-of-the-world and delta clients from the same snapshot;
// for delta it hashes each resource, so a lease change re-sends only the
// resources whose bytes changed.
package cache

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/translator"
)

// Snapshot keys: every Envoy hashes to EnvoyNodeKey, every other client
// (grpc-go) to NodeKey. Both snapshots hold the same resources except the
// clusters under upstream TLS and the gateway listener and routes under
// query auth (translator.Resources.EnvoyClusters, EnvoyListeners,
// EnvoyRoutes).
const (
	NodeKey      = "prism"
	EnvoyNodeKey = "prism-envoy"
)

// envoyUserAgent is the user_agent_name every Envoy reports in its node.
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
	watcher   *sharedMarshal

	mu      sync.Mutex
	version string
	// prev is the snapshot served under each key.
	prev map[string]*cachev3.Snapshot
	// lastIR and again label a changed state that arrives under the IR
	// version already served ("N.1", "N.2", ...), so SotW clients, which
	// only compare version strings, still receive it.
	lastIR uint64
	again  int
}

// New returns an empty cache. Clients that connect before the first Set wait
// for it.
func New(log *slog.Logger) *Cache {
	// ads=false: in ADS mode the cache answers only requests naming every
	// resource of a type, but grpc-go asks for the one listener it needs
	// (mailbox-query) while Envoy asks for all; both must be served.
	snapshots := cachev3.NewSnapshotCache(false, sharedHash{}, logger{log})
	return &Cache{snapshots: snapshots, watcher: newSharedMarshal(snapshots, log)}
}

// Watcher is what the xDS server serves from.
func (c *Cache) Watcher() cachev3.Cache { return c.watcher }

// Set replaces the served resources with res, labelled version. A resource
// type whose resources are unchanged keeps the version it had, so
// state-of-the-world clients are not re-sent every cluster when only the
// route table changed (delta clients compare each resource anyway).
func (c *Cache) Set(ctx context.Context, version uint64, res *translator.Resources) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := strconv.FormatUint(version, 10)
	label := v
	if c.prev != nil && version == c.lastIR {
		label = v + "." + strconv.Itoa(c.again+1)
	}
	next := map[string]*cachev3.Snapshot{}
	for key, byType := range map[string]map[resource.Type][]types.Resource{NodeKey: res.ByType(), EnvoyNodeKey: res.ForEnvoy()} {
		prev := c.prev[key]
		snap := &cachev3.Snapshot{}
		for typ, items := range byType {
			tv := label
			if prev != nil && sameResources(prev.GetResources(typ), items) {
				tv = prev.GetVersion(typ)
			}
			snap.Resources[cachev3.GetResponseType(typ)] = cachev3.NewResources(tv, items)
		}
		if err := snap.Consistent(); err != nil {
			return fmt.Errorf("snapshot %d for %s: %w", version, key, err)
		}
		next[key] = snap
	}
	// grpc-go's first: the admin's own readiness waits on it.
	for _, key := range []string{NodeKey, EnvoyNodeKey} {
		if err := c.snapshots.SetSnapshot(ctx, key, next[key]); err != nil {
			return fmt.Errorf("set snapshot %d for %s: %w", version, key, err)
		}
	}
	if label != v {
		c.again++
	} else {
		c.again = 0
	}
	c.prev, c.version, c.lastIR = next, v, version
	return nil
}

func sameResources(prev map[string]types.Resource, next []types.Resource) bool {
	if len(prev) != len(next) {
		return false
	}
	for _, r := range next {
		p, ok := prev[cachev3.GetResourceName(r)]
		if !ok || !equal(p.ProtoReflect(), r.ProtoReflect()) {
			return false
		}
	}
	return true
}

// Snapshot is the snapshot being served to grpc-go.
func (c *Cache) Snapshot() (cachev3.ResourceSnapshot, error) { return c.snapshots.GetSnapshot(NodeKey) }

// EnvoySnapshot is the snapshot being served to Envoy.
func (c *Cache) EnvoySnapshot() (cachev3.ResourceSnapshot, error) {
	return c.snapshots.GetSnapshot(EnvoyNodeKey)
}

// Version is the IR version being served, or "" before the first Set.
func (c *Cache) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// logger adapts slog to go-control-plane's logger interface.
type logger struct{ l *slog.Logger }

func (l logger) Debugf(format string, args ...any) { l.l.Debug(fmt.Sprintf(format, args...)) }
func (l logger) Infof(format string, args ...any)  { l.l.Info(fmt.Sprintf(format, args...)) }
func (l logger) Warnf(format string, args ...any)  { l.l.Warn(fmt.Sprintf(format, args...)) }
func (l logger) Errorf(format string, args ...any) { l.l.Error(fmt.Sprintf(format, args...)) }
