package connlimit

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"

	"golang.org/x/net/http2"
)

// HTTP2 makes s, a server of TLS, serve HTTP/2 with x/net/http2 on
// connections that hold clients to b.PingEvery as Listener does on
// plaintext ones. net/http's own HTTP/2 is handed the *tls.Conn, below
// which the frames cannot be seen; here the frames are read above it. s
// keeps its HTTP2 settings, idle timeout and graceful Shutdown
// (http2.ConfigureServer), and handlers still see the peer's certificate in
// Request.TLS.
//
//nolint:staticcheck // x/net/http2's Server, deprecated for net/http's, is the one HTTP/2 server that serves a net.Conn other than *tls.Conn (ServeConn takes the TLS state from ConnectionState), which the frames must be read on.
func (b Bounds) HTTP2(s *http.Server) error {
	h2 := &http2.Server{}
	if err := http2.ConfigureServer(s, h2); err != nil {
		return fmt.Errorf("http2: %w", err)
	}
	every := b.WithDefaults().PingEvery
	s.TLSNextProto[http2.NextProtoTLS] = func(hs *http.Server, c *tls.Conn, h http.Handler) {
		// net/http hands its per-connection context through the handler,
		// as http2.ConfigureServer's own function reads it.
		var ctx context.Context
		if bc, ok := h.(interface{ BaseContext() context.Context }); ok {
			ctx = bc.BaseContext()
		}
		pc := &pingConn{Conn: c, every: every}
		// ALPN chose h2: the server's writes are frames from the first,
		// which it may flush before the client's preface is read.
		pc.h2.Store(true)
		h2.ServeConn(&tlsPingConn{pingConn: pc, tls: c}, &http2.ServeConnOpts{Context: ctx, Handler: h, BaseConfig: hs})
	}
	return nil
}

// tlsPingConn is a pingConn over TLS that still tells the HTTP/2 server the
// connection's TLS state.
type tlsPingConn struct {
	*pingConn
	tls *tls.Conn
}

func (c *tlsPingConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }
