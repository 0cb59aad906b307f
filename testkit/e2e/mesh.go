package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/testproc"
	"github.com/prism-mesh/prism/testkit/testwait"
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
	// ProxyID names the runner's identity, proxy/<ProxyID>, which its sidecar shares; DefaultProxyID when
	// empty.
	ProxyID string
	// Insecure runs it in plaintext (--insecure); by default it serves over mutual TLS with certificates
	// from PKI (Shared when nil), which its sidecar shares.
	Insecure bool
	PKI      *PKI
}

// DefaultProxyID is the proxy id of a runner whose options name none.
const DefaultProxyID = "proxy-1"

// Runner is a `prism runner` process.
type Runner struct {
	*testproc.Proc
	// QueryAddr answers gRPC and HTTP queries (what a sidecar advertises); HTTPAddr serves /metrics and the
	// health checks (and the query API in plaintext); ControlAddr is empty in static mode.
	QueryAddr, HTTPAddr, ControlAddr string
	// ProxyID is the identity the runner and its sidecar share; Insecure says it runs in plaintext.
	ProxyID  string
	Insecure bool
	PKI      *PKI
}

// HTTPURL is the base URL of the runner's HTTP listener: health checks and metrics.
func (r *Runner) HTTPURL() string { return "http://" + r.HTTPAddr }

// QueryURL is the base URL of the runner's HTTP query API: the query port over mutual TLS (NewHTTP's
// clients present a reader identity), the HTTP listener in plaintext.
func (r *Runner) QueryURL() string {
	if r.Insecure {
		return r.HTTPURL()
	}
	return "https://" + r.QueryAddr
}

// StartRunner starts a runner and waits up to 30s for its /healthz.
func StartRunner(t testing.TB, o RunnerOptions) *Runner {
	t.Helper()
	if o.Name == "" {
		o.Name = "runner"
	}
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	if o.ProxyID == "" {
		o.ProxyID = DefaultProxyID
	}
	r := &Runner{QueryAddr: testproc.FreeAddr(t), HTTPAddr: testproc.FreeAddr(t), ProxyID: o.ProxyID, Insecure: o.Insecure, PKI: orShared(t, o.PKI)}
	args := []string{"runner", "--kafka", strings.Join(o.Brokers, ","), "--data-dir", o.DataDir,
		"--grpc-addr", r.QueryAddr, "--http-addr", r.HTTPAddr}
	if o.Insecure {
		args = append(args, "--insecure")
	} else {
		args = append(args, TLSArgs(t, r.PKI, identity.Proxy, o.ProxyID)...)
	}
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
	Name string
	// ProxyID is the proxy it registers; it must be the runner's (they share one identity). RunnerID
	// names the runner in leases.
	ProxyID, RunnerID string
	// Runner is the runner whose leases it holds: it opens mailboxes on its control address and advertises its
	// query address as the one routes point at.
	Runner *Runner
	// Admins are the admin nodes' gRPC addresses (or proxies in front of them).
	Admins []string
	// Lease sets the TTL it asks for and its heartbeat interval.
	Lease Lease
	// Args are added to the flags.
	Args []string
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
	if o.ProxyID != o.Runner.ProxyID {
		t.Fatalf("sidecar for proxy %q beside runner of proxy %q: they share one identity", o.ProxyID, o.Runner.ProxyID)
	}
	s := &Sidecar{HTTPAddr: testproc.FreeAddr(t)}
	args := []string{"sidecar", "--proxy-id", o.ProxyID, "--runner-id", o.RunnerID,
		"--admin-endpoints", strings.Join(o.Admins, ","), "--runner-addr", o.Runner.ControlAddr, "--advertise-addr", o.Runner.QueryAddr,
		"--http-addr", s.HTTPAddr, "--lease-ttl", o.Lease.TTL.String(), "--heartbeat-interval", o.Lease.Heartbeat.String(),
		"--retry-max", "250ms", "--admin-attempt-timeout", "700ms", "--log-format", "json"}
	if o.Runner.Insecure {
		args = append(args, "--insecure")
	} else {
		args = append(args, TLSArgs(t, o.Runner.PKI, identity.Proxy, o.ProxyID)...)
	}
	s.Proc = testproc.Start(t, o.Name, append(args, o.Args...)...)
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
	// Insecure runs it in plaintext (--insecure); by default it talks to the admin nodes and runners over
	// mutual TLS as gateway/<NodeID>, with certificates from PKI (Shared when nil).
	Insecure bool
	PKI      *PKI
	// Args are added to the flags; without --jwks-file or --jwks-url the gateway answers queries without a
	// token (--no-query-auth).
	Args []string
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
	args := []string{"gateway", "--admin", strings.Join(o.Admins, ","), "--node-id", o.NodeID,
		"--http-addr", g.HTTPAddr, "--grpc-addr", g.GRPCAddr, "--timeout", o.Timeout.String(), "--log-format", "json"}
	if o.Insecure {
		args = append(args, "--insecure")
	} else {
		args = append(args, TLSArgs(t, o.PKI, identity.Gateway, o.NodeID)...)
	}
	if !slices.ContainsFunc(o.Args, func(a string) bool { return strings.HasPrefix(a, "--jwks") }) {
		args = append(args, "--no-query-auth")
	}
	g.Proc = testproc.Start(t, "gateway", append(args, o.Args...)...)
	return g
}
