// Package conntest checks a listener's connection bounds (internal/connlimit)
// from the outside, as a peer would meet them: a TCP connection that sends
// nothing, an HTTP/2 connection that opens no stream, a client that pings
// too often, and one that pings within the policy.
package conntest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// Slack is what a bound may be exceeded by before a check fails: the server's
// timers and the test's own scheduling on a loaded machine.
const Slack = 3 * time.Second

// ClosedUnused dials addr, sends nothing and fails t unless the server
// closes the connection within bound (plus Slack).
func ClosedUnused(t testing.TB, addr string, bound time.Duration) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(bound + Slack))
	_, err = io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: a connection that sent nothing was still open after %v (bound %v)", addr, time.Since(start), bound)
	}
}

// H2 is a raw HTTP/2 client connection: the preface and an empty SETTINGS
// frame are written, the server's SETTINGS acknowledged as they come.
type H2 struct {
	t     testing.TB
	addr  string
	conn  net.Conn
	fr    *http2.Framer
	start time.Time
	wmu   sync.Mutex // the framer's writes: pings, requests and SETTINGS acks
	// stream is the last stream this client opened (none: 2^32-1, so that
	// the first is 1).
	stream uint32
}

// DialH2 opens an HTTP/2 connection to addr: with cfg over TLS (ALPN h2),
// otherwise h2c with prior knowledge.
func DialH2(t testing.TB, addr string, cfg *tls.Config) *H2 {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"h2"}
		tc := tls.Client(c, cfg)
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			c.Close()
			t.Fatalf("%s: TLS handshake: %v", addr, err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			c.Close()
			t.Fatalf("%s: ALPN chose %q, want h2", addr, p)
		}
		_ = tc.SetDeadline(time.Time{})
		c = tc
	}
	h := &H2{t: t, addr: addr, conn: c, fr: http2.NewFramer(c, c), start: time.Now(), stream: ^uint32(0)}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// Ping writes one PING.
func (h *H2) Ping(data [8]byte) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return h.fr.WritePing(false, data)
}

// Get sends GET path on a new stream and fails t unless the server
// answers it, through to the end of its stream.
func (h *H2) Get(path string) {
	h.t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "test"}, {":path", path}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	h.stream += 2 // client streams are odd: 1, 3, 5...
	h.wmu.Lock()
	err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.stream, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
	h.wmu.Unlock()
	if err != nil {
		h.t.Fatalf("%s: GET %s: %v", h.addr, path, err)
	}
	for {
		f, err := h.next(Slack)
		if err != nil {
			h.t.Fatalf("%s: GET %s unanswered: %v", h.addr, path, err)
		}
		if f.Header().StreamID == h.stream && f.Header().Flags.Has(http2.FlagDataEndStream) {
			return
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			h.t.Fatalf("%s: GET %s: the server sent GOAWAY %v %q", h.addr, path, g.ErrCode, g.DebugData())
		}
	}
}

// next reads the next frame other than SETTINGS, WINDOW_UPDATE and the
// server's own PINGs, until d.
func (h *H2) next(d time.Duration) (http2.Frame, error) {
	_ = h.conn.SetReadDeadline(time.Now().Add(d))
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.wmu.Lock()
				err := h.fr.WriteSettingsAck()
				h.wmu.Unlock()
				if err != nil {
					return nil, err
				}
			}
		case *http2.PingFrame:
			if f.IsAck() {
				return f, nil
			}
			// Acknowledged as any HTTP/2 client does: grpc-go's graceful
			// close waits for this ack (at most 5 s) before its last GOAWAY.
			h.wmu.Lock()
			err := h.fr.WritePing(true, f.Data)
			h.wmu.Unlock()
			if err != nil {
				return nil, err
			}
		case *http2.WindowUpdateFrame:
		default:
			return f, nil
		}
	}
}

// GoAway is what a server's GOAWAY said.
type GoAway struct {
	Code  http2.ErrCode
	Debug string
}

// SentAway fails t unless the server sends GOAWAY and closes the
// connection within bound (plus Slack) of its opening, and returns the
// last GOAWAY.
func (h *H2) SentAway(bound time.Duration) GoAway {
	h.t.Helper()
	var away *GoAway
	for {
		left := time.Until(h.start.Add(bound + Slack))
		f, err := h.next(left)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			h.t.Fatalf("%s: the connection was still open after %v (bound %v)", h.addr, time.Since(h.start), bound)
		}
		if err != nil {
			if away == nil {
				h.t.Fatalf("%s: the connection ended without a GOAWAY after %v: %v", h.addr, time.Since(h.start), err)
			}
			return *away
		}
		// The framer reuses its frames: what is kept is copied.
		if g, ok := f.(*http2.GoAwayFrame); ok {
			away = &GoAway{Code: g.ErrCode, Debug: string(g.DebugData())}
		}
	}
}

// IdleClosed dials addr as DialH2 does, opens no stream, and fails t unless
// the server sends it away within bound.
func IdleClosed(t testing.TB, addr string, cfg *tls.Config, bound time.Duration) {
	t.Helper()
	DialH2(t, addr, cfg).SentAway(bound)
}

// PingFloodSentAway pings addr every millisecond on a connection without
// streams and fails t unless the server answers GOAWAY ENHANCE_YOUR_CALM
// "too_many_pings" and closes, as grpc-go's keepalive enforcement does.
func PingFloodSentAway(t testing.TB, addr string, cfg *tls.Config) {
	t.Helper()
	h := DialH2(t, addr, cfg)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if h.Ping([8]byte{byte(i)}) != nil {
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	g := h.SentAway(0)
	if g.Code != http2.ErrCodeEnhanceYourCalm || g.Debug != "too_many_pings" {
		t.Fatalf("%s: a ping flood got GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", addr, g.Code, g.Debug)
	}
}

// PingsAnswered pings addr n times, every, and fails t unless each is
// acknowledged and the server never sends GOAWAY: a client keeping to the
// ping policy is not cut. n*every must stay below the listener's idle bound.
func PingsAnswered(t testing.TB, addr string, cfg *tls.Config, every time.Duration, n int) {
	t.Helper()
	h := DialH2(t, addr, cfg)
	for i := range n {
		if i > 0 {
			time.Sleep(every)
		}
		data := [8]byte{7, byte(i)}
		if err := h.Ping(data); err != nil {
			t.Fatalf("%s: ping %d: %v", addr, i, err)
		}
		f, err := h.next(Slack)
		if err != nil {
			t.Fatalf("%s: ping %d at %v unanswered: %v", addr, i, time.Since(h.start), err)
		}
		p, ok := f.(*http2.PingFrame)
		if !ok || !p.IsAck() || p.Data != data {
			t.Fatalf("%s: ping %d answered %v, want its ACK", addr, i, f)
		}
	}
}

// HTTP1IdleClosed sends one HTTP/1.1 GET path to addr (over TLS with cfg),
// reads the answer and fails t unless the server closes the kept-alive
// connection within bound (plus Slack) of the answer.
func HTTP1IdleClosed(t testing.TB, addr string, cfg *tls.Config, path string, bound time.Duration) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		c = tls.Client(c, cfg)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: GET %s: %v", addr, path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	_ = c.SetDeadline(start.Add(bound + Slack))
	_, err = io.Copy(io.Discard, br)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: a kept-alive HTTP/1.1 connection was still open %v after its answer (bound %v)", addr, time.Since(start), bound)
	}
}

// Keepalive is how a long-lived client of the mesh pings: as often as
// grpc-go allows (10 s), with or without a call in progress.
func Keepalive() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true})
}

// StreamHeld opens a health Watch on cc, holds it for hold, and fails t
// unless cc's connection stayed up all along: a client with a stream open
// is never idle, however long the stream is quiet.
func StreamHeld(t testing.TB, cc *grpc.ClientConn, hold time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hold+Slack)
	defer cancel()
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("health watch: %v", err)
	}
	start := time.Now()
	held, stop := context.WithTimeout(ctx, hold)
	defer stop()
	if cc.WaitForStateChange(held, connectivity.Ready) {
		t.Fatalf("%s: the connection went %v after %v with a stream open (to hold %v)", cc.Target(), cc.GetState(), time.Since(start), hold)
	}
}

// CallsHeld makes call on cc every interval until hold has passed and fails
// t unless cc's connection stayed up all along: a client calling more often
// than the idle bound (the sidecar, every heartbeat) is never sent away.
func CallsHeld(t testing.TB, cc *grpc.ClientConn, hold, every time.Duration, call func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hold+Slack)
	defer cancel()
	if err := call(ctx); err != nil {
		t.Fatalf("first call: %v", err)
	}
	start := time.Now()
	changed := make(chan connectivity.State, 1)
	held, stop := context.WithTimeout(ctx, hold)
	defer stop()
	go func() {
		if cc.WaitForStateChange(held, connectivity.Ready) {
			changed <- cc.GetState()
		}
		close(changed)
	}()
	for {
		select {
		case st, ok := <-changed:
			if ok {
				t.Fatalf("%s: the connection went %v after %v of calls every %v", cc.Target(), st, time.Since(start), every)
			}
			return
		case <-time.After(every):
		}
		if err := call(ctx); err != nil {
			t.Fatalf("call after %v: %v", time.Since(start), err)
		}
	}
}

// PingsBetweenAnswers pings addr n times, each right after an answer to a
// GET path (as grpc-go's BDP pings follow the data they measure), and
// fails t unless every ping is acknowledged and no GOAWAY comes: a ping
// after an answer is never a strike, however soon.
func PingsBetweenAnswers(t testing.TB, addr string, cfg *tls.Config, path string, n int) {
	t.Helper()
	h := DialH2(t, addr, cfg)
	for i := range n {
		h.Get(path)
		data := [8]byte{9, byte(i)}
		if err := h.Ping(data); err != nil {
			t.Fatalf("%s: ping %d: %v", addr, i, err)
		}
		f, err := h.next(Slack)
		if err != nil {
			t.Fatalf("%s: ping %d unanswered: %v", addr, i, err)
		}
		if p, ok := f.(*http2.PingFrame); !ok || !p.IsAck() || p.Data != data {
			t.Fatalf("%s: ping %d answered %v, want its ACK", addr, i, f)
		}
	}
}
