package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/mesh/pki/kube"
)

func runCerts(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := certsCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestCertsIssueLoads: what `prism certs` issues is what the servers load,
// with the identity asked for, and init never replaces a CA.
func TestCertsIssueLoads(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := runCerts(t, "init", "--dir", dir, "--trust-domain", "example.org"); err != nil {
		t.Fatal(err)
	}
	if _, err := runCerts(t, "init", "--dir", dir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second init: %v; want a refusal to replace the CA", err)
	}
	out, err := runCerts(t, "issue", "proxy", "proxy-01", "--dir", dir, "--host", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "--tls-cert "+filepath.Join(dir, "proxy-proxy-01.pem")) {
		t.Fatalf("issue printed %q", out)
	}
	src, err := pki.Load(pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "proxy-proxy-01.pem"), Key: filepath.Join(dir, "proxy-proxy-01-key.pem")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Identity(); got != (identity.Identity{TrustDomain: "example.org", Role: identity.Proxy, Name: "proxy-01"}) {
		t.Fatalf("identity %v", got)
	}
	for _, bad := range [][]string{{"issue", "root", "x"}, {"issue", "proxy", "a@b"}} {
		if _, err := runCerts(t, append(bad, "--dir", dir)...); err == nil {
			t.Errorf("prism certs %v issued", bad)
		}
	}
	if _, err := runCerts(t, "issue", "proxy", "p", "--dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "certs init") {
		t.Fatalf("issue without a CA: %v", err)
	}
}

// TestTLSFlagsSecureByDefault: a server without TLS files refuses to start
// unless --insecure says so, and the two do not mix.
func TestTLSFlagsSecureByDefault(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		name    string
		f       tlsFlags
		wantErr string
	}{
		{"nothing", tlsFlags{}, "TLS is required"},
		{"insecure", tlsFlags{insecure: true}, ""},
		{"insecure and files", tlsFlags{insecure: true, files: pki.Files{CA: "x"}}, "exclude"},
		{"missing key", tlsFlags{files: pki.Files{CA: "a", Cert: "b"}}, "all required"},
	}
	for _, tc := range cases {
		src, err := tc.f.load(log)
		if tc.wantErr == "" {
			if err != nil || src != nil {
				t.Errorf("%s: %v, %v; want plaintext", tc.name, src, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.wantErr)
		}
	}
}

// TestCertsKubeSecrets: the flags the chart's hook Job passes become
// Secrets keyed as the pods load them (admin and runner by pod name, the
// gateway and operator as tls.crt), each identity the one asked for, and
// a second run issues nothing.
func TestCertsKubeSecrets(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	run := func(args ...string) (string, error) {
		cmd := kubeSecretsCommand(func(kubeconfig, namespace string) (kube.SecretClient, error) {
			return client.CoreV1().Secrets(namespace), nil
		})
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	args := []string{"--namespace=mesh", "--ca-secret=prism-ca", "--trust-domain=mesh.example.com", "--label=app.kubernetes.io/instance=prism",
		"--admin-secret=prism-admin-tls", "--admin-statefulset=prism-admin", "--admin-replicas=3",
		"--runner-secret=prism-runner-tls", "--runner-statefulset=prism-runner", "--runner-replicas=2",
		"--gateway-secret=prism-gateway-tls", "--gateway-name=prism-gateway",
		"--operator-secret=prism-operator-tls", "--operator-name=prismctl"}
	out, err := run(args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "made the CA in Secret mesh/prism-ca") || !strings.Contains(out, "7 certificates issued, 0 kept") {
		t.Fatalf("first run printed %q", out)
	}
	want := map[string]map[string]string{
		"prism-admin-tls":    {"prism-admin-0": "admin/prism-admin-0", "prism-admin-1": "admin/prism-admin-1", "prism-admin-2": "admin/prism-admin-2"},
		"prism-runner-tls":   {"prism-runner-0": "proxy/prism-runner-0", "prism-runner-1": "proxy/prism-runner-1"},
		"prism-gateway-tls":  {"tls": "gateway/prism-gateway"},
		"prism-operator-tls": {"tls": "operator/prismctl"},
	}
	for name, files := range want {
		s, err := client.CoreV1().Secrets("mesh").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Labels["app.kubernetes.io/instance"] != "prism" {
			t.Errorf("Secret %s labels %v", name, s.Labels)
		}
		if len(s.Data) != 1+2*len(files) {
			t.Errorf("Secret %s keys %d, want ca.crt and %d pairs", name, len(s.Data), len(files))
		}
		for file, id := range files {
			block, _ := pem.Decode(s.Data[file+".crt"])
			if block == nil {
				t.Fatalf("Secret %s: no %s.crt", name, file)
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := identity.FromCert(cert); err != nil || got.String() != "spiffe://mesh.example.com/"+id {
				t.Errorf("Secret %s/%s: identity %v (%v), want %s", name, file, got, err, id)
			}
		}
	}
	if out, err := run(args...); err != nil || !strings.Contains(out, "0 certificates issued, 7 kept") || strings.Contains(out, "made the CA") {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ca-secret=c"}, "--namespace and --ca-secret are required"},
		{[]string{"--namespace=n", "--ca-secret=c", "--admin-secret=a"}, "--admin-secret needs --admin-statefulset"},
		{[]string{"--namespace=n", "--ca-secret=c", "--runner-secret=r", "--runner-statefulset=s", "--runner-replicas=-1"}, "--runner-replicas not below 0"},
		{[]string{"--namespace=n", "--ca-secret=c", "--gateway-secret=g"}, "--gateway-secret needs --gateway-name"},
		{[]string{"--namespace=n", "--ca-secret=c", "--operator-secret=o", "--operator-name=a@b"}, "operator name"},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
