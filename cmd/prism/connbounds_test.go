package main

import (
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/testkit/conntest"
)

// The gateway's listeners bound their connections by its --conn-* flags
// (docs/security.md#connection-bounds): both close a connection that sends
// nothing within the handshake bound, the HTTP one an idle kept-alive
// connection and the gRPC one an HTTP/2 connection without a stream within
// the idle bound; gRPC sends a ping flood away and keeps a client that
// pings within the policy or holds a quiet stream.
func TestGatewayConnectionBounds(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP", "")
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "")
	b := connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}
	gw, err := startGateway(slog.New(slog.NewTextHandler(io.Discard, nil)), gatewayFlags{
		admin: "127.0.0.1:1", nodeID: "gw", httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0", timeout: time.Second,
		noQueryAuth: true, conn: connFlags{b},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.stop() })
	httpAddr := strings.TrimPrefix(gw.url, "http://")
	cases := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"http: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, httpAddr, b.Handshake) }},
		{"http: idle after a request", func(t *testing.T) { conntest.HTTP1IdleClosed(t, httpAddr, nil, "/healthz", b.Idle) }},
		{"grpc: nothing sent", func(t *testing.T) { conntest.ClosedUnused(t, gw.grpcAddr, b.Handshake) }},
		{"grpc: no stream", func(t *testing.T) { conntest.IdleClosed(t, gw.grpcAddr, nil, b.Idle) }},
		{"grpc: ping flood", func(t *testing.T) { conntest.PingFloodSentAway(t, gw.grpcAddr, nil) }},
		{"grpc: pings within the policy", func(t *testing.T) { conntest.PingsAnswered(t, gw.grpcAddr, nil, 2*b.PingEvery, 4) }},
		{"grpc: a quiet stream", func(t *testing.T) {
			cc, err := grpc.NewClient(gw.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), conntest.Keepalive())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			conntest.StreamHeld(t, cc, 2*b.Idle)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.check(t)
		})
	}
}

// Every command that serves takes the --conn-* flags with connlimit's
// defaults, and admin and runner hand what they were given to their
// listeners' configuration; a negative bound is refused naming its flag.
func TestConnFlags(t *testing.T) {
	t.Parallel()
	for _, cmd := range []*cobra.Command{adminCommand(), runnerCommand(), sidecarCommand(), gatewayCommand(), injectCommand()} {
		for flag, want := range map[string]time.Duration{
			"conn-handshake-timeout": connlimit.Default.Handshake,
			"conn-idle-timeout":      connlimit.Default.Idle,
			"conn-min-ping-interval": connlimit.Default.PingEvery,
		} {
			f := cmd.Flags().Lookup(flag)
			if f == nil || f.DefValue != want.String() {
				t.Errorf("prism %s --%s: %v, want a flag defaulting to %v", cmd.Name(), flag, f, want)
			}
		}
	}
	args := []string{"--conn-handshake-timeout=2s", "--conn-idle-timeout=3s", "--conn-min-ping-interval=4s"}
	want := connlimit.Bounds{Handshake: 2 * time.Second, Idle: 3 * time.Second, PingEvery: 4 * time.Second}
	log := slog.New(slog.DiscardHandler)

	var rf runnerFlags
	rc := &cobra.Command{}
	rf.register(rc, runnerFlags{})
	if err := rc.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := rf.nodeConfig(log, []string{"127.0.0.1:1"})
	if err != nil || cfg.Runner.Conn != want {
		t.Errorf("runner %v: Conn %+v, %v, want %+v", args, cfg.Runner.Conn, err, want)
	}

	af := adminFlags{nodeID: "a", dataDir: "/tmp/x", timing: "fast", raftAddr: "127.0.0.1:1", tls: tlsFlags{insecure: true}, runnerNetworks: "127.0.0.0/8", gatewayNoAuth: true}
	af.conn.b = want
	acfg, err := af.nodeConfig(log)
	if err != nil || acfg.Conn != want {
		t.Errorf("admin: Conn %+v, %v, want %+v", acfg.Conn, err, want)
	}
	af.conn.b.Idle = -time.Second
	if _, err := af.nodeConfig(log); err == nil || !strings.Contains(err.Error(), "--conn-idle-timeout") {
		t.Errorf("admin with a negative idle bound: %v, want it refused naming --conn-idle-timeout", err)
	}
}

// The mesh's own clients that ping keep within the default ping bound, or
// the admin nodes would send them away with too_many_pings: Envoy's xDS
// connection, from prism's bootstrap and the chart's.
func TestEnvoyKeepaliveWithinThePingBound(t *testing.T) {
	t.Parallel()
	b, err := envoy.Bootstrap(envoy.Example)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, a := range c.GetTypedExtensionProtocolOptions() {
			var opts upstreamhttpv3.HttpProtocolOptions
			if err := a.UnmarshalTo(&opts); err != nil {
				t.Fatal(err)
			}
			if ka := opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions().GetConnectionKeepalive(); ka != nil {
				seen++
				if got := ka.GetInterval().AsDuration(); got < connlimit.Default.PingEvery {
					t.Errorf("cluster %s pings every %v, below --conn-min-ping-interval's default %v", c.GetName(), got, connlimit.Default.PingEvery)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no cluster of the bootstrap sets a keepalive: the check checked nothing")
	}
	chart, err := os.ReadFile("../../helm/prism/files/envoy-bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`connection_keepalive:\s*\n\s*interval:\s*(\S+)`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("the chart's Envoy bootstrap sets no connection_keepalive interval")
	}
	if got, err := time.ParseDuration(string(m[1])); err != nil || got < connlimit.Default.PingEvery {
		t.Errorf("the chart's Envoy pings every %s (%v), below --conn-min-ping-interval's default %v", m[1], err, connlimit.Default.PingEvery)
	}
}
