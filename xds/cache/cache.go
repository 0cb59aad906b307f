// Package cache holds the xDS resources every client is served and the
// Updater that turns a stream of IR states into snapshots.
//
// All clients, Envoy and grpc-go alike, share one snapshot: the routing table
// is global, so the node hash maps every node to the same key. The snapshot
// version is the IR version (the Raft applied index), so every admin node
// labels the same state with the same version and a client that reconnects to
// another node is not sent what it already has. go-control-plane's snapshot
// cache serves state-of-the-world and delta clients from the same snapshot;
// for delta it hashes each resource, so a lease change re-sends only the
// resources whose bytes changed.
package cache

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/prism-mesh/prism/xds/translator"
)

// NodeKey is the snapshot key every node hashes to.
const NodeKey = "prism"

type sharedHash struct{}

func (sharedHash) ID(*corev3.Node) string { return NodeKey }

// Cache is the snapshot every xDS client is served.
type Cache struct {
	snapshots cachev3.SnapshotCache
}

// New returns an empty cache. Clients that connect before the first Set wait
// for it.
func New(log *slog.Logger) *Cache {
	return &Cache{snapshots: cachev3.NewSnapshotCache(true, sharedHash{}, logger{log})}
}

// Watcher is what the xDS server serves from.
func (c *Cache) Watcher() cachev3.Cache { return c.snapshots }

// Set replaces the served resources with res, labelled version.
func (c *Cache) Set(ctx context.Context, version uint64, res *translator.Resources) error {
	snap, err := cachev3.NewSnapshot(strconv.FormatUint(version, 10), res.ByType())
	if err != nil {
		return fmt.Errorf("snapshot %d: %w", version, err)
	}
	if err := snap.Consistent(); err != nil {
		return fmt.Errorf("snapshot %d: %w", version, err)
	}
	if err := c.snapshots.SetSnapshot(ctx, NodeKey, snap); err != nil {
		return fmt.Errorf("set snapshot %d: %w", version, err)
	}
	return nil
}

// Snapshot is the snapshot being served.
func (c *Cache) Snapshot() (cachev3.ResourceSnapshot, error) { return c.snapshots.GetSnapshot(NodeKey) }

// Version is the version being served, or "" before the first Set.
func (c *Cache) Version() string {
	snap, err := c.snapshots.GetSnapshot(NodeKey)
	if err != nil {
		return ""
	}
	// Every type carries the same version.
	return snap.GetVersion(resource.RouteType)
}

// logger adapts slog to go-control-plane's logger interface.
type logger struct{ l *slog.Logger }

func (l logger) Debugf(format string, args ...any) { l.l.Debug(fmt.Sprintf(format, args...)) }
func (l logger) Infof(format string, args ...any)  { l.l.Info(fmt.Sprintf(format, args...)) }
func (l logger) Warnf(format string, args ...any)  { l.l.Warn(fmt.Sprintf(format, args...)) }
func (l logger) Errorf(format string, args ...any) { l.l.Error(fmt.Sprintf(format, args...)) }
