// Package xds is an admin node's xDS control plane: the routing IR (xds/ir)
// goes in, Envoy and grpc-go clients get listeners, routes, clusters and
// endpoints over ADS (state of the world and delta). The stages live in
// subpackages, in pipeline order: ir → translator → cache → server; this
// package wires them the way an admin node runs them.
//
//	cp := xds.New(ctx, xds.Config{Registerer: reg, Log: log})
//	cp.Register(grpcServer)  // ADS and the not-found MailboxQuery
//	go cp.Run(ctx)
//	go cp.Follow(ctx, fsm, xds.FollowConfig{...}) // or, by hand, whenever
//	// fsm.ProxyRoutesIndex() moves:
//	cp.Update(ir.FromAdmin(ir.AdminState{Proxies: p, Index: idx, ...}))
//
// Routes are per proxy (see xds/translator): lease changes put nothing on
// the wire, and namespaces are looked up on the admin nodes (xds/lookup,
// registered beside this by admin/server).
package xds

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/xds/cache"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/notfound"
	"github.com/prism-mesh/prism/xds/server"
)

// Config configures New; zero fields take defaults.
type Config struct {
	// Registerer receives the xDS metrics; nil registers none.
	Registerer prometheus.Registerer
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Debounce and MaxDelay bound how routing changes are coalesced
	// (cache.DefaultDebounce, cache.DefaultMaxDelay).
	Debounce, MaxDelay time.Duration
}

// ControlPlane serves the latest IR it was given.
type ControlPlane struct {
	cache   *cache.Cache
	updater *cache.Updater
	server  *server.Server
}

// New returns a control plane whose streams end with ctx.
func New(ctx context.Context, cfg Config) *ControlPlane {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	c := cache.New(log)
	u := cache.NewUpdater(c, cache.UpdaterConfig{
		Debounce: cfg.Debounce, MaxDelay: cfg.MaxDelay, Log: log, Registerer: cfg.Registerer,
	})
	return &ControlPlane{
		cache:   c,
		updater: u,
		server:  server.New(ctx, server.Config{Cache: c, Stamps: u, Registerer: cfg.Registerer, Log: log}),
	}
}

// Register adds ADS and the not-found MailboxQuery service to g. The node's
// address on g belongs in the IR's Admins list.
func (cp *ControlPlane) Register(g *grpc.Server) {
	cp.server.Register(g)
	notfound.Register(g)
}

// Update hands over a new routing state; it never blocks. Calling it with an
// unchanged state is cheap and pushes nothing. The returned generation is
// what Processed waits for.
func (cp *ControlPlane) Update(x *ir.IR) uint64 { return cp.updater.Update(x) }

// Processed waits until the update of generation gen (or a later one) has
// been served, skipped as unchanged, or refused.
func (cp *ControlPlane) Processed(ctx context.Context, gen uint64) error {
	return cp.updater.Processed(ctx, gen)
}

// Run translates and publishes states until ctx ends.
func (cp *ControlPlane) Run(ctx context.Context) error { return cp.updater.Run(ctx) }

// Version is the IR version being served, "" before the first.
func (cp *ControlPlane) Version() string { return cp.cache.Version() }
