package connlimit_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prism-mesh/prism/internal/connlimit"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/conntest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// small are bounds short enough for a test to outwait.
var small = connlimit.Bounds{Handshake: 300 * time.Millisecond, Idle: time.Second, PingEvery: 100 * time.Millisecond}

// serveH2C serves an h2c net/http server with b on a loopback port; police
// puts b.Listener in front of it.
func serveH2C(t *testing.T, b connlimit.Bounds, police bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	s := b.HTTP(&http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})})
	if police {
		ln = b.Listener(ln)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String()
}

func serveGRPC(t *testing.T, b connlimit.Bounds) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(b.GRPC()...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

func TestHTTPBounds(t *testing.T) {
	t.Parallel()
	addr := serveH2C(t, small, true)
	t.Run("nothing sent", func(t *testing.T) { t.Parallel(); conntest.ClosedUnused(t, addr, small.Handshake) })
	t.Run("no stream", func(t *testing.T) { t.Parallel(); conntest.IdleClosed(t, addr, nil, small.Idle) })
	t.Run("ping flood", func(t *testing.T) { t.Parallel(); conntest.PingFloodSentAway(t, addr, nil) })
	t.Run("pings within the policy", func(t *testing.T) {
		t.Parallel()
		conntest.PingsAnswered(t, addr, nil, 2*small.PingEvery, 4)
	})
	t.Run("pings between answers", func(t *testing.T) {
		t.Parallel()
		conntest.PingsBetweenAnswers(t, addr, nil, "/", 6)
	})
}

func TestGRPCBounds(t *testing.T) {
	t.Parallel()
	addr := serveGRPC(t, small)
	t.Run("nothing sent", func(t *testing.T) { t.Parallel(); conntest.ClosedUnused(t, addr, small.Handshake) })
	t.Run("no stream", func(t *testing.T) { t.Parallel(); conntest.IdleClosed(t, addr, nil, small.Idle) })
	t.Run("ping flood", func(t *testing.T) { t.Parallel(); conntest.PingFloodSentAway(t, addr, nil) })
	t.Run("pings within the policy", func(t *testing.T) {
		t.Parallel()
		conntest.PingsAnswered(t, addr, nil, 2*small.PingEvery, 4)
	})
}

// Without Listener, net/http's HTTP/2 answers a ping flood: the policing is
// what sends it away.
func TestHTTPWithoutListenerAnswersAFlood(t *testing.T) {
	t.Parallel()
	addr := serveH2C(t, small, false)
	conntest.PingsAnswered(t, addr, nil, 0, 50)
}

// A TLS server whose HTTP/2 HTTP2 serves sends a ping flood away, keeps a
// client pinging within the policy, closes a stream-less connection within
// the idle bound, and its handlers see the client's certificate.
func TestTLSHTTP2Bounds(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := small.HTTP(&http.Server{
		HTTP2:     &http.HTTP2Config{MaxConcurrentStreams: 7},
		TLSConfig: p.Source(identity.Proxy, "p").ServerConfig(pki.Any),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
				http.Error(w, "no client certificate", http.StatusUnauthorized)
				return
			}
			_, _ = io.WriteString(w, r.Proto)
		}),
	})
	if err := small.HTTP2(s); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = s.Close() })
	addr := ln.Addr().String()
	client := p.Source(identity.Gateway, "gw").ClientConfig(pki.RoleIs(identity.Proxy))
	t.Run("ping flood", func(t *testing.T) { t.Parallel(); conntest.PingFloodSentAway(t, addr, client) })
	t.Run("pings within the policy", func(t *testing.T) {
		t.Parallel()
		conntest.PingsAnswered(t, addr, client, 2*small.PingEvery, 4)
	})
	t.Run("no stream", func(t *testing.T) { t.Parallel(); conntest.IdleClosed(t, addr, client, small.Idle) })
	t.Run("pings between answers", func(t *testing.T) {
		t.Parallel()
		conntest.PingsBetweenAnswers(t, addr, client, "/", 6)
	})
	t.Run("the server's HTTP2 settings", func(t *testing.T) {
		t.Parallel()
		cfg := client.Clone()
		cfg.NextProtos = []string{"h2"}
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(conntest.Slack))
		if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
			t.Fatal(err)
		}
		f, err := http2.NewFramer(c, c).ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok {
			t.Fatalf("first frame %v, want SETTINGS", f)
		}
		if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != 7 {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (%v), want the server's 7", v, ok)
		}
	})
	t.Run("a request sees the certificate", func(t *testing.T) {
		t.Parallel()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: client.Clone(), ForceAttemptHTTP2: true}}
		defer hc.CloseIdleConnections()
		resp, err := hc.Get("https://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "HTTP/2.0" {
			t.Fatalf("GET over TLS: %d %q, want 200 HTTP/2.0", resp.StatusCode, body)
		}
	})
}
