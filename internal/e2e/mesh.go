package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/testproc"
	"github.com/prism-mesh/prism/internal/testwait"
)

// probe is the client of the harness's own readiness checks; the suites' probes carry their own bounds.
var probe = NewHTTP(2 * time.Second)

// RunnerOptions shape a `prism runner`.
type RunnerOptions struct {
	// Name names the process in logs; "runner" when empty.
	Name    string
	Brokers []string
	// Mailbox, when set, is hosted on Topics without a lease (static mode). Without it the runner serves its
	// control API on ControlAddr for a sidecar to open mailboxes.
	Mailbox string
	Topics  []string
	// DataDir holds the stores; a fresh temp dir when empty. Pass the same one to restart on the same data.
	DataDir string
	// Args are added to the flags.
	Args []string
}

// Runner is a `prism runner` process.
type Runner struct {
	*testproc.Proc
	// QueryAddr answers gRPC and HTTP queries (what a sidecar advertises); HTTPAddr serves the query API,
	// /metrics and the health checks; ControlAddr is empty in static mode.
	QueryAddr, HTTPAddr, ControlAddr string
}

// HTTPURL is the base URL of the runner's HTTP listener.
func (r *Runner) HTTPURL() string { return "http://" + r.HTTPAddr }

// StartRunner starts a runner and waits up to 30s for its /healthz.
func StartRunner(t testing.TB, o RunnerOptions) *Runner {
	t.Helper()
	if o.Name == "" {
		o.Name = "runner"
	}
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	r := &Runner{QueryAddr: testproc.FreeAddr(t), HTTPAddr: testproc.FreeAddr(t)}
	args := []string{"runner", "--kafka", strings.Join(o.Brokers, ","), "--data-dir", o.DataDir,
		"--grpc-addr", r.QueryAddr, "--http-addr", r.HTTPAddr}
	if o.Mailbox != "" {
		args = append(args, "--mailbox", o.Mailbox)
		for _, tp := range o.Topics {
			args = append(args, "--topic", tp)
		}
	} else {
		r.ControlAddr = testproc.FreeAddr(t)
		args = append(args, "--control-addr", r.ControlAddr)
	}
	r.Proc = testproc.Start(t, o.Name, append(args, o.Args...)...)
	testwait.For(t, 30*time.Second, o.Name+" /healthz", func() (bool, string) {
		code, _, _, err := probe.Get(r.HTTPURL() + "/healthz")
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
	return r
}

// SidecarOptions shape a `prism sidecar`.
type SidecarOptions struct {
	// Name names the process in logs; "sidecar" when empty.
	Name              string
	ProxyID, RunnerID string
	// Runner is the runner whose leases it holds: it opens mailboxes on its control address and advertises its
	// query address as the one routes point at.
	Runner *Runner
	// Admins are the admin nodes' gRPC addresses (or proxies in front of them).
	Admins []string
	// Lease sets the TTL it asks for and its heartbeat interval.
	Lease Lease
}

// Sidecar is a `prism sidecar` process.
type Sidecar struct {
	*testproc.Proc
	HTTPAddr string
}

// StartSidecar starts a sidecar. It waits for nothing: whether it becomes ready depends on the test (another
// runner may hold the lease), so tests await Ready or what they need.
func StartSidecar(t testing.TB, o SidecarOptions) *Sidecar {
	t.Helper()
	if o.Name == "" {
		o.Name = "sidecar"
	}
	s := &Sidecar{HTTPAddr: testproc.FreeAddr(t)}
	s.Proc = testproc.Start(t, o.Name, "sidecar", "--proxy-id", o.ProxyID, "--runner-id", o.RunnerID,
		"--admin-endpoints", strings.Join(o.Admins, ","), "--runner-addr", o.Runner.ControlAddr, "--advertise-addr", o.Runner.QueryAddr,
		"--http-addr", s.HTTPAddr, "--lease-ttl", o.Lease.TTL.String(), "--heartbeat-interval", o.Lease.Heartbeat.String(),
		"--retry-max", "250ms", "--admin-attempt-timeout", "700ms", "--log-format", "json")
	return s
}

// HTTPURL is the base URL of the sidecar's HTTP listener (/readyz, /metrics).
func (s *Sidecar) HTTPURL() string { return "http://" + s.HTTPAddr }

// Ready reports whether /readyz answers 200, and what it answered: a testwait condition.
func (s *Sidecar) Ready() (bool, string) {
	code, body, _, err := probe.Get(s.HTTPURL() + "/readyz")
	return err == nil && code == 200, fmt.Sprint(code, " ", strings.TrimSpace(body), " ", err)
}

// GatewayOptions shape a `prism gateway`.
type GatewayOptions struct {
	NodeID string
	// Admins are the admin nodes' gRPC addresses, in the order the gateway tries them for its ADS stream.
	Admins []string
	// Timeout bounds each proxied query.
	Timeout time.Duration
}

// Gateway is a `prism gateway` process.
type Gateway struct {
	*testproc.Proc
	HTTPAddr, GRPCAddr string
}

// HTTPURL is the base URL of the gateway's HTTP listener.
func (g *Gateway) HTTPURL() string { return "http://" + g.HTTPAddr }

// StartGateway starts a gateway. It waits for nothing: it has no routes until xDS delivers them, and tests
// await the routes they need.
func StartGateway(t testing.TB, o GatewayOptions) *Gateway {
	t.Helper()
	g := &Gateway{HTTPAddr: testproc.FreeAddr(t), GRPCAddr: testproc.FreeAddr(t)}
	g.Proc = testproc.Start(t, "gateway", "gateway", "--admin", strings.Join(o.Admins, ","), "--node-id", o.NodeID,
		"--http-addr", g.HTTPAddr, "--grpc-addr", g.GRPCAddr, "--timeout", o.Timeout.String(), "--log-format", "json")
	return g
}
