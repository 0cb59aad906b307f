// Package connlimit holds the bounds every Prism listener puts on a
// connection before and between its requests, so that a peer that connects
// and then does nothing useful costs a goroutine and its buffers for a
// bounded time only (docs/security.md#connection-bounds):
//
//   - Handshake: from accept to a connection that carries requests. On a
//     gRPC server (grpc.ConnectionTimeout) it covers the TLS handshake, the
//     HTTP/2 client preface and its first SETTINGS frame. On a net/http
//     server it is ReadHeaderTimeout, which Go also applies to the TLS
//     handshake and, before the first request, to the wait for its headers
//     (or for the h2c preface); after a TLS handshake that picked h2, Go's
//     HTTP/2 server waits a fixed 10 s for the preface.
//   - Idle: a connection with no request or stream in progress for this
//     long is sent away (GOAWAY, or a close between HTTP/1.1 requests); one
//     that never opened a stream counts from its start. PINGs are not
//     activity, so a peer that only pings is sent away too.
//   - PingEvery: the most often a client may ping. gRPC enforces it itself
//     (keepalive.EnforcementPolicy); net/http's HTTP/2 answers every PING,
//     so Listener enforces the same rule on plaintext connections and HTTP2
//     on TLS ones.
//
// The mesh's own long-lived clients stay within these bounds: the sidecar's
// admin and runner connections call every heartbeat, gateways' and Envoys'
// xDS streams stay open, Envoy health-checks every runner every few seconds,
// and no client pings more often than every 10 s (Envoy's xDS keepalive;
// grpc-go never pings more often than that).
package connlimit

import (
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Bounds are one listener's connection bounds; a zero field takes its
// Default.
type Bounds struct {
	// Handshake bounds the time from accept to a usable connection (TLS
	// handshake, HTTP/2 preface and SETTINGS, or a first request's headers).
	Handshake time.Duration
	// Idle sends away a connection without a request or stream in progress
	// for this long; pings do not count.
	Idle time.Duration
	// PingEvery is the shortest interval between a client's pings: a client
	// pinging more often three times in a row without an answer's data in
	// between is sent away with GOAWAY ENHANCE_YOUR_CALM "too_many_pings",
	// as grpc-go does.
	PingEvery time.Duration
}

// Default are the bounds of every listener unless its flags say otherwise:
// short against a peer that sends nothing, long against the mesh's own
// clients (see the package doc).
var Default = Bounds{Handshake: 10 * time.Second, Idle: time.Minute, PingEvery: 5 * time.Second}

// WithDefaults fills b's zero fields from Default.
func (b Bounds) WithDefaults() Bounds {
	if b.Handshake == 0 {
		b.Handshake = Default.Handshake
	}
	if b.Idle == 0 {
		b.Idle = Default.Idle
	}
	if b.PingEvery == 0 {
		b.PingEvery = Default.PingEvery
	}
	return b
}

// GRPC are b as grpc-go server options. Pings without a call in progress
// are permitted (at the same rate): a client keeping its connection warm
// between calls is no cost the idle bound does not already cap.
func (b Bounds) GRPC() []grpc.ServerOption {
	b = b.WithDefaults()
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(b.Handshake),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: b.Idle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: b.PingEvery, PermitWithoutStream: true}),
	}
}

// HTTP sets b's handshake and idle bounds on s and returns it. A server that
// speaks h2c also needs Listener for the ping bound, one that speaks HTTP/2
// over TLS HTTP2.
func (b Bounds) HTTP(s *http.Server) *http.Server {
	b = b.WithDefaults()
	s.ReadHeaderTimeout = b.Handshake
	s.IdleTimeout = b.Idle
	return s
}
