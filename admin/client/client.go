// Package client calls an admin cluster through any of its nodes: the one
// way the sidecar, prismctl and anything else reach the admin.
//
// Every node answers every call (followers forward writes to the leader), so
// a call goes to the node that answered last and, when that node cannot
// serve it, on to the others: first to the leader a NOT_LEADER refusal names,
// if it is one of the endpoints, then round the rest. Which failures move on
// is decided by gRPC code and by whether the request was ever sent (see
// retried), never by error text. Between rounds it backs off with a
// k8s.io/apimachinery wait.Backoff.
//
// The package links gRPC, the admin protos and mesh only: the sidecar links
// it, and must not link Raft, Badger or the FSM (mesh/deps_test.go).
package client

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/internal/grpcpool"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// Config says which nodes to call and how patiently.
type Config struct {
	// Endpoints are the admin nodes' gRPC host:port; list every node.
	Endpoints []string
	// Attempt bounds one call on one node, so a blackholed node costs at
	// most this much before the next is tried; 0: only the caller's context.
	Attempt time.Duration
	// Rounds is how many times a call goes round the endpoints; 0: until
	// the caller's context ends. A caller with its own retry loop sets 1.
	Rounds int
	// Backoff is the wait between rounds.
	Backoff wait.Backoff
	// UnreachableAfter, when set, ends a call once no endpoint has accepted
	// a connection for this long (every try failed before its request was
	// sent: refused, unresolvable, no TLS handshake), so a person waiting
	// hears at once that nothing listens where they pointed rather than at
	// the end of their deadline; Unreachable tells that failure. 0: such
	// failures are retried like any other, until Rounds or the context end.
	UnreachableAfter time.Duration
	// Clock times the waits between rounds; nil: the real clock.
	Clock clock.Clock
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// DialOptions are added to every connection's.
	DialOptions []grpc.DialOption
	// TLS, when set, is the caller's identity: connections run mutual TLS
	// and accept only admin nodes. Nil dials in plaintext.
	TLS *pki.Source
}

// Client is safe for concurrent use.
type Client struct {
	cfg   Config
	conns grpcpool.Pool

	mu        sync.Mutex
	preferred int // the endpoint that answered last
	rotate    int // the endpoint Rotate gives next
}

// New makes a client; connections are made lazily, on the first call.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("admin client: at least one endpoint is required")
	}
	cfg.Endpoints = slices.Clone(cfg.Endpoints)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg}
	c.conns.Options = append([]grpc.DialOption{
		TrackSent(),
		// The watch stream is silent between changes, so only pings can
		// tell a dead admin node (no RST) from a quiet one. Servers refuse
		// pings more often than every 5 minutes by default.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 6 * time.Minute, Timeout: 20 * time.Second}),
	}, cfg.DialOptions...)
	if cfg.TLS != nil {
		// Replaces the pool's plaintext credentials (the last one wins).
		c.conns.Options = append(c.conns.Options, grpc.WithTransportCredentials(
			credentials.NewTLS(cfg.TLS.ClientConfig(pki.RoleIs(identity.Admin)))))
	}
	for _, a := range cfg.Endpoints {
		if _, err := c.conns.Get(a); err != nil {
			c.Close()
			return nil, fmt.Errorf("admin endpoint %q: %w", a, err)
		}
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() { c.conns.Close() }

// Endpoints returns the configured endpoints.
func (c *Client) Endpoints() []string { return slices.Clone(c.cfg.Endpoints) }

// Rotate returns the next endpoint in turn and its connection, for streams
// the caller reopens itself after a failure: each reopening goes to the next
// node, so a caller that keeps failing goes round all of them.
func (c *Client) Rotate() (string, *grpc.ClientConn, error) {
	c.mu.Lock()
	i := c.rotate
	c.rotate = (i + 1) % len(c.cfg.Endpoints)
	c.mu.Unlock()
	return c.conn(i)
}

func (c *Client) conn(i int) (string, *grpc.ClientConn, error) {
	addr := c.cfg.Endpoints[i]
	cc, err := c.conns.Get(addr)
	if err != nil {
		return addr, nil, fmt.Errorf("admin endpoint %q: %w", addr, err)
	}
	return addr, cc, nil
}
