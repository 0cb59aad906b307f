// Package server is the admin node's gRPC face: prism.admin.v1.ControlPlane
// and prism.admin.v1.Admin over the replicated FSM (package fsm), the
// leader's lessor (package lease) and a Raft member (package raftnode).
//
// Any node answers any call. Writes are proposed through Raft on the leader; a
// follower re-issues the identical RPC on the leader (its gRPC address from
// the replicated members table, else --peers) over a pooled connection (one
// hop: a forwarded call is never forwarded again) and, if leadership moved
// before the call ran, waits for the next leader and tries again within the
// caller's deadline; when the outcome is unknown (the leader died mid-call) it
// answers UNAVAILABLE and leaves the retry to the client. Reads are served
// from the local FSM (STALE) or, for LINEARIZABLE, after the ReadIndex barrier
// on the leader (a follower forwards those too). Operator writes forwarded by
// a follower are answered once the follower has applied them as well, so a
// client reads its own write from the node it wrote through. Mailbox
// heartbeats are renewals in the leader's lessor, not Raft writes; the leader
// alone expires leases, marks proxies stale and checkpoints renewals, each by
// committing a command stamped with its clock. Every node also serves xDS
// (ADS) from its own FSM.
//
// Over mutual TLS (Config.TLS) every call is authorized by the caller's
// identity before anything else runs (Policy). A follower forwards with its
// own admin identity and names the original caller, whom the leader
// authorizes again; only an admin node may name one.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/leadership"
	"github.com/prism-mesh/prism/admin/lease"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/internal/grpcpool"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Config wires a server to its node's parts.
type Config struct {
	Node   *raftnode.Node
	FSM    *fsm.FSM
	Lessor *lease.Lessor
	// GRPCAddrs maps raft server ids to their admin gRPC address; followers
	// forward to the leader's entry.
	GRPCAddrs map[string]string
	// Version is this node's build, as GetClusterStatus reports it.
	Version string
	// Clock is the leader's: stamped into commands and ticking the leader
	// loops. Defaults to the real clock.
	Clock clock.WithTicker

	// StaleProxyAfter is how long a proxy may go without a heartbeat before
	// the leader marks it stale and its namespaces move (default 30s).
	StaleProxyAfter time.Duration
	// OpenFailureExclusion is how long a namespace stays off a proxy that
	// reported it could not open its mailbox, stamped into the heartbeat
	// entries this node proposes as leader (default
	// fsm.DefaultOpenFailureExclusion).
	OpenFailureExclusion time.Duration
	// ExpiryInterval is how often the leader asks the lessor for due leases
	// (default 100ms); CheckpointInterval how often renewals are committed
	// (default 1s); ProxyCheckInterval how often proxies are checked (1s).
	ExpiryInterval     time.Duration
	CheckpointInterval time.Duration
	ProxyCheckInterval time.Duration
	// ForwardWait bounds how long a call waits for a leader (to forward to or
	// to become) when the caller set no earlier deadline (default 5s).
	ForwardWait time.Duration
	// LeaderLease is how long a quorum's confirmation of this node's
	// leadership may answer renewals; it must not exceed the lessor's
	// ExtendOnPromote (admin/leadership argues the bound). Default: half
	// raft's default election timeout.
	LeaderLease time.Duration

	// Disk is the free-space watermark of the node's data dir: below it
	// writes are refused (admitWrite). Nil: none.
	Disk *diskfree.Guard

	// Admission bounds the leader's work in flight (zero fields:
	// defaults).
	Admission Admission

	// Moves times the leader's mover (zero fields: defaults).
	Moves MoveConfig

	// Quotas bound the tables (zero fields: DefaultQuotas').
	Quotas Quotas
	// RunnerNetworks are where the runner addresses of registrations and
	// leases may be (none: anywhere; prism admin defaults to
	// DefaultRunnerNetworks).
	RunnerNetworks []netip.Prefix

	// TLS, when set, is this node's identity: forwards and leadership
	// rounds dial other admin nodes over mutual TLS with it, accepting only
	// admin identities. Nil dials in plaintext.
	TLS *pki.Source

	Logger *slog.Logger
	// Registry receives the metrics (default: a new registry); Metrics are
	// the collectors, shared with the raft node (default: new ones).
	Registry prometheus.Registerer
	Metrics  *Metrics
}

func (c *Config) withDefaults() error {
	if c.Node == nil || c.FSM == nil || c.Lessor == nil {
		return errors.New("server: node, fsm and lessor are required")
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.StaleProxyAfter == 0 {
		c.StaleProxyAfter = 30 * time.Second
	}
	if c.OpenFailureExclusion == 0 {
		c.OpenFailureExclusion = fsm.DefaultOpenFailureExclusion
	}
	if c.ExpiryInterval == 0 {
		c.ExpiryInterval = 100 * time.Millisecond
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = time.Second
	}
	if c.ProxyCheckInterval == 0 {
		c.ProxyCheckInterval = time.Second
	}
	if c.ForwardWait == 0 {
		c.ForwardWait = 5 * time.Second
	}
	if c.LeaderLease == 0 {
		c.LeaderLease = raftnode.DefaultTiming().ElectionTimeout / 2
	}
	c.Quotas = c.Quotas.withDefaults()
	c.Admission = c.Admission.withDefaults()
	c.Moves = c.Moves.withDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	return nil
}

// Server implements both services.
type Server struct {
	adminv1.UnimplementedControlPlaneServer
	adminv1.UnimplementedAdminServer

	cfg     Config
	node    *raftnode.Node
	fsm     *fsm.FSM
	lessor  *lease.Lessor
	log     *slog.Logger
	metrics *Metrics
	health  *health.Server
	pool    grpcpool.Pool
	// leader proves this node still leads before it answers from memory.
	leader *leadership.Checker

	mu    sync.Mutex
	addrs map[string]string
	// draining is closed when the node starts shutting down, ending watch
	// streams so proxies reconnect to another node.
	draining  chan struct{}
	drainOnce sync.Once

	admission admission
	hooks     testHooks
	// lag is what proxies' heartbeats said of their namespaces' lag, kept
	// by the leader for its mover (mover.go); moverTicks counts the mover's
	// finished looks, so a test on a fake clock knows when one is done.
	lag        lagReports
	moverTicks atomic.Uint64
}

// testHooks let tests hold a call at a point of its way; unset in
// production.
type testHooks struct {
	// renewalReceived runs once a renewal's receipt is taken, before it
	// waits for anything else.
	renewalReceived atomic.Pointer[func(*lease.Receipt)]
	// writeAdmitted runs once the leader has admitted a write, before it
	// proposes it.
	writeAdmitted atomic.Pointer[func(method string)]
}

// New builds a server; Run starts its leadership work.
func New(cfg Config) (*Server, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		node:     cfg.Node,
		fsm:      cfg.FSM,
		lessor:   cfg.Lessor,
		log:      cfg.Logger.With("node", cfg.Node.ID()),
		health:   health.NewServer(),
		addrs:    map[string]string{},
		draining: make(chan struct{}),
		pool:     grpcpool.Pool{Options: forwardDialOptions()},
	}
	if cfg.TLS != nil {
		// Replaces the pool's plaintext credentials (the last one wins).
		s.pool.Options = append(s.pool.Options, grpc.WithTransportCredentials(
			credentials.NewTLS(cfg.TLS.ClientConfig(pki.RoleIs(identity.Admin)))))
	}
	for id, a := range cfg.GRPCAddrs {
		s.addrs[id] = a
	}
	leader, err := s.newLeadership()
	if err != nil {
		return nil, err
	}
	s.leader = leader
	s.admission.renewals = newRenewalGate(cfg.Admission, cfg.Clock)
	s.metrics = cfg.Metrics
	if err := s.metrics.register(cfg.Registry, s); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if cfg.Disk != nil {
		if err := cfg.Registry.Register(cfg.Disk.Collector("prism_admin")); err != nil {
			return nil, fmt.Errorf("register disk metrics: %w", err)
		}
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// Register adds ControlPlane, Sessions, Admin, Peer and the gRPC health service to g.
func (s *Server) Register(g *grpc.Server) {
	adminv1.RegisterControlPlaneServer(g, s)
	adminv1.RegisterSessionsServer(g, sessions{s: s})
	adminv1.RegisterAdminServer(g, s)
	adminv1.RegisterPeerServer(g, peer{s: s})
	healthpb.RegisterHealthServer(g, s.health)
}

// ServerOptions are the credentials and interceptors of the gRPC server the
// services are registered on. With TLS the first interceptor authorizes
// every call by Policy, so nothing else runs for a refused one; then calls
// are counted by method and code.
func (s *Server) ServerOptions() []grpc.ServerOption {
	var (
		opts   []grpc.ServerOption
		unary  []grpc.UnaryServerInterceptor
		stream []grpc.StreamServerInterceptor
	)
	if s.cfg.TLS != nil {
		a := authorizer{policy: Policy()}
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.TLS.ServerConfig(pki.Any))))
		unary, stream = append(unary, a.unary), append(stream, a.stream)
	}
	unary, stream = append(unary, s.metrics.unary), append(stream, s.metrics.stream)
	return append(opts, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
}

// Drain ends long-lived streams (WatchAssignments) so a graceful stop does
// not wait on them; unary calls keep being served.
func (s *Server) Drain() {
	s.drainOnce.Do(func() { close(s.draining) })
}

// Close releases forwarding connections.
func (s *Server) Close() {
	s.health.Shutdown()
	s.pool.Close()
}

// grpcAddr is a member's admin gRPC address: the replicated members table,
// else this node's --peers.
func (s *Server) grpcAddr(id string) string {
	if a := s.fsm.MemberAddress(id); a != "" {
		return a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[id]
}

// Run follows leadership until ctx ends: on becoming leader it promotes the
// lessor (every live lease gets a full ttl plus the election timeout) and
// starts the leader loops; on losing it, it stops them and demotes.
func (s *Server) Run(ctx context.Context) {
	var lead *leaderLoops
	defer func() {
		if lead != nil {
			lead.stop()
		}
	}()
	for {
		l, changed := s.node.Leadership()
		if l.LeaderID != "" {
			s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		} else {
			s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		}
		switch {
		case l.IsLeader && lead == nil:
			s.lessor.Promote()
			s.log.Info("leading: lessor promoted", "term", l.Term, "leases", s.lessor.Len())
			lead = s.startLeaderLoops(ctx)
		case !l.IsLeader && lead != nil:
			lead.stop()
			lead = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// leaderLoops is the leader-only background work of one term.
type leaderLoops struct {
	s      *Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *Server) startLeaderLoops(ctx context.Context) *leaderLoops {
	ctx, cancel := context.WithCancel(ctx)
	l := &leaderLoops{s: s, cancel: cancel}
	for _, loop := range []struct {
		d time.Duration
		f func(context.Context)
	}{
		{s.cfg.ExpiryInterval, s.expireDue},
		{s.cfg.CheckpointInterval, s.checkpoint},
		{s.cfg.ProxyCheckInterval, s.markStaleProxies},
		{s.cfg.Moves.Interval, s.newMover().tick},
	} {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); s.every(ctx, loop.d, loop.f) }()
	}
	l.wg.Add(1)
	go func() { defer l.wg.Done(); s.publishPeers(ctx) }()
	return l
}

func (l *leaderLoops) stop() {
	l.cancel()
	l.wg.Wait()
	l.s.lessor.Demote()
	l.s.log.Info("stepped down: lessor demoted")
}

func (s *Server) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := s.cfg.Clock.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			f(ctx)
		}
	}
}

// publishPeers puts the gRPC addresses this node knows from --peers (and its
// own) into the members table for the current raft members that have no
// row, so a cluster bootstrapped from a static list forwards by the table
// too. only_absent makes it idempotent and never overrides an AddVoter row;
// ids outside the configuration are left out so a removed member's row does
// not come back from some node's old --peers. Retried until it commits or
// the term ends.
func (s *Server) publishPeers(ctx context.Context) {
	for {
		missing, err := s.unpublishedPeers()
		if err == nil && len(missing) == 0 {
			return
		}
		if err == nil {
			_, err = s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_PutMembers{PutMembers: &adminv1.PutMembersCommand{
				Members: missing, OnlyAbsent: true,
			}}})
			if err == nil {
				s.log.Info("published member addresses", "members", len(missing))
				return
			}
		}
		s.log.Warn("publish member addresses", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (s *Server) unpublishedPeers() ([]*adminv1.MemberAddress, error) {
	members, err := s.node.Members()
	if err != nil {
		return nil, err
	}
	known, _ := s.fsm.MemberAddresses()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*adminv1.MemberAddress
	for _, m := range members {
		a := s.addrs[m.ID]
		if _, ok := known[m.ID]; ok || !publishable(a) {
			continue
		}
		out = append(out, &adminv1.MemberAddress{Id: m.ID, GrpcAddress: a})
	}
	return out, nil
}

// publishable is an address other nodes can dial: valid, and not a wildcard
// listen address such as 0.0.0.0:8981.
func publishable(addr string) bool {
	if fsm.ValidateAddress("grpc_address", addr) != nil {
		return false
	}
	host, _, _ := net.SplitHostPort(addr)
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsUnspecified()
}

// expireDue commits the sessions and the leases the lessor says are past
// expires + grace.
func (s *Server) expireDue(ctx context.Context) {
	s.expireSessions(ctx)
	refs := s.lessor.Expired()
	s.metrics.expiryScans.Inc()
	if len(refs) == 0 {
		return
	}
	commitExpiry(s, ctx, "lease", len(refs), &adminv1.Command{Body: &adminv1.Command_ExpireLeases{
		ExpireLeases: &adminv1.ExpireLeasesCommand{Leases: refs},
	}}, func(r *fsm.ExpireResult) {
		s.metrics.expirations.Add(float64(len(r.Expired)))
		for _, l := range r.Expired {
			s.log.Info("lease expired", "mailbox_id", l.GetMailboxId(), "runner_id", l.GetRunnerId(), "epoch", l.GetEpoch())
		}
	})
}

// commitExpiry commits cmd, the expiry of n leases or sessions (kind
// "lease" or "session") the lessor found due, and hands the FSM's result to ended. An expiry that
// does not commit is only logged: the lessor offers it again after
// ExpiryRetry.
func commitExpiry[R any](s *Server, ctx context.Context, kind string, n int, cmd *adminv1.Command, ended func(R)) {
	res, err := s.propose(ctx, cmd)
	if err != nil {
		s.log.Warn("commit "+kind+" expiry", kind+"s", n, "err", err)
		return
	}
	if r, ok := res.(R); ok {
		ended(r)
	}
}

// checkpoint carries leader-local renewals into the replicated state.
func (s *Server) checkpoint(ctx context.Context) {
	for {
		cps := s.lessor.Checkpoints(1000)
		if len(cps) == 0 {
			return
		}
		if _, err := s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_CheckpointLeases{
			CheckpointLeases: &adminv1.CheckpointLeasesCommand{Checkpoints: cps},
		}}); err != nil {
			s.log.Warn("commit lease checkpoints", "leases", len(cps), "err", err)
			return
		}
		if len(cps) < 1000 {
			return
		}
	}
}

// markStaleProxies moves namespaces off proxies that stopped heartbeating.
func (s *Server) markStaleProxies(ctx context.Context) {
	refs := s.lessor.StaleProxies(s.fsm.ProxyRecords(), s.cfg.StaleProxyAfter)
	if len(refs) == 0 {
		return
	}
	res, err := s.propose(ctx, &adminv1.Command{Body: &adminv1.Command_MarkProxiesStale{
		MarkProxiesStale: &adminv1.MarkProxiesStaleCommand{Proxies: refs},
	}})
	if err != nil {
		s.log.Warn("commit stale proxies", "proxies", len(refs), "err", err)
		return
	}
	if r, ok := res.(*fsm.MarkStaleResult); ok && len(r.Marked) > 0 {
		s.log.Info("proxies marked stale", "proxies", r.Marked)
	}
}

// propose stamps the leader's clock (and, into a proxy heartbeat, its
// open-failure exclusion window) into cmd and commits it. It returns the
// FSM's answer or an error: raftnode.ErrNotLeader when this node cannot
// propose, an fsm error when the command was refused.
//
// It is the one place a command gets its time, which is the only time the
// FSM ever sees: the leader's, because its lessor's clock governs expiry. A
// forwarded request reaches here as the leader's own call, so a follower's
// clock never enters the log. fsm.Encode checks the stamped command whole,
// the one check on the leader, so neither a request nor a leader loop's
// command reaches the log malformed.
func (s *Server) propose(ctx context.Context, cmd *adminv1.Command) (any, error) {
	resp, _, err := s.proposeAt(ctx, cmd)
	return resp, err
}

// principalOf is who asks for a change, as the audit trail names them
// (admin/audit): the caller's identity, "anonymous" for a call over a
// listener without mutual TLS, "" for the leader's own loops.
func principalOf(ctx context.Context) string {
	if caller, ok := identity.Caller(ctx); ok {
		return caller.String()
	}
	if _, ok := grpcpeer.FromContext(ctx); ok {
		return "anonymous"
	}
	return ""
}

// proposeAt is propose that also says the entry's Raft index.
func (s *Server) proposeAt(ctx context.Context, cmd *adminv1.Command) (any, uint64, error) {
	cmd.Now = timestamppb.New(s.cfg.Clock.Now())
	cmd.Principal = principalOf(ctx)
	if cmd.GetProxyHeartbeat() != nil {
		cmd.OpenFailureExclusion = durationpb.New(s.cfg.OpenFailureExclusion)
	}
	data, err := fsm.Encode(cmd)
	if err != nil {
		return nil, 0, err
	}
	resp, index, err := s.node.Apply(ctx, data)
	if err != nil {
		s.noticeFull(err)
		return nil, 0, fmt.Errorf("commit %s: %w", fsm.CommandType(cmd), err)
	}
	if err, ok := resp.(error); ok {
		return nil, 0, err
	}
	return resp, index, nil
}
