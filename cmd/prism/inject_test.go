package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/testbin"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "prism-inject"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestInjectCommand runs `prism inject` as a process: it serves a review
// over verified TLS with the flags' defaults and stops cleanly on SIGTERM.
func TestInjectCommand(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	cmd := exec.Command(bin, "inject", "--addr", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile,
		"--sidecar-image", "prism:test", "--admin-endpoints", "admin-0:7001,admin-1:7001", "--lease-ttl", "20s",
		"--mesh-tls", "csi", "--mesh-issuer-name", "prism-ca", "--mesh-trust-domain", "mesh.example.com")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	addrc := make(chan string, 1)
	var logs bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "injector listening" {
				addrc <- line.Addr
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var addr string
	select {
	case addr = <-addrc:
	case err := <-exited:
		t.Fatalf("prism inject exited early: %v\n%s", err, logs.String())
	case <-time.After(60 * time.Second):
		t.Fatal("prism inject did not report its address")
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",
		"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},
		"operation":"CREATE","namespace":"mesh","object":{"apiVersion":"v1","kind":"Pod",
		"metadata":{"name":"r-0","labels":{"prism.io/inject":"true"}},"spec":{"containers":[{"name":"runner","image":"prism:test"}]}}}}`
	resp, err := client.Post("https://"+addr+"/inject", "application/json", strings.NewReader(review))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Response struct {
			UID     string `json:"uid"`
			Allowed bool   `json:"allowed"`
			Patch   []byte `json:"patch"`
		} `json:"response"`
	}
	if err := json.Unmarshal(body, &out); err != nil || !out.Response.Allowed || out.Response.UID != "u-1" {
		t.Fatalf("review answer %d %s: %v", resp.StatusCode, body, err)
	}
	// The flags became the injected container's configuration.
	for _, want := range []string{`"value":"admin-0:7001,admin-1:7001"`, `"value":"20s"`, `"image":"prism:test"`,
		`"driver":"csi.cert-manager.io"`, `"csi.cert-manager.io/issuer-name":"prism-ca"`, `"spiffe://mesh.example.com/proxy/${POD_NAME}"`} {
		if !bytes.Contains(out.Response.Patch, []byte(want)) {
			t.Errorf("patch lacks %s: %s", want, out.Response.Patch)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("prism inject ignored SIGTERM")
	}
}

func TestInjectCommandRefusesBadConfig(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, _ := selfSigned(t, t.TempDir())
	base := []string{"inject", "--addr", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--mesh-tls", "insecure"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no sidecar image", []string{"--admin-endpoints", "a:1"}, "--sidecar-image"},
		{"no admin endpoints", []string{"--sidecar-image", "p"}, "--admin-endpoints"},
		{"heartbeat not below ttl", []string{"--sidecar-image", "p", "--admin-endpoints", "a:1", "--lease-ttl", "5s", "--heartbeat-interval", "5s"}, "shorter than lease ttl"},
		{"no mesh tls mode", []string{"--sidecar-image", "p", "--admin-endpoints", "a:1", "--mesh-tls", ""}, "--mesh-tls"},
		{"csi without an issuer", []string{"--sidecar-image", "p", "--admin-endpoints", "a:1", "--mesh-tls", "csi"}, "--mesh-issuer-name"},
		{"missing key file", []string{"--sidecar-image", "p", "--admin-endpoints", "a:1", "--tls-key", "/nonexistent/tls.key"}, "/nonexistent/tls.key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command(bin, append(append([]string{}, base...), tc.args...)...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("err %v, output %q: want a failure naming %q", err, out, tc.want)
			}
		})
	}
}
