package connlimit

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener enforces b.PingEvery on the HTTP/2 connections ln accepts in
// plaintext (h2c with prior knowledge), by grpc-go's rule: a client PING
// sooner than PingEvery after the previous one, with no DATA or HEADERS
// written by the server in between, is a strike, and the third strike in a
// row sends the connection away with GOAWAY ENHANCE_YOUR_CALM
// "too_many_pings". net/http's HTTP/2 server answers every PING and has no
// such bound of its own. A connection that does not open with the HTTP/2
// preface (HTTP/1.1, or TLS, whose frames this layer cannot see) passes
// through untouched, so a TLS server relies on its handshake and the idle
// bound alone.
func (b Bounds) Listener(ln net.Listener) net.Listener {
	return &pingListener{Listener: ln, every: b.WithDefaults().PingEvery}
}

type pingListener struct {
	net.Listener
	every time.Duration
}

func (l *pingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &pingConn{Conn: c, every: l.every}, nil
}

// maxPingStrikes is grpc-go's: the connection goes on the strike after it.
const maxPingStrikes = 2

var clientPreface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// HTTP/2 frame types and flags (RFC 9113 §6) this layer looks at.
const (
	frameData       = 0x0
	frameHeaders    = 0x1
	framePing       = 0x6
	frameGoAway     = 0x7
	flagAck         = 0x1
	enhanceYourCalm = 0xb
)

type pingConn struct {
	net.Conn
	every time.Duration

	rmu        sync.Mutex // the read side; net/http reads from one goroutine at a time
	preface    int        // preface bytes matched so far; -1: not HTTP/2
	in         frames
	lastStream uint32 // the highest stream a HEADERS frame named
	lastPing   time.Time
	strikes    int
	sentAway   bool

	wmu sync.Mutex // serializes writes and guards out
	out frames
	// h2 is set once the preface is read: from then on writes are frames.
	h2 atomic.Bool
	// answered is set when the server writes DATA or HEADERS, and cleared
	// by the next ping: a ping after an answer is never a strike.
	answered atomic.Bool
}

func (c *pingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.scanIn(p[:n])
	}
	return n, err
}

func (c *pingConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.Conn.Write(p)
	if c.h2.Load() {
		c.out.feed(p[:n], func(h header) {
			if t := h.typ(); t == frameData || t == frameHeaders {
				c.answered.Store(true)
			}
		})
	}
	return n, err
}

func (c *pingConn) scanIn(b []byte) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.preface < 0 || c.sentAway {
		return
	}
	if c.preface < len(clientPreface) {
		k := min(len(b), len(clientPreface)-c.preface)
		if !bytes.Equal(b[:k], clientPreface[c.preface:c.preface+k]) {
			c.preface = -1
			return
		}
		c.preface += k
		b = b[k:]
		if c.preface < len(clientPreface) {
			return
		}
		c.h2.Store(true)
	}
	c.in.feed(b, c.received)
}

func (c *pingConn) received(h header) {
	switch {
	case h.typ() == frameHeaders && h.stream() > c.lastStream:
		c.lastStream = h.stream()
	case h.typ() == framePing && h.flags()&flagAck == 0 && !c.sentAway:
		now := time.Now()
		switch {
		case c.answered.Swap(false):
			c.strikes = 0
		case now.Sub(c.lastPing) < c.every:
			c.strikes++
		}
		c.lastPing = now
		if c.strikes > maxPingStrikes {
			c.sendAway()
		}
	}
}

// sendAway writes GOAWAY ENHANCE_YOUR_CALM "too_many_pings" when no write is
// in progress and the last one ended on a frame boundary (a frame of its own
// must not land inside the server's), then closes the connection; the
// server's reads and writes fail from then on.
func (c *pingConn) sendAway() {
	c.sentAway = true
	if c.wmu.TryLock() {
		if c.out.boundary() {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Conn.Write(goAway(c.lastStream, enhanceYourCalm, "too_many_pings"))
		}
		c.wmu.Unlock()
	}
	_ = c.Close()
}

func goAway(lastStream, code uint32, debug string) []byte {
	f := make([]byte, 9+8+len(debug))
	n := 8 + len(debug)
	f[0], f[1], f[2] = byte(n>>16), byte(n>>8), byte(n)
	f[3] = frameGoAway
	binary.BigEndian.PutUint32(f[9:], lastStream)
	binary.BigEndian.PutUint32(f[13:], code)
	copy(f[17:], debug)
	return f
}

// header is an HTTP/2 frame header: length (3 bytes), type, flags, stream.
type header [9]byte

func (h header) length() uint32 { return uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2]) }
func (h header) typ() byte      { return h[3] }
func (h header) flags() byte    { return h[4] }
func (h header) stream() uint32 { return binary.BigEndian.Uint32(h[5:]) &^ (1 << 31) }

// frames follows a stream of HTTP/2 frames across reads or writes of any
// size, seeing each frame's header and skipping its payload.
type frames struct {
	hdr  header
	n    int    // header bytes held
	skip uint32 // payload bytes still to pass
}

func (s *frames) feed(b []byte, seen func(header)) {
	for len(b) > 0 {
		if s.skip > 0 {
			k := uint32(min(len(b), int(min(s.skip, 1<<30))))
			s.skip -= k
			b = b[k:]
			continue
		}
		k := copy(s.hdr[s.n:], b)
		s.n += k
		b = b[k:]
		if s.n == len(s.hdr) {
			s.n, s.skip = 0, s.hdr.length()
			seen(s.hdr)
		}
	}
}

func (s *frames) boundary() bool { return s.n == 0 && s.skip == 0 }
