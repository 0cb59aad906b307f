package security

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	prismmesh "github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/authtest"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// door is one thing a stranger can try, and the identity it would need.
type door struct {
	name string
	// good is the identity that may pass: strangers present it from another CA or expired.
	good identity.Identity
	// wrong are valid certificates of the mesh that this door must still refuse.
	wrong []credential
	// try makes the attempt; nil error means the door let the stranger in.
	try func(ctx context.Context, t *testing.T, c credential) error
}

// TestEveryDoorRefusesStrangers knocks on every door of a running mesh with every wrong credential. Each
// attempt must fail (a valid certificate of the wrong identity with PermissionDenied where the door
// authorizes per call), and afterwards the namespaces, leases, members and terms must be what they were,
// the mailbox still served under the same lease and the sidecar must not have lost it.
func TestEveryDoorRefusesStrangers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three admin nodes, a runner, a sidecar and a gateway")
	}
	kafka := kafkatest.Start(t, kafkatest.Topics(2, topic, "other.events"))
	kafka.ProduceEnvelopes(t, topic, kafkatest.Envelopes(topic, 5)...)
	key := authtest.NewKey(t, "k1", "ES256")
	jwks := t.TempDir()
	authtest.WriteJWKS(t, jwks+"/jwks.json", key)
	token := func(ns ...string) string { return key.Sign(t, authtest.Claims("https://issuer.test", "prism", ns...)) }
	m := startMesh(t, kafka.Brokers, jwksArgs(jwks), token(namespace))
	before := m.state(t)
	leader := e2e.Leader(m.admins.Nodes...)

	id := func(role identity.Role, name string) identity.Identity {
		return identity.Identity{TrustDomain: e2e.TrustDomain, Role: role, Name: name}
	}
	control := func(f func(ctx context.Context, cp adminv1.ControlPlaneClient) error) func(context.Context, *testing.T, credential) error {
		return func(ctx context.Context, t *testing.T, c credential) error {
			for _, n := range m.admins.Nodes {
				if err := f(ctx, adminv1.NewControlPlaneClient(c.dial(t, n.GRPCAddr))); err == nil || !refused(c, err) {
					return fmt.Errorf("%s: %v", n.ID, err)
				}
			}
			return errRefused
		}
	}
	doors := []door{
		{
			name: "admin: create a namespace", good: id(identity.Operator, "ops"),
			wrong: []credential{wrong(t, identity.Gateway, "gw-1"), wrong(t, identity.Proxy, proxyID), wrong(t, identity.Reader, "dash")},
			try: control(func(ctx context.Context, cp adminv1.ControlPlaneClient) error {
				_, err := cp.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "intruder", Config: &adminv1.NamespaceConfig{Topics: []string{"other.events"}}})
				return err
			}),
		},
		{
			name: "admin: take the mailbox's lease", good: id(identity.Proxy, proxyID),
			wrong: []credential{wrong(t, identity.Proxy, "proxy-2"), wrong(t, identity.Operator, "ops"), wrong(t, identity.Gateway, "gw-1")},
			try: control(func(ctx context.Context, cp adminv1.ControlPlaneClient) error {
				_, err := cp.AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: mailboxID, RunnerId: "runner-1", RunnerAddress: "127.0.0.1:1"})
				return err
			}),
		},
		{
			name: "admin: release the mailbox's lease", good: id(identity.Proxy, proxyID),
			wrong: []credential{wrong(t, identity.Proxy, "proxy-2"), wrong(t, identity.Operator, "ops")},
			try: control(func(ctx context.Context, cp adminv1.ControlPlaneClient) error {
				_, err := cp.ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: mailboxID, RunnerId: "runner-1"})
				return err
			}),
		},
		{
			name: "admin: add a voter", good: id(identity.Operator, "ops"),
			wrong: []credential{wrong(t, identity.Reader, "dash"), wrong(t, identity.Proxy, proxyID)},
			try: func(ctx context.Context, t *testing.T, c credential) error {
				_, err := adminv1.NewAdminClient(c.dial(t, leader.GRPCAddr)).AddVoter(ctx, &adminv1.AddVoterRequest{Id: "ghost", RaftAddress: "127.0.0.1:1", GrpcAddress: "127.0.0.1:2"})
				if err == nil || !refused(c, err) {
					return fmt.Errorf("AddVoter: %v", err)
				}
				return errRefused
			},
		},
		{
			name: "admin: subscribe to xDS", good: id(identity.Gateway, "gw-1"),
			wrong: []credential{wrong(t, identity.Proxy, proxyID), wrong(t, identity.Operator, "ops")},
			try: func(ctx context.Context, t *testing.T, c credential) error {
				stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(c.dial(t, leader.GRPCAddr)).StreamAggregatedResources(ctx)
				if err == nil {
					// A stream the server has ended fails Send with io.EOF; Recv tells why.
					if err = stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "gw-1"}, TypeUrl: resource.ClusterType}); errors.Is(err, io.EOF) {
						err = nil
					}
				}
				if err == nil {
					var resp *discoveryv3.DiscoveryResponse
					if resp, err = stream.Recv(); err == nil {
						return fmt.Errorf("received %d clusters", len(resp.GetResources()))
					}
				}
				if !refused(c, err) {
					return fmt.Errorf("xDS: %v", err)
				}
				return errRefused
			},
		},
		{
			name: "runner: query the mailbox over gRPC", good: id(identity.Gateway, "gw-1"),
			wrong: []credential{wrong(t, identity.Proxy, "proxy-2"), wrong(t, identity.Admin, "admin-1")},
			try: func(ctx context.Context, t *testing.T, c credential) error {
				ctx = metadata.AppendToOutgoingContext(ctx, prismmesh.HeaderMailboxID, mailboxID)
				_, err := mailboxv1.NewMailboxQueryClient(c.dial(t, m.runner.QueryAddr)).GetStats(ctx, &mailboxv1.GetStatsRequest{})
				if err == nil || !refused(c, err) {
					return fmt.Errorf("GetStats: %v", err)
				}
				return errRefused
			},
		},
		{
			name: "runner: query the mailbox over HTTPS", good: id(identity.Reader, "dash"),
			wrong: []credential{wrong(t, identity.Proxy, "proxy-2")},
			try: func(_ context.Context, _ *testing.T, c credential) error {
				scheme := "https://"
				if c.tls == nil {
					scheme = "http://"
				}
				resp, err := c.http().Get(scheme + m.runner.QueryAddr + "/v1/mailboxes/" + mailboxID + "/stats")
				if err != nil {
					return errRefused
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if c.wrongIdentity && resp.StatusCode == http.StatusForbidden || !c.wrongIdentity && resp.StatusCode >= 400 {
					return errRefused
				}
				return fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
			},
		},
		{
			name: "runner: fence the mailbox through the control API", good: id(identity.Proxy, proxyID),
			wrong: []credential{wrong(t, identity.Proxy, "proxy-2"), wrong(t, identity.Operator, "ops"), wrong(t, identity.Gateway, "gw-1")},
			try: func(ctx context.Context, t *testing.T, c credential) error {
				rc := runnerv1.NewRunnerControlClient(c.dial(t, m.runner.ControlAddr))
				if _, err := rc.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: mailboxID, Reason: "intruder"}); err == nil {
					return fmt.Errorf("FenceMailbox answered")
				}
				if _, err := rc.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: mailboxID}); err == nil {
					return fmt.Errorf("CloseMailbox answered")
				}
				return errRefused
			},
		},
		{
			name: "raft: vote and append at a higher term", good: id(identity.Admin, "admin-1"),
			wrong: []credential{wrong(t, identity.Admin, "intruder"), wrong(t, identity.Proxy, proxyID)},
			try: func(_ context.Context, t *testing.T, c credential) error {
				for _, n := range m.admins.Nodes {
					if err := raftAttack(t, c, n.ID, n.RaftAddr, before.terms[0]+100); err == nil {
						return fmt.Errorf("%s accepted a RequestVote", n.ID)
					}
				}
				return errRefused
			},
		},
	}
	for _, d := range doors {
		for _, c := range append(strangers(t, d.good), d.wrong...) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := d.try(ctx, t, c); !errors.Is(err, errRefused) {
				t.Errorf("%s as %s: not refused: %v", d.name, c.name, err)
			}
			cancel()
		}
	}

	// The right proxy still cannot point its mailbox's route outside the runner networks.
	for _, addr := range []string{"8.8.8.8:53", "attacker.example:443"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := leader.ControlAs(proxyID).AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: mailboxID, RunnerId: "runner-1", RunnerAddress: addr})
		cancel()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("the mailbox's own proxy pointing its lease at %s: %v, want PermissionDenied", addr, err)
		}
	}

	// The gateway's door: a query needs a token for the mailbox's namespace.
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"malformed token", "not-a-jwt", http.StatusUnauthorized},
		{"token of another key", authtest.NewKey(t, "k1", "ES256").Sign(t, authtest.Claims("https://issuer.test", "prism", namespace)), http.StatusUnauthorized},
		{"token for another namespace", token("billing"), http.StatusForbidden},
		{"token for the namespace", token(namespace), http.StatusOK},
		{"token for every namespace", token("*"), http.StatusOK},
	} {
		code, msg, err := m.queryStats(tc.token)
		if err != nil || code != tc.want {
			t.Errorf("gateway query with %s: %d %q %v; want %d", tc.name, code, msg, err, tc.want)
		}
	}

	after := m.state(t)
	if d := diff(before, after); d != "" {
		t.Errorf("refused calls changed the state: %s", d)
	}
	if v, err := e2e.NewHTTP(5*time.Second).Metric(m.sidecar.HTTPURL(), "prism_sidecar_lease_losses_total"); err == nil && v != 0 {
		t.Errorf("the sidecar lost its lease %v times while strangers knocked", v)
	}
}

// errRefused is what a door's attempt returns when every try was refused as it should be.
var errRefused = fmt.Errorf("refused")

// refused reports whether err is the refusal c deserves: a stranger's call fails before it is
// authorized (the handshake or the TLS layer refuses it: Unavailable, or Unauthenticated for a TLS
// connection without a client certificate), a valid certificate of the wrong identity is refused by the
// door's rules (PermissionDenied) or, at doors that admit only one identity, by the handshake.
func refused(c credential, err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied:
		return c.wrongIdentity
	case codes.Unavailable, codes.Unauthenticated:
		return true
	}
	return false
}

// raftAttack sends a RequestVote at term over raft's own transport, with c's TLS (or none); nil means the
// node answered.
func raftAttack(t *testing.T, c credential, id, addr string, term uint64) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransport(&dialLayer{Listener: ln, tls: c.tls}, 1, 3*time.Second, io.Discard)
	defer tr.Close()
	var resp raft.RequestVoteResponse
	return tr.RequestVote(raft.ServerID(id), raft.ServerAddress(addr), &raft.RequestVoteRequest{
		RPCHeader:    raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(ln.Addr().String())},
		Term:         term,
		LastLogIndex: 1 << 40, LastLogTerm: term,
	}, &resp)
}

// dialLayer is a raft stream layer that dials with a stranger's TLS configuration.
type dialLayer struct {
	net.Listener
	tls *tls.Config
}

func (d *dialLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: timeout}
	if d.tls == nil {
		return dialer.Dial("tcp", string(addr))
	}
	conn, err := tls.DialWithDialer(dialer, "tcp", string(addr), d.tls)
	if err != nil {
		return nil, err
	}
	return conn, nil
}
