package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	grpcxds "google.golang.org/grpc/xds"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// TestBootstrapTLS: with the gateway's files the bootstrap dials the admin
// nodes with MTLSCredsType and defines the file_watcher certificate provider
// the control plane's clusters name; grpc-go accepts it, and refuses to
// start when the files cannot be loaded.
func TestBootstrapTLS(t *testing.T) {
	t.Parallel()
	files := pkitest.New(t).Files(identity.Gateway, "gw-1")
	b, err := Bootstrap([]string{"127.0.0.1:1"}, "gw-1", &files)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		XDSServers []struct {
			Creds []struct {
				Type   string            `json:"type"`
				Config map[string]string `json:"config"`
			} `json:"channel_creds"`
		} `json:"xds_servers"`
		Providers map[string]struct {
			Plugin string            `json:"plugin_name"`
			Config map[string]string `json:"config"`
		} `json:"certificate_providers"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ca_certificate_file": files.CA, "certificate_file": files.Cert, "private_key_file": files.Key}
	if len(got.XDSServers) != 1 || len(got.XDSServers[0].Creds) != 1 || got.XDSServers[0].Creds[0].Type != MTLSCredsType ||
		!sameFiles(got.XDSServers[0].Creds[0].Config, want) {
		t.Errorf("xds server credentials = %+v, want %s with %v", got.XDSServers, MTLSCredsType, want)
	}
	p, ok := got.Providers[mesh.CertProviderInstance]
	if !ok || p.Plugin != "file_watcher" || !sameFiles(p.Config, want) || p.Config["refresh_interval"] == "" {
		t.Errorf("certificate provider %q = %+v, want file_watcher with %v", mesh.CertProviderInstance, got.Providers, want)
	}
	if _, err := grpcxds.NewXDSResolverWithConfigForTesting(b); err != nil {
		t.Fatalf("grpc-go refuses the TLS bootstrap %s: %v", b, err)
	}

	for _, tc := range []struct {
		name  string
		files pki.Files
		want  string
	}{
		{"no key", pki.Files{CA: files.CA, Cert: files.Cert}, "all required"},
		{"no CA", pki.Files{Cert: files.Cert, Key: files.Key}, "all required"},
	} {
		if _, err := Bootstrap([]string{"127.0.0.1:1"}, "gw-1", &tc.files); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, _, err := (mtlsCreds{}).Build(json.RawMessage(`{"ca_certificate_file":"/nonexistent","certificate_file":"/nonexistent","private_key_file":"/nonexistent"}`)); err == nil {
		t.Error("channel credentials built from files that do not exist")
	}
}

func sameFiles(got, want map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
