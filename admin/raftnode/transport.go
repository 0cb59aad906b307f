package raftnode

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// handshakeTimeout bounds the TLS handshake of a connection to the raft
// port: raft sets no deadline on the connections it accepts, so a peer that
// connects and says nothing would otherwise hold a socket and a goroutine for
// good.
const handshakeTimeout = 5 * time.Second

type dialOverrides map[string]string

func (d dialOverrides) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := d[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	return "", fmt.Errorf("no dial override for %s", id)
}

func newTCPTransport(cfg Config, peers *peerSet, hl hclog.Logger) (*raft.NetworkTransport, error) {
	ln := cfg.Listener
	if ln == nil {
		l, err := net.Listen("tcp", cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("raft transport on %s: %w", cfg.BindAddr, err)
		}
		ln = l
	}
	sl := &streamLayer{Listener: ln, adv: ln.Addr()}
	if cfg.Advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", cfg.Advertise)
		if err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("raft advertise address %q: %w", cfg.Advertise, err)
		}
		sl.adv = a
	}
	if cfg.TLS != nil {
		sl.Listener = &tlsListener{Listener: ln, cfg: cfg.TLS.ServerConfig(peers.admit), log: peers.log}
		sl.tls, sl.peers = cfg.TLS, peers
	}
	tc := &raft.NetworkTransportConfig{Stream: sl, Logger: hl, MaxPool: 3, Timeout: 10 * time.Second}
	if len(cfg.DialAddrs) > 0 {
		d := dialOverrides{cfg.ID: sl.adv.String()}
		for id, a := range cfg.DialAddrs {
			d[id] = a
		}
		tc.ServerAddressProvider = d
	}
	return raft.NewNetworkTransportWithConfig(tc), nil
}

// streamLayer is raft's TCP stream layer over a listener we may have created
// ourselves, over mutual TLS when tls is set.
type streamLayer struct {
	net.Listener
	adv   net.Addr
	tls   *pki.Source
	peers *peerSet
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.tls == nil {
		return net.DialTimeout("tcp", string(addr), timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := tls.Dialer{Config: s.tls.ClientConfig(s.peers.dialing(string(addr)))}
	c, err := d.DialContext(ctx, "tcp", string(addr))
	if err != nil {
		return nil, fmt.Errorf("raft: tls dial %s: %w", addr, err)
	}
	return c, nil
}

func (s *streamLayer) Addr() net.Addr { return s.adv }

// tlsListener hands raft connections whose handshake runs on first use, in
// the connection's own goroutine: a slow or refused peer never holds up
// raft's accept loop.
type tlsListener struct {
	net.Listener
	cfg *tls.Config
	log *slog.Logger
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &serverConn{Conn: tls.Server(c, l.cfg), log: l.log}, nil
}

// serverConn is an accepted connection that completes its handshake, within
// handshakeTimeout, before raft reads or writes anything on it.
type serverConn struct {
	*tls.Conn
	log  *slog.Logger
	once sync.Once
	err  error
}

func (c *serverConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		defer cancel()
		if err := c.HandshakeContext(ctx); err != nil {
			c.log.Warn("raft peer refused", "remote", c.RemoteAddr().String(), "err", err)
			_ = c.Close()
			// Logged here with its cause; to raft the stream just ended,
			// which it does not log again.
			c.err = io.EOF
		}
	})
	return c.err
}

func (c *serverConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *serverConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// peerSet decides which admin identities the raft transport talks to: the
// servers of raft's latest configuration or, before this node has one (a
// bootstrap under way, a node waiting to be added), the configured peers.
type peerSet struct {
	static []raft.Server        // Peers and JoinPeers
	dial   map[string]string    // DialAddrs: server id -> the address dialed instead
	latest func() []raft.Server // nil before raft runs
	log    *slog.Logger
}

func (n *Node) peerSet() *peerSet {
	p := &peerSet{dial: n.cfg.DialAddrs, log: n.log}
	for _, peer := range slices.Concat(n.cfg.Peers, n.cfg.JoinPeers) {
		p.static = append(p.static, raft.Server{ID: raft.ServerID(peer.ID), Address: raft.ServerAddress(peer.Addr)})
	}
	// raft keeps its latest configuration in an atomic value, so reading it
	// on every handshake neither waits for raft's loop nor copies much.
	p.latest = func() []raft.Server {
		if r := n.current.Load(); r != nil {
			return r.GetConfiguration().Configuration().Servers
		}
		return nil
	}
	return p
}

func (p *peerSet) servers() []raft.Server {
	if s := p.latest(); len(s) > 0 {
		return s
	}
	return p.static
}

// admit is the listener's check: an admin identity of a member.
func (p *peerSet) admit(id identity.Identity) error {
	if id.Role != identity.Admin {
		return fmt.Errorf("raft peer %s: not an admin identity", id)
	}
	for _, s := range p.servers() {
		if string(s.ID) == id.Name {
			return nil
		}
	}
	return fmt.Errorf("raft peer %s: %s is not a member of the raft configuration", id, id.Name)
}

// dialing is the dialer's check for a connection to addr: raft names only
// the address, so the server must be the admin identity of a member raft
// dials there (or, when no member is known there, of any member).
func (p *peerSet) dialing(addr string) pki.Authorizer {
	var want []string
	for _, s := range p.servers() {
		at := string(s.Address)
		if d, ok := p.dial[string(s.ID)]; ok {
			at = d
		}
		if at == addr {
			want = append(want, string(s.ID))
		}
	}
	return func(id identity.Identity) error {
		if len(want) == 0 {
			p.log.Warn("raft dials an address no member has; accepting any member there", "addr", addr, "peer", id.String())
			return p.admit(id)
		}
		if id.Role != identity.Admin || !slices.Contains(want, id.Name) {
			return fmt.Errorf("raft server at %s is %s, want admin/%s", addr, id, strings.Join(want, " or admin/"))
		}
		return nil
	}
}
