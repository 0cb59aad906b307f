// Package node assembles one runner process: the runner, its query and HTTP
// listeners and, when the lease sidecar drives it, the control API on
// loopback. `prism runner` and `prism dev` only turn their flags into a
// Config.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"

	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/mailbox/control"
	"github.com/prism-mesh/prism/mailbox/runner"
)

// Config is one runner process. Exactly one of Mailbox and ControlAddr is
// set: a static mailbox is hosted without a lease, and a runner without one
// hosts what the sidecar opens through the control API.
type Config struct {
	// Runner is the runner's own settings; its Logger and Ready are set
	// from here.
	Runner runner.Config
	// QueryAddr serves gRPC (MailboxQuery, health) and the HTTP query API on
	// one port: the address the sidecar advertises and routes point at.
	QueryAddr string
	// HTTPAddr serves the HTTP query API, /metrics, /healthz and /readyz.
	HTTPAddr string
	// Mailbox is hosted from the start, without a lease epoch.
	Mailbox *runner.MailboxConfig
	// ControlAddr serves the sidecar's control API
	// (prism.runner.v1.RunnerControl); it must be a loopback address, since
	// the API is not authenticated.
	ControlAddr string
	Logger      *slog.Logger
}

// Node is a running runner process.
type Node struct {
	Runner *runner.Runner

	queryLn, httpLn, controlLn net.Listener
	control                    *grpc.Server // nil with a static mailbox
}

// Start binds every listener, then starts the runner and serves it; a bad
// address fails before anything runs.
func Start(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Runner.Logger = cfg.Logger
	switch {
	case cfg.Mailbox != nil && cfg.ControlAddr != "":
		return nil, errors.New("runner: a static mailbox has no lease, so no control API")
	case cfg.Mailbox == nil && cfg.ControlAddr == "":
		return nil, errors.New("runner: either a static mailbox or a control address is required")
	case cfg.ControlAddr != "":
		if err := loopbackOnly(cfg.ControlAddr); err != nil {
			return nil, fmt.Errorf("runner control address: %w", err)
		}
	}
	n := &Node{}
	if err := n.listen(cfg); err != nil {
		return nil, err
	}
	var ctl *control.Server
	if cfg.ControlAddr != "" {
		cfg.Runner.Ready = func() error { return ctl.Ready() }
	}
	r, err := runner.New(cfg.Runner)
	if err != nil {
		n.closeListeners()
		return nil, err
	}
	n.Runner = r
	if cfg.Mailbox != nil {
		if err := r.Open(*cfg.Mailbox); err != nil {
			n.closeListeners()
			return nil, errors.Join(err, r.Close())
		}
		r.Serve(n.queryLn, n.httpLn)
		return n, nil
	}
	ctl = control.New(control.Config{Host: r, Registerer: r.Registry(), Logger: cfg.Logger})
	n.control = grpc.NewServer()
	ctl.Register(n.control)
	go func() {
		if err := n.control.Serve(n.controlLn); err != nil {
			cfg.Logger.Error("control server stopped", "err", err)
		}
	}()
	r.Serve(n.queryLn, n.httpLn)
	cfg.Logger.Info("runner waiting for the sidecar", "control_addr", n.ControlAddr())
	return n, nil
}

func (n *Node) listen(cfg Config) error {
	type bind struct {
		what, addr string
		ln         *net.Listener
	}
	binds := []bind{{"query", cfg.QueryAddr, &n.queryLn}, {"http", cfg.HTTPAddr, &n.httpLn}}
	if cfg.ControlAddr != "" {
		binds = append([]bind{{"control", cfg.ControlAddr, &n.controlLn}}, binds...)
	}
	for _, b := range binds {
		ln, err := net.Listen("tcp", b.addr)
		if err != nil {
			n.closeListeners()
			return fmt.Errorf("runner %s listen %s: %w", b.what, b.addr, err)
		}
		*b.ln = ln
	}
	return nil
}

func (n *Node) closeListeners() {
	for _, ln := range []net.Listener{n.controlLn, n.queryLn, n.httpLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// QueryAddr is the bound query address.
func (n *Node) QueryAddr() string { return n.queryLn.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// ControlAddr is the bound control API address, or "" with a static mailbox.
func (n *Node) ControlAddr() string {
	if n.controlLn == nil {
		return ""
	}
	return n.controlLn.Addr().String()
}

// Close drains every mailbox (stop fetching, flush, commit) and stops the
// servers, then the control API, so the sidecar's last calls are answered.
func (n *Node) Close() error {
	err := n.Runner.Close()
	if n.control != nil {
		n.control.GracefulStop()
	}
	return err
}

// loopbackOnly keeps the unauthenticated control API off the network.
func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q: must be a loopback address (127.0.0.1, ::1 or localhost)", addr)
}
