// Package grpcpool keeps one client connection per address, for callers
// that talk to a changing subset of a known set of nodes (a follower
// forwarding to whichever node leads, the admin client trying each node).
package grpcpool

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Pool is safe for concurrent use; the zero value is ready.
type Pool struct {
	// Options are added after plaintext transport credentials, so a
	// WithTransportCredentials among them (mTLS) replaces those; set them
	// before the first Get.
	Options []grpc.DialOption

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// Get returns the connection to addr, creating it on first use. grpc.NewClient
// connects lazily, so this never blocks on the network.
func (p *Pool) Get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc, ok := p.conns[addr]; ok {
		return cc, nil
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, p.Options...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	if p.conns == nil {
		p.conns = map[string]*grpc.ClientConn{}
	}
	p.conns[addr] = cc
	return cc, nil
}

// Close closes every connection; a later Get starts afresh.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, cc := range p.conns {
		_ = cc.Close()
		delete(p.conns, addr)
	}
}
