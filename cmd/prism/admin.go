package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/admin/audit"
	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/admin/server"
	"github.com/prism-mesh/prism/xds/ir"
)

type adminFlags struct {
	auditBrokers      string
	auditTopic        string
	auditBacklog      int
	auditKafka        kafkaFlags
	nodeID            string
	raftAddr          string
	raftAdvertise     string
	grpcAddr          string
	httpAddr          string
	enablePprof       bool
	dataDir           string
	inMemory          bool
	bootstrap         bool
	bootstrapExpect   int
	join              bool
	peers             string
	peerDial          string
	timing            string
	snapshotInterval  time.Duration
	snapshotThreshold uint64
	trailingLogs      uint64
	acceptLogLoss     bool
	diskStallTimeout  time.Duration
	staleProxyAfter   time.Duration
	xds               bool
	gatewayAddr       string
	lookupTarget      string
	logLevel          string
	logFormat         string
	quotas            server.Quotas
	// gatewayAuth is what an Envoy gateway checks of query tokens;
	// gatewayNoAuth says it checks nothing.
	gatewayAuth   ir.QueryAuth
	gatewayNoAuth bool
	// runnerNetworks are where runner addresses may be.
	runnerNetworks string
	admission      server.Admission
	moves          server.MoveConfig
	tls            tlsFlags
	disk           diskFlags
	backup         backupFlags
	conn           connFlags

	// openFailureExclusion: zero is fsm.DefaultOpenFailureExclusion.
	openFailureExclusion time.Duration
}

func adminCommand() *cobra.Command {
	var f adminFlags
	host, _ := os.Hostname()
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Run an admin node: Raft-replicated leases, proxies and namespaces behind the ControlPlane and Admin gRPC APIs",
		Long: `Run one admin node. A single node: --bootstrap --data-dir DIR. A static cluster
of 3 or 5: the same --peers list on every node (id=raft_addr=grpc_addr,...), each
with its own --node-id, --raft-addr and --data-dir. A node restarting on its data
dir rejoins with its state; bootstrap only happens on an empty data dir. A node
added at runtime starts with --join and is added with prismctl member add ID
RAFT_ADDR GRPC_ADDR, which replicates its gRPC address to every node.

A cluster that grows by itself (the chart's StatefulSet): --bootstrap-expect N on
every node, with --peers listing every node there is, in the same order. On an
empty data dir the first N of --peers bootstrap with those N; any other node asks
the running cluster to add it, as a non-voter until it has caught up, then as a
voter, retrying until it is one, and is not ready (/readyz) until then. N must
stay the same for the cluster's life: growing --peers from 3 to 5 with N=3 joins
the two new nodes. A node with state neither bootstraps nor joins again.

Every node needs its admin/<node-id> certificate (--tls-ca/--tls-cert/--tls-key):
the gRPC API, forwarding between nodes and the raft transport run over mutual
TLS and every call is authorized by the caller's identity. --insecure runs in
plaintext with no authorization.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAdmin(cmd.Context(), f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.nodeID, "node-id", host, "raft server id of this node")
	fs.StringVar(&f.raftAddr, "raft-addr", "127.0.0.1:7000", "raft transport listen address")
	fs.StringVar(&f.raftAdvertise, "raft-advertise", "", "raft address peers dial (default: --raft-addr, or this node's --peers entry)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:7001", "gRPC listen address (ControlPlane, Admin, health)")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:7002", "HTTP listen address (/metrics, /healthz, /readyz); empty disables")
	fs.BoolVar(&f.enablePprof, "enable-pprof", false, "also serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ and runtime/metrics under /debug/runtime-metrics on --http-addr, as etcd's --enable-pprof; that listener is plaintext and unauthenticated, so only where it is reachable by operators alone")
	fs.StringVar(&f.dataDir, "data-dir", "", "directory for the raft WAL and snapshots (required unless --in-memory)")
	fs.BoolVar(&f.inMemory, "in-memory", false, "keep raft state in memory only (single node, lost on exit)")
	fs.BoolVar(&f.bootstrap, "bootstrap", false, "start a new single-node cluster if the data dir is empty")
	fs.StringVar(&f.peers, "peers", "", "static voters, id=raft_addr=grpc_addr,... (this node included)")
	fs.IntVar(&f.bootstrapExpect, "bootstrap-expect", 0, "the first N of --peers bootstrap the cluster with those N voters on an empty data dir; any other node with an empty data dir joins the running cluster by itself (a voter once caught up); keep N for the cluster's life (0: every node of --peers bootstraps with all of them)")
	fs.BoolVar(&f.join, "join", false, "join a running cluster (someone runs `prismctl member add`): --peers only names the members' gRPC addresses, nothing is bootstrapped")
	fs.StringVar(&f.peerDial, "peer-dial", "", "dial these raft addresses instead, id=addr,... (e.g. through a local proxy)")
	fs.StringVar(&f.timing, "raft-timing", "fast", "raft timeouts: fast (150ms heartbeat timeout, for one host or a LAN: a follower stands when its leader has been silent "+
		"that long, so a dead leader is replaced 0.15-0.2s after its last word, and so is a leader silent for 150ms, a stall included) or wan (hashicorp/raft's 1s, "+
		"tolerant of a slow network or a stalling leader, failover about a second later); see docs/operations.md")
	fs.DurationVar(&f.snapshotInterval, "snapshot-interval", 0, "how often raft checks whether to snapshot (0: raft default 2m)")
	fs.Uint64Var(&f.snapshotThreshold, "snapshot-threshold", 0, "log entries since the last snapshot that trigger one (0: raft default 8192)")
	fs.Uint64Var(&f.trailingLogs, "trailing-logs", 0, "log entries kept after a snapshot for slow followers (0: raft default 10240)")
	fs.DurationVar(&f.diskStallTimeout, "disk-stall-timeout", 10*time.Second, fmt.Sprintf("exit with code %d (for the supervisor to restart the node) once a raft log or stable store write has been blocked this long, so that a node whose disk stalls stops leading and another node takes over; 0 disables", raftnode.ExitDiskStall))
	fs.BoolVar(&f.acceptLogLoss, "accept-log-loss", false, "start even though the raft log ends before the commit index this node acknowledged (lost entries: it refuses to start otherwise); for one start, after checking the other members")
	fs.DurationVar(&f.staleProxyAfter, "stale-proxy-after", 30*time.Second, "a proxy without heartbeats this long loses its namespaces")
	fs.DurationVar(&f.openFailureExclusion, "open-failure-exclusion", fsm.DefaultOpenFailureExclusion, fmt.Sprintf("a namespace whose store a proxy's runner cannot open stays off that proxy this long after its last report (%v to %v); the leader's value is recorded with each report, so every node applies the same", fsm.MinOpenFailureExclusion, fsm.MaxOpenFailureExclusion))
	fs.BoolVar(&f.xds, "xds", true, "serve the routes over xDS (ADS) on the gRPC address, from this node's state")
	fs.StringVar(&f.gatewayAddr, "gateway-addr", "0.0.0.0:8080", "IP:port the Envoy gateway listens on for queries (its listener resource)")
	fs.StringVar(&f.lookupTarget, "lookup-target", "", `gRPC target grpc-go gateways dial for namespace lookups (RLS, served by every admin node with xDS), e.g. dns:///prism-admin-headless.prism.svc:7001 (default: "dns:///" and this node's --peers gRPC address, else --grpc-addr)`)
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&f.gatewayAuth.JWKSFile, "gateway-jwks-file", "", "JWKS file, as the Envoy gateway's host sees it, verifying query bearer tokens")
	fs.StringVar(&f.gatewayAuth.JWKSURL, "gateway-jwks-url", "", "https URL of the JWKS verifying query bearer tokens, fetched by the Envoy gateway")
	fs.StringVar(&f.gatewayAuth.JWKSCA, "gateway-jwks-ca", "", "CA bundle, on the Envoy host, that --gateway-jwks-url's server certificate chains to (default "+ir.DefaultJWKSCA+")")
	fs.StringVar(&f.gatewayAuth.Issuer, "gateway-jwt-issuer", "", "iss query tokens must carry (required with --gateway-jwks-*)")
	fs.StringVar(&f.gatewayAuth.Audience, "gateway-jwt-audience", "", "aud query tokens must include (required with --gateway-jwks-*)")
	fs.StringVar(&f.gatewayAuth.NamespacesClaim, "gateway-jwt-namespaces-claim", ir.DefaultNamespacesClaim, `claim listing the namespaces a token may read ("*" = all)`)
	fs.BoolVar(&f.gatewayNoAuth, "gateway-no-query-auth", false, "the Envoy gateway answers queries without a token: anyone who reaches it reads every mailbox")
	fs.StringVar(&f.runnerNetworks, "runner-networks", prefixes(server.DefaultRunnerNetworks),
		"CIDR prefixes runner addresses (the targets of routes) may be in; a registration or lease naming another address, or a host name, is refused (0.0.0.0/0,::/0 allows any)")
	fs.IntVar(&f.admission.MaxInFlightWrites, "max-writes-in-flight", 1000, "Raft writes the leader has proposed and not yet applied; past it new work (acquires, opens, registrations, namespaces) is refused RESOURCE_EXHAUSTED with a retry hint, renewals never are")
	fs.IntVar(&f.admission.MaxRenewalsInFlight, "max-renewals-in-flight", 64, "renewals (session keepalives, mailbox heartbeats) the leader works on at once; the rest wait their turn, counted from their arrival, never refused for load")
	fs.Float64Var(&f.admission.MaxRenewalsPerSecond, "max-renewals-per-second", 0, "if positive, the most renewals the leader works on a second; past it they wait (counted from their arrival) and new work is shed. A bound below the machine's keeps CPU for Raft's heartbeats when renewals alone would take it all (0: no bound)")
	fs.DurationVar(&f.admission.ShedAfterRenewalWait, "shed-after-renewal-wait", time.Second, "while a renewal has waited longer than this for its turn, and for --shed-retry-after after one was answered this late, the leader refuses new work (acquires, opens, registrations, namespaces) RESOURCE_EXHAUSTED; past it waiting renewals are served most urgent first (the lease or session nearest its expiry), not oldest first")
	fs.DurationVar(&f.admission.RetryAfter, "shed-retry-after", time.Second, "the retry hint of refused new work (plus up to half again at random)")
	fs.Int64Var(&f.moves.MaxLag, "move-max-lag", 100, "a namespace moving by handoff switches to its destination once the destination's mailbox is at most this many records behind its topics and has stored, on every partition, at least what the source last reported it had stored (docs/architecture.md#moves)")
	fs.DurationVar(&f.moves.HandoffTail, "handoff-tail", 12*time.Second, "after a move's switch the source keeps serving this long (gateways' cached lookups age out, queries in flight finish), then releases")
	fs.DurationVar(&f.moves.Timeout, "move-timeout", 10*time.Minute, "a move by handoff not switched this long after it began is abandoned; the source keeps serving")
	fs.IntVar(&f.moves.MaxConcurrent, "max-concurrent-moves", 4, "moves by handoff rebalancing (joins, drains) keeps in progress cluster-wide; the rest wait")
	fs.IntVar(&f.quotas.Proxies, "max-proxies", server.DefaultQuotas.Proxies, "proxies the cluster registers; one more is refused RESOURCE_EXHAUSTED")
	fs.IntVar(&f.quotas.Namespaces, "max-namespaces", server.DefaultQuotas.Namespaces, "namespaces the cluster holds; one more is refused RESOURCE_EXHAUSTED")
	fs.IntVar(&f.quotas.Leases, "max-leases", server.DefaultQuotas.Leases, "mailbox leases the cluster holds; one more is refused RESOURCE_EXHAUSTED")
	fs.IntVar(&f.quotas.LeasesPerProxy, "max-leases-per-proxy", server.DefaultQuotas.LeasesPerProxy, "mailbox leases one proxy holds; one more for it is refused RESOURCE_EXHAUSTED (renewals and re-grants never are)")
	f.tls.register(fs)
	f.disk.register(fs, "the node refuses writes (namespaces, registrations, acquisitions) RESOURCE_EXHAUSTED before the raft log runs out of space; reads, renewals and proxy heartbeats go on")
	f.backup.register(fs)
	fs.StringVar(&f.auditBrokers, "audit-brokers", "", "Kafka brokers (comma-separated host:port) the leader publishes every committed change to, one envelope per raft index, "+
		"and the $admin namespace reads, so GET /v1/namespaces/$admin/events answers who did what; empty: no audit trail")
	fs.StringVar(&f.auditTopic, "audit-topic", audit.DefaultTopic, "Kafka topic of the audit trail (partition 0) and of the $admin namespace")
	fs.IntVar(&f.auditBacklog, "audit-backlog", 100000, "committed changes held for the audit trail while Kafka is slow or away; past it the oldest is dropped (prism_admin_audit_dropped_total)")
	f.auditKafka.Register(fs)
	f.conn.register(fs, "--grpc-addr and --http-addr")
	cmd.AddCommand(adminRestoreCommand())
	return cmd
}

// selfJoin says whether this node, under --bootstrap-expect, is one that
// joins the running cluster by itself (it is not among the first N of
// peers), and its raft address as the others dial it.
func (f adminFlags) selfJoin(peers []raftnode.Peer) (string, bool) {
	if f.bootstrapExpect <= 0 {
		return "", false
	}
	for i, p := range peers {
		if p.ID == f.nodeID {
			return p.Addr, i >= f.bootstrapExpect
		}
	}
	return "", false
}

// parsePeers reads id=raft_addr=grpc_addr entries.
func parsePeers(s string) ([]raftnode.Peer, map[string]string, error) {
	var peers []raftnode.Peer
	grpcAddrs := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return nil, grpcAddrs, nil
	}
	for _, e := range strings.Split(s, ",") {
		parts := strings.Split(strings.TrimSpace(e), "=")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return nil, nil, fmt.Errorf("--peers: entry %q is not id=raft_addr=grpc_addr", e)
		}
		if _, dup := grpcAddrs[parts[0]]; dup {
			return nil, nil, fmt.Errorf("--peers: id %q appears twice", parts[0])
		}
		peers = append(peers, raftnode.Peer{ID: parts[0], Addr: parts[1]})
		grpcAddrs[parts[0]] = parts[2]
	}
	return peers, grpcAddrs, nil
}

func parseDial(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, e := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--peer-dial: entry %q is not id=addr", e)
		}
		out[id] = addr
	}
	return out, nil
}

func (f adminFlags) nodeConfig(log *slog.Logger) (server.NodeConfig, error) {
	var cfg server.NodeConfig
	if f.nodeID == "" {
		return cfg, fmt.Errorf("--node-id is required")
	}
	if f.dataDir == "" && !f.inMemory {
		return cfg, fmt.Errorf("--data-dir is required (or --in-memory for a throwaway single node)")
	}
	peers, grpcAddrs, err := parsePeers(f.peers)
	if err != nil {
		return cfg, err
	}
	if f.inMemory && (len(peers) > 0 || f.dataDir != "" || f.join) {
		return cfg, fmt.Errorf("--in-memory is a single node without --peers, --join or --data-dir")
	}
	if q := f.quotas; q.Proxies < 0 || q.Namespaces < 0 || q.Leases < 0 || q.LeasesPerProxy < 0 {
		return cfg, fmt.Errorf("--max-proxies, --max-namespaces, --max-leases and --max-leases-per-proxy must not be negative (0: the default)")
	}
	if f.join && f.bootstrap {
		return cfg, fmt.Errorf("--join and --bootstrap exclude each other")
	}
	switch n := f.bootstrapExpect; {
	case n == 0:
	case n < 0:
		return cfg, fmt.Errorf("--bootstrap-expect %d: want the number of voters that bootstrap, 1 or more", n)
	case f.join || f.bootstrap:
		return cfg, fmt.Errorf("--bootstrap-expect excludes --join and --bootstrap: it decides which nodes bootstrap and which join")
	case n > len(peers):
		return cfg, fmt.Errorf("--bootstrap-expect %d: --peers names %d nodes, the first N of which bootstrap", n, len(peers))
	}
	gatewayAuth, err := f.queryAuth(log)
	if err != nil {
		return cfg, err
	}
	if err := validLookupTarget(f.lookupTarget); err != nil {
		return cfg, err
	}
	networks, err := server.ParseNetworks(f.runnerNetworks)
	if err != nil {
		return cfg, fmt.Errorf("--runner-networks: %w", err)
	}
	advertise := f.raftAdvertise
	if len(peers) > 0 {
		self := -1
		for i, p := range peers {
			if p.ID == f.nodeID {
				self = i
			}
		}
		if self < 0 {
			return cfg, fmt.Errorf("--peers does not include --node-id %q", f.nodeID)
		}
		if advertise == "" {
			advertise = peers[self].Addr
		}
	}
	dial, err := parseDial(f.peerDial)
	if err != nil {
		return cfg, err
	}
	var timing raftnode.Timing
	switch f.timing {
	case "fast":
		timing = raftnode.FastTiming()
	case "wan":
		timing = raftnode.DefaultTiming()
	default:
		return cfg, fmt.Errorf("--raft-timing: %q is not fast or wan", f.timing)
	}
	raftAddr := f.raftAddr
	if f.inMemory {
		raftAddr = ""
	}
	bootPeers, joinPeers := peers, []raftnode.Peer(nil)
	if _, joins := f.selfJoin(peers); f.join || joins {
		// A joining node must not invent a configuration of its own: the
		// leader's replaces it only where the logs differ in term. Over
		// TLS its raft port admits the members named until it has one.
		bootPeers, joinPeers = nil, peers
	} else if f.bootstrapExpect > 0 {
		bootPeers = peers[:f.bootstrapExpect]
	}
	if w := f.openFailureExclusion; w != 0 {
		if err := fsm.ValidOpenFailureExclusion(w); err != nil {
			return cfg, fmt.Errorf("--open-failure-exclusion: %w", err)
		}
	}
	minFree, err := f.disk.watermark()
	if err != nil {
		return cfg, err
	}
	backups, err := f.backup.config()
	if err != nil {
		return cfg, err
	}
	conn, err := f.conn.bounds()
	if err != nil {
		return cfg, err
	}
	src, err := f.tls.load(log)
	if err != nil {
		return cfg, err
	}
	auditKafka, err := f.auditKafka.kgoOpts(log, f.auditBrokers != "")
	if err != nil {
		return cfg, fmt.Errorf("audit trail: %w", err)
	}
	return server.NodeConfig{
		Raft: raftnode.Config{
			ID: f.nodeID, DataDir: f.dataDir, BindAddr: raftAddr, Advertise: advertise,
			Peers: bootPeers, JoinPeers: joinPeers, Bootstrap: f.bootstrap || f.inMemory, DialAddrs: dial, Timing: timing,
			SnapshotInterval: f.snapshotInterval, SnapshotThreshold: f.snapshotThreshold, TrailingLogs: f.trailingLogs,
			AcceptLogLoss: f.acceptLogLoss, DiskStallTimeout: f.diskStallTimeout,
		},
		GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, Pprof: f.enablePprof, GRPCAddrs: grpcAddrs, Version: version,
		StaleProxyAfter: f.staleProxyAfter, OpenFailureExclusion: f.openFailureExclusion, Logger: log, XDS: f.xds, GatewayAddr: f.gatewayAddr, TLS: src,
		Quotas: f.quotas, GatewayQueryAuth: gatewayAuth, RunnerNetworks: networks,
		Admission: f.admission, MinFree: minFree, LookupTarget: f.lookupTarget, Backup: backups, Moves: f.moves, Conn: conn,
		Audit: audit.Config{Brokers: splitBrokers(f.auditBrokers), Topic: f.auditTopic, Backlog: f.auditBacklog, Kafka: auditKafka},
	}, nil
}

// validLookupTarget refuses a --lookup-target grpc-go could not dial: it
// refuses a route whose RLS lookup service names a scheme it has no resolver
// for, which would turn the whole route table away, on every gateway.
func validLookupTarget(t string) error {
	if t == "" {
		return nil
	}
	u, err := url.Parse(t)
	if err != nil || (u.Scheme != "dns" && u.Scheme != "passthrough") || strings.TrimPrefix(u.Path, "/") == "" {
		return fmt.Errorf("--lookup-target %q: want dns:///host:port or passthrough:///host:port", t)
	}
	return nil
}

func runAdmin(ctx context.Context, f adminFlags) error {
	log, err := newLogger(f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	cfg, err := f.nodeConfig(log)
	if err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	n, err := server.Start(cfg)
	if err != nil {
		return err
	}
	// The join ends with ctx, before the node stops under it.
	joined := make(chan struct{})
	peers, _, _ := parsePeers(f.peers)
	if raftAddr, joins := f.selfJoin(peers); !joins {
		close(joined)
	} else {
		go func() {
			defer close(joined)
			if err := n.Join(ctx, raftAddr); err != nil && ctx.Err() == nil {
				log.Error("joining the cluster failed; the node stays not ready", "node", cfg.Raft.ID, "err", err)
			}
		}()
	}
	<-ctx.Done()
	<-joined
	log.Info("shutting down admin node", "node", cfg.Raft.ID)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Stop(sctx)
}

// queryAuth is what the Envoy gateways this node configures check of query
// tokens: like prism gateway, nothing only when asked (docs/security.md#query-tokens).
func (f adminFlags) queryAuth(log *slog.Logger) (ir.QueryAuth, error) {
	q := f.gatewayAuth
	jwks := q.JWKSFile != "" || q.JWKSURL != ""
	switch {
	case !f.xds:
		return ir.QueryAuth{}, nil
	case jwks && f.gatewayNoAuth:
		return ir.QueryAuth{}, errors.New("--gateway-no-query-auth and --gateway-jwks-file/--gateway-jwks-url exclude each other")
	case f.gatewayNoAuth:
		log.Warn("the Envoy gateway checks no query tokens (--gateway-no-query-auth): anyone who reaches it reads every mailbox")
		return ir.QueryAuth{}, nil
	case !jwks:
		return ir.QueryAuth{}, errors.New("query authentication for the Envoy gateway is required: --gateway-jwks-file or --gateway-jwks-url with --gateway-jwt-issuer and --gateway-jwt-audience, or --gateway-no-query-auth")
	}
	if q.JWKSURL != "" && q.JWKSCA == "" {
		q.JWKSCA = ir.DefaultJWKSCA
	}
	if err := q.Validate(); err != nil {
		return ir.QueryAuth{}, err
	}
	return q, nil
}

func prefixes(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}
