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
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/mailbox/control"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
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
	// HTTPAddr serves /metrics, /healthz and /readyz in plaintext, and the
	// HTTP query API too unless TLS is set.
	HTTPAddr string
	// Mailbox is hosted from the start, without a lease epoch.
	Mailbox *runner.MailboxConfig
	// ControlAddr serves the sidecar's control API
	// (prism.runner.v1.RunnerControl); it must be a loopback address, so
	// only the pod reaches it even before TLS decides who may.
	ControlAddr string
	// TLS, when set, is the runner's identity (proxy/<proxy-id>, shared with
	// its sidecar): the query port serves mutual TLS to gateway, operator
	// and reader identities (runner.Config.TLS) and the control API only
	// to this same identity. nil serves everything in plaintext.
	TLS    *pki.Source
	Logger *slog.Logger
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
	cfg.Runner.TLS = cfg.TLS
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
	n.control = grpc.NewServer(append(controlLimits(cfg.Runner), controlServerOptions(cfg.TLS)...)...)
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

// controlLimits bound the control API as the runner bounds its query port:
// streams per connection and runner.Config's connection bounds. The sidecar
// calls it every heartbeat and never pings.
func controlLimits(rc runner.Config) []grpc.ServerOption {
	streams := rc.MaxStreams
	if streams == 0 {
		streams = 1000
	}
	return append([]grpc.ServerOption{grpc.MaxConcurrentStreams(streams)}, rc.Conn.GRPC()...)
}

// controlServerOptions secure the control API with src: mutual TLS that
// accepts only the runner's own identity, which its sidecar shares, and a
// policy naming every method so a new one is closed until given a rule.
func controlServerOptions(src *pki.Source) []grpc.ServerOption {
	if src == nil {
		return nil
	}
	self := src.Identity()
	onlySelf := func(caller identity.Identity, _ any) error {
		if caller == self {
			return nil
		}
		return identity.Deny(caller, "only this runner's own sidecar (%s) may call its control API", self)
	}
	policy := identity.Policy{
		runnerv1.RunnerControl_OpenMailbox_FullMethodName:     onlySelf,
		runnerv1.RunnerControl_ActivateMailbox_FullMethodName: onlySelf,
		runnerv1.RunnerControl_ExtendMailbox_FullMethodName:   onlySelf,
		runnerv1.RunnerControl_ExtendMailboxes_FullMethodName: onlySelf,
		runnerv1.RunnerControl_FenceMailbox_FullMethodName:    onlySelf,
		runnerv1.RunnerControl_CloseMailbox_FullMethodName:    onlySelf,
		runnerv1.RunnerControl_Drain_FullMethodName:           onlySelf,
		runnerv1.RunnerControl_GetStats_FullMethodName:        onlySelf,
		runnerv1.RunnerControl_AllowRecovery_FullMethodName:   onlySelf,
	}
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(src.ServerConfig(pki.Exactly(self)))),
		grpc.ChainUnaryInterceptor(policy.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(policy.StreamInterceptor()),
	}
}

// loopbackOnly keeps the control API off the network.
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
