package main

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/xds/ir"
)

func TestParsePeers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		peers   int
		wantErr string
	}{
		{"", 0, ""},
		{"a=127.0.0.1:1=127.0.0.1:2", 1, ""},
		{" a=h:1=h:2 , b=h:3=h:4 ,c=h:5=h:6", 3, ""},
		{"a=h:1", 0, "not id=raft_addr=grpc_addr"},
		{"a=h:1=h:2,a=h:3=h:4", 0, "appears twice"},
		{"=h:1=h:2", 0, "not id=raft_addr=grpc_addr"},
		{"a=h:1=h:2,", 0, "not id=raft_addr=grpc_addr"},
	}
	for _, tc := range cases {
		peers, grpcAddrs, err := parsePeers(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parsePeers(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(peers) != tc.peers || len(grpcAddrs) != tc.peers {
			t.Errorf("parsePeers(%q) = %v, %v, %v", tc.in, peers, grpcAddrs, err)
		}
	}
}

func TestAdminFlagValidation(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := adminFlags{nodeID: "a", dataDir: "/tmp/x", timing: "fast", raftAddr: "127.0.0.1:1", tls: tlsFlags{insecure: true}, runnerNetworks: "127.0.0.0/8"}
	cases := []struct {
		mod  func(*adminFlags)
		want string
	}{
		{func(f *adminFlags) { f.nodeID = "" }, "--node-id"},
		{func(f *adminFlags) { f.dataDir = "" }, "--data-dir"},
		{func(f *adminFlags) { f.timing = "slow" }, "--raft-timing"},
		{func(f *adminFlags) { f.peers = "b=h:1=h:2" }, "does not include"},
		{func(f *adminFlags) { f.inMemory = true }, "--in-memory"},
		{func(f *adminFlags) { f.peerDial = "b" }, "--peer-dial"},
		{func(f *adminFlags) { f.join, f.bootstrap = true, true }, "exclude each other"},
		{func(f *adminFlags) { f.bootstrapExpect = -1 }, "1 or more"},
		{func(f *adminFlags) { f.bootstrapExpect = 2 }, "--peers names 0 nodes"},
		{func(f *adminFlags) { f.bootstrapExpect, f.peers = 2, "a=h:1=h:2" }, "--peers names 1 nodes"},
		{func(f *adminFlags) { f.bootstrapExpect, f.peers, f.join = 1, "a=h:1=h:2", true }, "excludes --join and --bootstrap"},
		{func(f *adminFlags) { f.bootstrapExpect, f.peers, f.bootstrap = 1, "a=h:1=h:2", true }, "excludes --join and --bootstrap"},
		{func(f *adminFlags) { f.tls.insecure = false }, "TLS is required"},
		{func(f *adminFlags) { f.quotas.Leases = -1 }, "must not be negative"},
		{func(f *adminFlags) { f.runnerNetworks = "10.0.0.0/33" }, "--runner-networks"},
		{func(f *adminFlags) { f.runnerNetworks = " , " }, "--runner-networks"},
		{func(f *adminFlags) { f.lookupTarget = "xds:///admin" }, "--lookup-target"},
		{func(f *adminFlags) { f.openFailureExclusion = time.Millisecond }, "--open-failure-exclusion"},
		{func(f *adminFlags) { f.openFailureExclusion = 8 * 24 * time.Hour }, "--open-failure-exclusion"},
		{func(f *adminFlags) { f.lookupTarget = "dns:///" }, "--lookup-target"},
		{func(f *adminFlags) { f.lookupTarget = "admin:8981" }, "--lookup-target"},
		{func(f *adminFlags) { f.xds = true }, "query authentication for the Envoy gateway is required"},
		{func(f *adminFlags) { f.xds, f.gatewayNoAuth, f.gatewayAuth.JWKSFile = true, true, "/jwks.json" }, "exclude each other"},
		{func(f *adminFlags) { f.xds, f.gatewayAuth.JWKSFile = true, "/jwks.json" }, "an issuer is required"},
		{func(f *adminFlags) {
			f.xds, f.gatewayAuth = true, ir.QueryAuth{JWKSFile: "/jwks.json", JWKSCA: "/ca.pem", Issuer: "i", Audience: "a"}
		}, "only for a JWKS URL"},
	}
	for _, tc := range cases {
		f := base
		tc.mod(&f)
		if _, err := f.nodeConfig(log); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error = %v, want %q", err, tc.want)
		}
	}
	f := base
	f.xds, f.gatewayAuth = true, ir.QueryAuth{JWKSFile: "/etc/prism/jwks.json", Issuer: "https://id.example", Audience: "prism", NamespacesClaim: ir.DefaultNamespacesClaim}
	if cfg, err := f.nodeConfig(log); err != nil || !cfg.GatewayQueryAuth.Enabled() || cfg.GatewayQueryAuth.Issuer != "https://id.example" {
		t.Fatalf("the Envoy gateway's token check: %+v, %v", cfg.GatewayQueryAuth, err)
	}
	// A URL takes the system CA bundle unless told otherwise; a file needs none.
	f.gatewayAuth.JWKSFile, f.gatewayAuth.JWKSURL = "", "https://id.example/jwks"
	if cfg, err := f.nodeConfig(log); err != nil || cfg.GatewayQueryAuth.JWKSCA != ir.DefaultJWKSCA {
		t.Fatalf("a JWKS URL's CA: %+v, %v", cfg.GatewayQueryAuth, err)
	}
	// The audit publisher reaches Kafka as the runner's --kafka-* flags say.
	f = base
	f.auditBrokers, f.auditKafka = "127.0.0.1:9092", *parseKafkaFlags(t, "--kafka-tls-ca", "/nonexistent/ca.pem")
	if _, err := f.nodeConfig(log); err == nil || !strings.Contains(err.Error(), "audit trail: kafka tls ca") {
		t.Errorf("--kafka-tls-ca of no file: %v, want the audit trail's refusal", err)
	}
	f.auditKafka = *parseKafkaFlags(t, "--kafka-tls")
	if cfg, err := f.nodeConfig(log); err != nil || len(cfg.Audit.Kafka) != 1 {
		t.Errorf("--kafka-tls: %d audit client options, %v; want TLS", len(cfg.Audit.Kafka), err)
	}
	f = base
	f.lookupTarget = "dns:///prism-admin.prism.svc:8981"
	if cfg, err := f.nodeConfig(log); err != nil || cfg.LookupTarget != f.lookupTarget {
		t.Fatalf("--lookup-target: %q, %v", cfg.LookupTarget, err)
	}
	f = base
	f.openFailureExclusion = 3 * time.Minute
	if cfg, err := f.nodeConfig(log); err != nil || cfg.OpenFailureExclusion != 3*time.Minute {
		t.Fatalf("--open-failure-exclusion: %v, %v", cfg.OpenFailureExclusion, err)
	}
	f = base
	f.peers = "a=127.0.0.1:7=127.0.0.1:8,b=127.0.0.1:9=127.0.0.1:10"
	cfg, err := f.nodeConfig(log)
	if err != nil || cfg.Raft.Advertise != "127.0.0.1:7" || len(cfg.Raft.Peers) != 2 || cfg.GRPCAddrs["b"] != "127.0.0.1:10" {
		t.Fatalf("config from peers: %+v, %v", cfg, err)
	}
	f.join = true
	cfg, err = f.nodeConfig(log)
	if err != nil || len(cfg.Raft.Peers) != 0 || cfg.Raft.Bootstrap || cfg.GRPCAddrs["b"] != "127.0.0.1:10" {
		t.Fatalf("joining node must know gRPC addresses but bootstrap nothing: %+v, %v", cfg, err)
	}
	if len(cfg.Raft.JoinPeers) != 2 || cfg.TLS != nil {
		t.Fatalf("a joining node admits the --peers to raft until it has a configuration: %+v", cfg.Raft)
	}
	f.tls = tlsFlags{files: pkitest.New(t).Files(identity.Admin, "a")}
	cfg, err = f.nodeConfig(log)
	if err != nil || cfg.TLS == nil || cfg.TLS.Identity() != pkitest.ID(identity.Admin, "a") {
		t.Fatalf("the TLS files make the node's identity: %+v, %v", cfg.TLS, err)
	}
}

// With --bootstrap-expect N, the first N of --peers bootstrap with those N
// voters and every other node joins by itself, knowing every peer's gRPC
// address and admitting them all to raft until it has a configuration.
func TestBootstrapExpect(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const peers = "n0=h0:7000=h0:7001,n1=h1:7000=h1:7001,n2=h2:7000=h2:7001,n3=h3:7000=h3:7001,n4=h4:7000=h4:7001"
	cases := []struct {
		node   string
		expect int
		boot   []string // ids it bootstraps with
		joins  bool
	}{
		{"n0", 3, []string{"n0", "n1", "n2"}, false},
		{"n2", 3, []string{"n0", "n1", "n2"}, false},
		{"n3", 3, nil, true},
		{"n4", 3, nil, true},
		{"n4", 5, []string{"n0", "n1", "n2", "n3", "n4"}, false},
		{"n0", 1, []string{"n0"}, false},
		{"n1", 1, nil, true},
		// Without the flag every node bootstraps with all of --peers.
		{"n4", 0, []string{"n0", "n1", "n2", "n3", "n4"}, false},
	}
	for _, tc := range cases {
		f := adminFlags{nodeID: tc.node, dataDir: "/tmp/x", timing: "fast", raftAddr: "127.0.0.1:1", tls: tlsFlags{insecure: true},
			runnerNetworks: "127.0.0.0/8", peers: peers, bootstrapExpect: tc.expect}
		cfg, err := f.nodeConfig(log)
		if err != nil {
			t.Fatalf("%s of %d: %v", tc.node, tc.expect, err)
		}
		var boot []string
		for _, p := range cfg.Raft.Peers {
			boot = append(boot, p.ID)
		}
		if !slices.Equal(boot, tc.boot) {
			t.Errorf("%s of %d bootstraps with %v, want %v", tc.node, tc.expect, boot, tc.boot)
		}
		addr, joins := f.selfJoin(mustPeers(t, peers))
		if joins != tc.joins || (joins && (len(cfg.Raft.JoinPeers) != 5 || addr != "h"+tc.node[1:]+":7000")) {
			t.Errorf("%s of %d: joins %v at %q with join peers %v, want joins %v", tc.node, tc.expect, joins, addr, cfg.Raft.JoinPeers, tc.joins)
		}
		if cfg.Raft.Bootstrap || len(cfg.GRPCAddrs) != 5 {
			t.Errorf("%s of %d: single-node bootstrap %v, gRPC addresses %v", tc.node, tc.expect, cfg.Raft.Bootstrap, cfg.GRPCAddrs)
		}
	}
}

func mustPeers(t *testing.T, s string) []raftnode.Peer {
	t.Helper()
	peers, _, err := parsePeers(s)
	if err != nil {
		t.Fatal(err)
	}
	return peers
}

func FuzzParsePeers(f *testing.F) {
	for _, s := range []string{"a=h:1=h:2", "a=h:1=h:2,b=h:3=h:4", "", "=", "a==", ",,,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		peers, grpcAddrs, err := parsePeers(s)
		if err != nil {
			return
		}
		if len(peers) != len(grpcAddrs) {
			t.Fatalf("%d peers but %d grpc addresses", len(peers), len(grpcAddrs))
		}
		for _, p := range peers {
			if p.ID == "" || p.Addr == "" || grpcAddrs[p.ID] == "" {
				t.Fatalf("empty field in %+v", p)
			}
		}
	})
}
