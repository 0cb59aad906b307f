package agent

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
)

// RunnerConn is what the sidecar knows of its connections to the runner's
// control API (Config.RunnerConn): whether the runner is provably gone, and
// when it can be reached again. RunnerDialer is the one a sidecar process
// uses.
type RunnerConn interface {
	// Refusing reports whether the runner's control API refuses
	// connections: the last dial to it found nothing listening and no
	// connection to it is open.
	Refusing() bool
	// Dialed is closed at the next dial to the runner that connects.
	Dialed() <-chan struct{}
}

// RunnerDialer dials the runner's control API (grpc.WithContextDialer) and
// remembers what the dials found, for RunnerConn.
//
// A refused connection is the proof that the runner serves nothing
// (docs/architecture.md#dead-runner). The control API listens on loopback
// in the runner's own network namespace, before the runner serves any query
// and until it has stopped serving every one (mailbox/node: the listener is
// made first at start and closed last at stop), so nothing listening there
// means the runner process is gone, or stopped serving, or has not started
// yet; a runner that starts again serves a mailbox only once its sidecar
// activates it under an epoch (mailbox/control), and the sidecar does that
// only for a lease it holds. A runner that is merely paused (SIGSTOP, a
// frozen container) keeps its listening socket, so the kernel still accepts
// the connection: a dial to it connects or times out, it is never refused.
// (Nor does a full accept queue refuse one unless
// net.ipv4.tcp_abort_on_overflow is set; the sidecar keeps one connection.)
type RunnerDialer struct {
	dialer net.Dialer

	mu      sync.Mutex
	refused bool // the last dial was refused
	open    int  // connections dialled and not yet closed
	dialed  chan struct{}
}

// NewRunnerDialer is a RunnerDialer that has dialled nothing yet.
func NewRunnerDialer() *RunnerDialer { return &RunnerDialer{dialed: make(chan struct{})} }

// Dial connects to addr over TCP and records the outcome.
func (d *RunnerDialer) Dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := d.dialer.DialContext(ctx, "tcp", addr)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err == nil:
		d.refused = false
		d.open++
		close(d.dialed)
		d.dialed = make(chan struct{})
		return &runnerConn{Conn: c, d: d}, nil
	case errors.Is(err, syscall.ECONNREFUSED):
		d.refused = true
	}
	return nil, err
}

// Refusing implements RunnerConn.
func (d *RunnerDialer) Refusing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refused && d.open == 0
}

// Dialed implements RunnerConn.
func (d *RunnerDialer) Dialed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dialed
}

// runnerConn counts itself out of RunnerDialer.open when closed.
type runnerConn struct {
	net.Conn
	d    *RunnerDialer
	once sync.Once
}

func (c *runnerConn) Close() error {
	c.once.Do(func() {
		c.d.mu.Lock()
		c.d.open--
		c.d.mu.Unlock()
	})
	return c.Conn.Close()
}
