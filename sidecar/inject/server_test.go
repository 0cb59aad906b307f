package inject

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/testkit/conntest"
)

// startServer runs the real HTTPS server on loopback with the pair in dir
// and returns its URL; the server stops when the test ends.
func startServer(t testing.TB, certFile, keyFile string) string {
	t.Helper()
	return startBoundedServer(t, certFile, keyFile, connlimit.Bounds{})
}

// startBoundedServer is startServer with its connections held to bounds.
func startBoundedServer(t testing.TB, certFile, keyFile string, bounds connlimit.Bounds) string {
	t.Helper()
	w, reg := newTestWebhook(t)
	certs, err := NewCertReloader(certFile, keyFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, NewHandler(w, reg), certs, bounds, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve returned %v after shutdown", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("server did not stop")
		}
	})
	return "https://" + ln.Addr().String()
}

func trustingClient(certs ...*x509.Certificate) *http.Client {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return &http.Client{
		Timeout: 30 * time.Second,
		// No keep-alive: each request is a new handshake, so a rotated
		// certificate is seen by the next request.
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
	}
}

func TestServesReviewsOverVerifiedTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := writeSelfSigned(t, certFile, keyFile, 1)
	url := startServer(t, certFile, keyFile)
	client := trustingClient(first)

	original := mustJSON(t, runnerPod())
	resp, err := client.Post(url+PathInjectPod, "application/json", bytes.NewReader(reviewFor(t, original, admissionv1.Create, podKind)))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if pod := decodePodStrict(t, applyPatch(t, original, decodeResponse(t, body))); sidecarCount(pod) != 1 {
		t.Fatalf("sidecar count %d over TLS", sidecarCount(pod))
	}

	// A client that does not trust the server's certificate is refused.
	if resp, err := trustingClient().Get(url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("handshake succeeded without trusting the certificate")
	}

	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ok",
		"/metrics": `prism_inject_requests_total{outcome="injected"} 1`,
	} {
		r, err := client.Get(url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b := readAll(t, r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d, body lacks %q:\n%s", path, r.StatusCode, want, b)
		}
	}

	// Rotation: the files change under the running server (as a Secret
	// update does) and new connections get the new certificate.
	second := writeSelfSigned(t, certFile, keyFile, 2)
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "https://"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		serial := conn.ConnectionState().PeerCertificates[0].SerialNumber
		conn.Close()
		if serial.Cmp(second.SerialNumber) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving serial %v after rotation", serial)
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err = trustingClient(second).Get(url + "/healthz")
	if err != nil {
		t.Fatalf("rotated certificate not verifiable: %v", err)
	}
	resp.Body.Close()
}

func TestCertReloaderKeepsLastGoodPair(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, err := NewCertReloader(certFile, keyFile, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("missing files accepted at start")
	}
	good := writeSelfSigned(t, certFile, keyFile, 7)
	r, err := NewCertReloader(certFile, keyFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// Half-way through a rotation only the certificate has changed.
	writeFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\nnot a cert\n-----END CERTIFICATE-----\n"))
	c, err := r.GetCertificate(nil)
	if err != nil || c == nil {
		t.Fatalf("GetCertificate: %v %v", c, err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil || leaf.SerialNumber.Cmp(good.SerialNumber) != 0 {
		t.Fatalf("served %v, want the last good certificate", leaf)
	}
}

// The injector's listener bounds its connections
// (docs/security.md#connection-bounds): one without a TLS handshake is
// closed within the handshake bound, an HTTP/2 one without a stream within
// the idle bound, a ping flood is sent away and pings within the policy
// are answered.
func TestInjectorConnectionBounds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	cert := writeSelfSigned(t, certFile, keyFile, 1)
	b := connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}
	addr := strings.TrimPrefix(startBoundedServer(t, certFile, keyFile, b), "https://")
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	apiServer := &tls.Config{RootCAs: pool, ServerName: "prism-inject.prism.svc", MinVersion: tls.VersionTLS12}
	cases := map[string]func(t *testing.T){
		"nothing sent":            func(t *testing.T) { conntest.ClosedUnused(t, addr, b.Handshake) },
		"no stream":               func(t *testing.T) { conntest.IdleClosed(t, addr, apiServer, b.Idle) },
		"ping flood":              func(t *testing.T) { conntest.PingFloodSentAway(t, addr, apiServer) },
		"pings within the policy": func(t *testing.T) { conntest.PingsAnswered(t, addr, apiServer, 2*b.PingEvery, 4) },
	}
	for name, check := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			check(t)
		})
	}
}
