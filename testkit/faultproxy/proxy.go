// Package faultproxy is a TCP proxy for failure tests: it forwards a listener
// to an upstream address and can be switched to a blackhole (connections are
// accepted, or kept, but no byte passes in either direction, like a network
// partition that drops packets) and back, or told to cut every connection.
package faultproxy

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from its listener to Upstream.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	blackhole bool
	resume    chan struct{} // closed when the blackhole lifts
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// New listens on addr (use "127.0.0.1:0") and forwards to upstream.
func New(addr, upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy listen %s: %w", addr, err)
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops all traffic, on existing and new connections, until Restore.
// Bytes in flight stay buffered, as in a real partition where TCP retransmits.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blackhole {
		p.blackhole = true
		p.resume = make(chan struct{})
	}
}

// Restore lets traffic flow again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole {
		p.blackhole = false
		close(p.resume)
	}
}

// Blackholed reports the current mode.
func (p *Proxy) Blackholed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blackhole
}

// CutAll closes every open connection (both sides see a reset/EOF); new
// connections are still accepted.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops the listener and cuts every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.Restore()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// gate blocks while blackholed; false once the connection should end.
func (p *Proxy) gate(done <-chan struct{}) bool {
	p.mu.Lock()
	resume := p.resume
	p.mu.Unlock()
	select {
	case <-resume:
		return true
	case <-done:
		return false
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	defer client.Close()
	done := make(chan struct{})
	// A blackholed proxy does not even connect upstream: the peer sees a
	// connection that never answers.
	if !p.gate(done) {
		return
	}
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(up) {
		_ = up.Close()
		return
	}
	defer p.untrack(up)
	defer up.Close()
	var once sync.Once
	stop := func() { once.Do(func() { close(done); _ = client.Close(); _ = up.Close() }) }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); defer stop(); p.pipe(up, client, done) }()
	go func() { defer wg.Done(); defer stop(); p.pipe(client, up, done) }()
	wg.Wait()
}

// pipe copies src to dst in chunks, waiting at the gate before each write so
// a blackhole holds data back rather than passing a partial stream.
func (p *Proxy) pipe(dst, src net.Conn, done <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(done) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
