package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/prism-mesh/prism/internal/boottime"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// Config of an Agent. ProxyID, AdvertiseAddr, Admin and Runner are required.
type Config struct {
	// ProxyID is the proxy this sidecar registers (the pod name in
	// Kubernetes); mailboxes are "{namespace}@{ProxyID}".
	ProxyID string
	// RunnerID names the runner in leases; empty means ProxyID (one runner
	// per proxy), so a restarted sidecar of the same pod reconnects to its
	// lease instead of waiting for it to expire.
	RunnerID string
	// AdvertiseAddr is the runner's MailboxQuery address, which routes send
	// queries to; also the proxy's registered address.
	AdvertiseAddr string
	// Registration carries the optional registration fields (version,
	// capabilities, labels, region, zone); proxy id, address and runner id are
	// filled in.
	Registration *adminv1.ProxyRegistration
	// Instance names this sidecar process in its registration
	// (ProxyRegistration.instance): the proxy's own drain lasts only as
	// long as the instance that asked for it. "" takes a random one.
	Instance string
	// LeaseTTL is the ttl asked for on acquire; 0 takes the namespace's.
	// The ttl the admin grants is what the sidecar fences by.
	LeaseTTL time.Duration
	// HeartbeatInterval between heartbeats (jittered down by up to 20%);
	// the lease's own interval wins when shorter. Default 5s.
	HeartbeatInterval time.Duration
	// RunnerDeadAfter is how long the runner may fail the stats probe each
	// heartbeat makes before the lease is given back
	// (docs/architecture.md#dead-runner). 0 means three heartbeat intervals of the lease, at most half
	// its ttl.
	RunnerDeadAfter time.Duration
	// StopTimeout bounds the graceful stop (drain + release). Default 4.5s.
	StopTimeout time.Duration
	// RPCTimeout bounds one call to the runner, and one whole admin call
	// (across failover). Default 5s.
	RPCTimeout time.Duration
	// Backoff between retries; zero value means 100ms doubling to 5s, 20%
	// jitter.
	Backoff wait.Backoff

	// LeaseMode is how the leases are held; "" is LeaseModeSession, which
	// falls back to LeaseModeMailbox by itself when the admin cluster has
	// no Sessions service.
	LeaseMode LeaseMode

	Admin adminv1.ControlPlaneClient
	// Cordon cordons the proxy for POST /drain (ControlPlane DrainProxy);
	// nil makes a drain wait without cordoning.
	Cordon Cordon
	// Sessions is the admin's Sessions service; nil takes Admin when it
	// serves both (as Endpoints does). Unused in LeaseModeMailbox.
	Sessions adminv1.SessionsClient
	Runner   runnerv1.RunnerControlClient
	// RunnerConn tells a runner that is gone (its control API refuses
	// connections) from one that only does not answer (runnerconn.go): a
	// gone runner's leases are released at once instead of after the
	// deadline it was handed. nil knows nothing, and every runner that
	// does not answer is waited out.
	RunnerConn RunnerConn

	Clock clock.Clock // nil = real clock
	// Boottime reads the host's boot clock, shared with the runner of the
	// pod, to bound each valid_for the runner is handed (runnerBound);
	// nil is boottime.Read.
	Boottime boottime.Reader
	// Jitter shortens a heartbeat interval; nil takes 80-100% at random.
	Jitter     func(time.Duration) time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() error {
	if c.ProxyID == "" {
		return errors.New("agent: proxy id is required")
	}
	if strings.Contains(c.ProxyID, "@") {
		return fmt.Errorf("agent: proxy id %q must not contain '@'", c.ProxyID)
	}
	if c.AdvertiseAddr == "" {
		return errors.New("agent: advertise address (the runner's MailboxQuery host:port) is required")
	}
	if c.Admin == nil || c.Runner == nil {
		return errors.New("agent: admin and runner clients are required")
	}
	if c.RunnerID == "" {
		c.RunnerID = c.ProxyID
	}
	if c.Instance == "" {
		c.Instance = NewInstance()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 5 * time.Second
	}
	if c.LeaseTTL < 0 {
		return fmt.Errorf("agent: lease ttl %v must not be negative", c.LeaseTTL)
	}
	if c.LeaseTTL > 0 && c.HeartbeatInterval >= c.LeaseTTL {
		return fmt.Errorf("agent: heartbeat interval %v must be below the lease ttl %v", c.HeartbeatInterval, c.LeaseTTL)
	}
	if c.RunnerDeadAfter < 0 {
		return fmt.Errorf("agent: runner-dead bound %v must not be negative", c.RunnerDeadAfter)
	}
	if c.RunnerDeadAfter > 0 && c.LeaseTTL > 0 && c.RunnerDeadAfter >= c.LeaseTTL {
		return fmt.Errorf("agent: runner-dead bound %v must be below the lease ttl %v", c.RunnerDeadAfter, c.LeaseTTL)
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 4500 * time.Millisecond
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = 5 * time.Second
	}
	if c.Backoff.Duration <= 0 {
		c.Backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Boottime == nil {
		c.Boottime = boottime.Read
	}
	if c.Jitter == nil {
		c.Jitter = func(d time.Duration) time.Duration { return time.Duration(float64(d) * (0.8 + 0.2*rand.Float64())) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.LeaseMode {
	case "":
		c.LeaseMode = LeaseModeSession
	case LeaseModeSession, LeaseModeMailbox:
	default:
		return fmt.Errorf("agent: lease mode %q: want %q or %q", c.LeaseMode, LeaseModeSession, LeaseModeMailbox)
	}
	if c.LeaseMode == LeaseModeSession && c.Sessions == nil {
		sc, ok := c.Admin.(adminv1.SessionsClient)
		if !ok {
			return errors.New("agent: session lease mode needs a Sessions client")
		}
		c.Sessions = sc
	}
	return nil
}

// Hostname is the default proxy id outside Kubernetes.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

// LeaseMode is how the sidecar holds its leases.
type LeaseMode string

const (
	// LeaseModeSession holds every lease in one session
	// (docs/architecture.md#sessions): one keepalive renews them all,
	// acquires and releases are batched.
	LeaseModeSession LeaseMode = "session"
	// LeaseModeMailbox acquires and heartbeats each lease on its own, for
	// an admin cluster without the Sessions service.
	LeaseModeMailbox LeaseMode = "mailbox"
)

// proxyRunnerDeadAfter is how long the runner may fail the proxy
// heartbeat's probe before the proxy reports it not ready:
// Config.RunnerDeadAfter, else three heartbeat intervals, at most half the
// ttl asked for (the workers' bound, taken from the sidecar's settings since
// a proxy holds no single lease to take it from).
func (c *Config) proxyRunnerDeadAfter() time.Duration {
	if c.RunnerDeadAfter > 0 {
		return c.RunnerDeadAfter
	}
	d := 3 * c.HeartbeatInterval
	if c.LeaseTTL > 0 {
		d = min(d, c.LeaseTTL/2)
	}
	return d
}
