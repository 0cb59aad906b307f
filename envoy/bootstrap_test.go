package envoy

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden bootstraps")

// TestBootstrapGolden renders every testdata/*.in.yaml config and the
// Example (bootstrap.yaml), compares with the golden file, and parses the
// golden file back into Envoy's bootstrap proto with ValidateAll.
func TestBootstrapGolden(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob("testdata/*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	cases := map[string]func(t *testing.T) Config{"bootstrap.yaml": func(*testing.T) Config { return Example }}
	for _, in := range inputs {
		cases[strings.TrimSuffix(in, ".in.yaml")+".bootstrap.yaml"] = func(t *testing.T) Config {
			b, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			var c Config
			if err := yaml.UnmarshalStrict(b, &c); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	for out, config := range cases {
		t.Run(out, func(t *testing.T) {
			t.Parallel()
			got, err := YAML(config(t))
			if err != nil {
				got = []byte("error: " + err.Error() + "\n")
			}
			if *update {
				if err := os.WriteFile(out, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("%v (run go test ./envoy -update)", err)
			}
			if string(got) != string(want) {
				t.Fatalf("%s differs (run go test ./envoy -update and review):\n%s", out, got)
			}
			if strings.HasPrefix(string(want), "error: ") {
				return
			}
			b, err := Parse(want)
			if err != nil {
				t.Fatalf("%s does not parse as an Envoy bootstrap: %v", out, err)
			}
			if ip, err := netip.ParseAddr(b.GetAdmin().GetAddress().GetSocketAddress().GetAddress()); err != nil || !ip.IsLoopback() {
				t.Errorf("%s: admin interface not on loopback", out)
			}
			if b.GetDynamicResources().GetAdsConfig().GetApiType() != corev3.ApiConfigSource_DELTA_GRPC {
				t.Errorf("%s: not delta ADS over gRPC", out)
			}
			for what, src := range map[string]*corev3.ConfigSource{"cds": b.GetDynamicResources().GetCdsConfig(), "lds": b.GetDynamicResources().GetLdsConfig()} {
				if ft := src.GetInitialFetchTimeout(); ft == nil || ft.AsDuration() != 0 {
					t.Errorf("%s: %s initial_fetch_timeout %v, want 0s (wait for the admin nodes before going LIVE)", out, what, ft)
				}
			}
			if config(t).StatsAddress == "" {
				if n := len(b.GetStaticResources().GetListeners()); n != 0 || len(b.GetStaticResources().GetClusters()) != 1 {
					t.Errorf("%s: no stats address, yet %d static listeners or a cluster besides %s", out, n, XDSCluster)
				}
			} else {
				checkStatsListener(t, out, b)
			}
		})
	}
}

// checkStatsListener: the only static listener passes GET /stats/prometheus
// and GET /ready, and nothing else, to the admin interface.
func checkStatsListener(t *testing.T, name string, b *bootstrapv3.Bootstrap) {
	t.Helper()
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || ls[0].GetName() != StatsListener || !ls[0].GetIgnoreGlobalConnLimit() {
		t.Fatalf("%s: static listeners %v, want only %s, exempt from the connection limit", name, ls, StatsListener)
	}
	chains := ls[0].GetFilterChains()
	if len(chains) != 1 || len(chains[0].GetFilters()) != 1 {
		t.Fatalf("%s: stats listener filter chains %v", name, chains)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := chains[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatalf("%s: stats listener: %v", name, err)
	}
	var paths []string
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			h := r.GetMatch().GetHeaders()
			if len(h) != 1 || h[0].GetName() != ":method" || h[0].GetStringMatch().GetExact() != "GET" {
				t.Errorf("%s: stats route %s is not GET only", name, r.GetMatch().GetPath())
			}
			if r.GetRoute().GetCluster() != AdminInterfaceCluster {
				t.Errorf("%s: stats route %s goes to %q", name, r.GetMatch().GetPath(), r.GetRoute().GetCluster())
			}
			paths = append(paths, r.GetMatch().GetPath())
		}
	}
	if !slices.Equal(paths, []string{StatsPath, ReadyPath}) {
		t.Errorf("%s: stats listener passes %q, want exactly %s and %s", name, paths, StatsPath, ReadyPath)
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != AdminInterfaceCluster {
			continue
		}
		ep := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress()
		if !proto.Equal(ep, b.GetAdmin().GetAddress()) {
			t.Errorf("%s: %s reaches %v, the admin interface is on %v", name, AdminInterfaceCluster, ep, b.GetAdmin().GetAddress())
		}
		return
	}
	t.Errorf("%s: no %s cluster", name, AdminInterfaceCluster)
}

func TestBootstrapRejectsBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		c    Config
		want string
	}{
		{"no admin nodes", Config{NodeID: "g"}, "at least one admin node"},
		{"admin node without port", Config{AdminNodes: []string{"10.0.0.1"}}, "admin nodes"},
		{"admin interface exposed", Config{AdminNodes: []string{"10.0.0.1:8981"}, AdminAddress: "0.0.0.0:9901"}, "loopback"},
		{"stats listener on a name", Config{AdminNodes: []string{"10.0.0.1:8981"}, StatsAddress: "localhost:9902"}, "binds an IP"},
		{"stats listener without port", Config{AdminNodes: []string{"10.0.0.1:8981"}, StatsAddress: "0.0.0.0"}, "stats address"},
		{"stats listener on the admin port", Config{AdminNodes: []string{"10.0.0.1:8981"}, StatsAddress: "0.0.0.0:9901"}, "share a port"},
		{"negative connection limit", Config{AdminNodes: []string{"10.0.0.1:8981"}, MaxConnections: -1}, "must be positive"},
		{"TLS without a key", Config{AdminNodes: []string{"10.0.0.1:8981"}, TLS: &TLS{CA: "ca.pem", Cert: "tls.crt"}}, "all required"},
		{"TLS with a bad trust domain", Config{AdminNodes: []string{"10.0.0.1:8981"}, TLS: &TLS{CA: "ca.pem", Cert: "tls.crt", Key: "tls.key", TrustDomain: "Not A Domain"}}, "trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Bootstrap(tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Bootstrap() = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
