package envoy

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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
		})
	}
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
