package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/admin/audit"
	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/internal/debughttp"
	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/lookup"
)

// NodeConfig is one complete admin node: Raft member, FSM, lessor, gRPC and
// HTTP servers.
type NodeConfig struct {
	Raft raftnode.Config
	// GRPCAddr and HTTPAddr are listen addresses ("127.0.0.1:0" picks a port);
	// an empty HTTPAddr serves no HTTP.
	GRPCAddr string
	HTTPAddr string
	// Pprof also serves Go's runtime profiles and runtime/metrics under
	// /debug/ on HTTPAddr (debughttp.With).
	Pprof bool
	// GRPCAddrs maps raft server ids to admin gRPC addresses, for forwarding.
	GRPCAddrs map[string]string
	// Version is this node's build (prism version), reported by
	// GetClusterStatus.
	Version         string
	StaleProxyAfter time.Duration
	// OpenFailureExclusion: Config's.
	OpenFailureExclusion time.Duration
	// XDS serves the routes to Envoy and grpc-go clients (ADS, plus the
	// not-found MailboxQuery) on the gRPC listener; GatewayAddr is the Envoy
	// gateway's query listener put into the listener resource.
	XDS         bool
	GatewayAddr string
	// GatewayQueryAuth makes an Envoy gateway check query tokens
	// (docs/security.md#query-tokens); the zero value checks none.
	GatewayQueryAuth ir.QueryAuth
	// LookupTarget is the gRPC target grpc-go gateways dial for namespace
	// lookups (RLS, served with xDS by every admin node); empty is
	// "dns:///" and this node's advertised gRPC address.
	LookupTarget string
	// RunnerNetworks: see Config.
	RunnerNetworks []netip.Prefix
	// Clock is the leader's clock, for the lessor and the server (default
	// the real clock).
	Clock clock.WithTicker
	// TLS, when set, is this node's admin/<id> identity: the gRPC listener
	// serves mutual TLS and authorizes every call by the caller's identity
	// (Policy), forwards and leadership rounds dial other nodes with it, and
	// the raft transport uses it unless Raft.TLS says otherwise. Nil serves
	// and dials in plaintext with no authorization.
	TLS *pki.Source
	// MaxStreams bounds the concurrent calls and streams on one client
	// connection (default 1000).
	MaxStreams uint32
	// Conn bounds every connection to the gRPC and HTTP listeners: the
	// handshake, the idle time without a call (the client reconnects when
	// it next calls) and the ping rate (internal/connlimit; zero fields
	// take its defaults).
	Conn      connlimit.Bounds
	Quotas    Quotas
	Admission Admission
	// Moves times the leader's mover: see Config.
	Moves MoveConfig
	// MinFree is the free-space watermark of Raft.DataDir (zero: none):
	// below it the node refuses writes (Config.Disk).
	MinFree diskfree.Watermark
	// Backup, with a Dir, writes periodic snapshot files (admin/backup);
	// Start fills in its FSM, Node, Logger and Registry.
	Backup backup.PeriodicConfig
	// Audit, with Brokers, publishes every committed change to Kafka for
	// the $admin namespace, which the leader creates on Audit.Topic
	// (admin/audit); Start fills in its Clock, Logger and Registry.
	Audit  audit.Config
	Logger *slog.Logger

	diskStat func(dir string) (diskfree.Usage, error) // tests' filesystem; nil = statfs
}

func (cfg NodeConfig) limits() []grpc.ServerOption {
	streams := cfg.MaxStreams
	if streams == 0 {
		streams = 1000
	}
	return append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(streams),
		grpc.MaxRecvMsgSize(maxRequestBytes),
		grpc.MaxSendMsgSize(maxResponseBytes),
		// Handlers run on reused goroutines: a fresh goroutine per RPC grew
		// its stack on every call, 11 % of a busy leader's CPU (BENCHMARKS.md,
		// "The leadership check on renewals"). A call finding every worker busy
		// still gets a goroutine of its own, so this never queues.
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
	}, cfg.Conn.GRPC()...)
}

// Node is a running admin node.
type Node struct {
	Server *Server
	Raft   *raftnode.Node
	FSM    *fsm.FSM
	Lessor *lease.Lessor
	// Audit publishes the trail; nil without Audit brokers.
	Audit *audit.Publisher

	grpc     *grpc.Server
	grpcLn   net.Listener
	http     *http.Server
	httpLn   net.Listener
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// Start builds and starts a node. The listeners are bound before Raft starts,
// so a bad address fails fast and leaves nothing running.
func Start(cfg NodeConfig) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	timing := cfg.Raft.Timing
	if timing == (raftnode.Timing{}) {
		timing = raftnode.DefaultTiming()
	}
	cfg.Raft.Logger = cfg.Logger
	if cfg.TLS != nil {
		// The other nodes take a forward only from an admin identity, and
		// raft admits admin/<id> of its members.
		if self := cfg.TLS.Identity(); self.Role != identity.Admin || self.Name != cfg.Raft.ID {
			return nil, fmt.Errorf("admin node %q: the TLS certificate is %s, want an admin/%s identity", cfg.Raft.ID, self, cfg.Raft.ID)
		}
	}
	if cfg.Raft.TLS == nil {
		cfg.Raft.TLS = cfg.TLS
	}
	n := &Node{}
	var err error
	if n.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("admin grpc listen %s: %w", cfg.GRPCAddr, err)
	}
	if cfg.HTTPAddr != "" {
		if n.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			_ = n.grpcLn.Close()
			return nil, fmt.Errorf("admin http listen %s: %w", cfg.HTTPAddr, err)
		}
	}
	closeListeners := func() {
		_ = n.grpcLn.Close()
		if n.httpLn != nil {
			_ = n.httpLn.Close()
		}
		if n.Audit != nil {
			n.Audit.Close()
		}
	}
	addrs := map[string]string{}
	for id, a := range cfg.GRPCAddrs {
		addrs[id] = a
	}
	// The peer list names this node as the others reach it; the listener
	// address (often 0.0.0.0) only stands in when there is no list.
	if _, ok := addrs[cfg.Raft.ID]; !ok {
		addrs[cfg.Raft.ID] = n.grpcLn.Addr().String()
	}

	n.Lessor = lease.New(lease.Config{
		Clock:           cfg.Clock,
		ExtendOnPromote: timing.ElectionTimeout,
		Logger:          cfg.Logger.With("node", cfg.Raft.ID),
	})
	m := NewMetrics()
	reg := prometheus.NewRegistry()
	fsmOpts := []fsm.Option{fsm.WithLeaseObserver(n.Lessor), fsm.WithMoveObserver(m), fsm.WithLogger(cfg.Logger.With("node", cfg.Raft.ID))}
	if len(cfg.Audit.Brokers) > 0 {
		ac := cfg.Audit
		ac.Clock, ac.Logger, ac.Registry = cfg.Clock, cfg.Logger.With("node", cfg.Raft.ID), reg
		if n.Audit, err = audit.New(ac); err != nil {
			closeListeners()
			return nil, err
		}
		fsmOpts = append(fsmOpts, fsm.WithCommitObserver(n.Audit))
	}
	n.FSM = fsm.New(fsmOpts...)
	var disk *diskfree.Guard
	if cfg.Raft.DataDir != "" {
		disk, err = diskfree.New(diskfree.Config{Name: "admin data dir", Dir: cfg.Raft.DataDir, Watermark: cfg.MinFree,
			Clock: cfg.Clock, Stat: cfg.diskStat, Logger: cfg.Logger.With("node", cfg.Raft.ID)})
		if err != nil {
			closeListeners()
			return nil, err
		}
	}
	cfg.Raft.Metrics = m.RaftHooks()
	if n.Raft, err = raftnode.New(cfg.Raft, n.FSM); err != nil {
		closeListeners()
		return nil, err
	}
	n.Server, err = New(Config{
		Node: n.Raft, FSM: n.FSM, Lessor: n.Lessor, GRPCAddrs: addrs, Version: cfg.Version, Clock: cfg.Clock,
		StaleProxyAfter: cfg.StaleProxyAfter, OpenFailureExclusion: cfg.OpenFailureExclusion, Logger: cfg.Logger, TLS: cfg.TLS, Quotas: cfg.Quotas, Admission: cfg.Admission, RunnerNetworks: cfg.RunnerNetworks,
		Registry: reg, Metrics: m, Disk: disk, Moves: cfg.Moves,
		// Half the promotion extension: the other half and the grace are
		// the margin for clock drift (admin/leadership).
		LeaderLease: timing.ElectionTimeout / 2,
	})
	if err != nil {
		_ = n.Raft.Shutdown()
		closeListeners()
		return nil, err
	}
	var backups *backup.Periodic
	if cfg.Backup.Dir != "" {
		b := cfg.Backup
		b.FSM, b.Node, b.Registry, b.Logger = n.FSM, n.Raft, reg, cfg.Logger.With("node", cfg.Raft.ID)
		if backups, err = backup.NewPeriodic(b); err != nil {
			n.Server.Close()
			_ = n.Raft.Shutdown()
			closeListeners()
			return nil, err
		}
	}
	n.grpc = grpc.NewServer(append(n.Server.ServerOptions(), cfg.limits()...)...)
	n.Server.Register(n.grpc)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	if cfg.XDS {
		cp := xds.New(ctx, xds.Config{Registerer: reg, Log: cfg.Logger.With("node", cfg.Raft.ID)})
		cp.Register(n.grpc)
		look := lookup.Config{Routes: n.FSM, Logger: cfg.Logger.With("node", cfg.Raft.ID)}
		if cfg.GatewayQueryAuth.Enabled() {
			look.NamespacesClaim = cfg.GatewayQueryAuth.Claim()
		}
		lookup.New(look).Register(n.grpc)
		// Every node, leader or follower, serves xDS from its own FSM.
		feed := xds.FollowConfig{
			Gateway: ir.Gateway{Address: cfg.GatewayAddr}, NotFound: notFoundAddrs(addrs),
			Lookup:  cmp.Or(cfg.LookupTarget, "dns:///"+addrs[cfg.Raft.ID]),
			Resolve: net.DefaultResolver.LookupHost,
		}
		if cfg.TLS != nil {
			// A mesh on mTLS routes over it: the gateways' clusters verify
			// each runner's proxy identity.
			feed.Gateway.UpstreamTLS = ir.UpstreamTLS{TrustDomain: cfg.TLS.Identity().TrustDomain}
		}
		feed.Gateway.QueryAuth = cfg.GatewayQueryAuth
		n.wg.Add(2)
		go func() { defer n.wg.Done(); _ = cp.Run(ctx) }()
		go func() { defer n.wg.Done(); _ = cp.Follow(ctx, n.FSM, feed) }()
	}
	if backups != nil {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); backups.Run(ctx) }()
	}
	if n.Audit != nil {
		topic := cmp.Or(cfg.Audit.Topic, audit.DefaultTopic)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.Audit.Run(ctx, n.Raft, func(ctx context.Context) error { return n.Server.EnsureAudit(ctx, topic) })
		}()
	}
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.Server.Run(ctx) }()
	go func() { defer n.wg.Done(); _ = n.grpc.Serve(n.grpcLn) }()
	if n.httpLn != nil {
		h := n.Server.HTTPHandler()
		if cfg.Pprof {
			h = debughttp.With(h)
		}
		n.http = cfg.Conn.HTTP(&http.Server{Handler: h})
		n.wg.Add(1)
		go func() { defer n.wg.Done(); _ = n.http.Serve(n.httpLn) }()
	}
	cfg.Logger.Info("admin node started", "node", cfg.Raft.ID, "raft_addr", n.Raft.Addr(),
		"grpc_addr", n.GRPCAddr(), "http_addr", n.HTTPAddr())
	return n, nil
}

// GRPCAddr is the bound gRPC address.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// HTTPAddr is the bound HTTP address, or "".
func (n *Node) HTTPAddr() string {
	if n.httpLn == nil {
		return ""
	}
	return n.httpLn.Addr().String()
}

// Stop shuts the node down: a leader first hands leadership to a peer so the
// cluster does not wait out an election timeout; in-flight RPCs finish
// (until ctx ends); then Raft stops and its stores close.
func (n *Node) Stop(ctx context.Context) error {
	var err error
	n.stopOnce.Do(func() {
		if n.Raft.IsRaftLeader() {
			if ms, merr := n.Raft.Members(); merr == nil && len(ms) > 1 {
				_ = n.Raft.LeadershipTransfer()
			}
		}
		// End the streams first (xDS streams end with the node's context,
		// assignment watches on Drain) so GracefulStop only waits for unary
		// calls in flight.
		n.Server.Drain()
		n.cancel()
		done := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			n.grpc.Stop()
		}
		if n.http != nil {
			_ = n.http.Shutdown(ctx)
		}
		n.Server.Close()
		err = n.Raft.Shutdown()
		n.wg.Wait()
		if n.Audit != nil {
			n.Audit.Close()
		}
	})
	if err != nil && !errors.Is(err, raftnode.ErrShutdown) {
		return err
	}
	return nil
}

// notFoundAddrs lists every admin node's gRPC address, sorted, so all nodes
// build the same IR.
func notFoundAddrs(addrs map[string]string) []string {
	out := slices.Collect(maps.Values(addrs))
	slices.Sort(out)
	return slices.Compact(out)
}
