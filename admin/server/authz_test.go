package server

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	lookupv1 "github.com/prism-mesh/prism/proto/prism/lookup/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/lookup"
)

// records keeps the log records of a node, for the audit lines.
type records struct {
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// attr is the value of key in the first record with message msg.
func (r *records) attr(msg, key string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.got {
		if rec.Message != msg {
			continue
		}
		val, found := "", false
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				val, found = a.Value.String(), true
				return false
			}
			return true
		})
		return val, found
	}
	return "", false
}

// startTLSNode starts a node serving mutual TLS as admin/<id> and waits
// until it leads when it bootstraps.
func startTLSNode(t *testing.T, p *pkitest.PKI, cfg NodeConfig) *Node {
	t.Helper()
	cfg.Raft.Timing = raftnode.FastTiming()
	cfg.GRPCAddr = "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	cfg.TLS = p.Source(identity.Admin, cfg.Raft.ID)
	n, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Stop(ctx)
	})
	if cfg.Raft.Bootstrap {
		awaitState(t, cfg.Raft.ID+" to lead", func() bool { l, _ := n.Raft.Leadership(); return l.IsLeader && n.Lessor.Primary() })
	}
	return n
}

// dialAs connects to addr presenting tlsCfg.
func dialAs(t *testing.T, addr string, tlsCfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// as is a connection to n with the identity role/name of p's CA.
func as(t *testing.T, p *pkitest.PKI, addr string, role identity.Role, name string) *grpc.ClientConn {
	t.Helper()
	return dialAs(t, addr, p.Source(role, name).ClientConfig(pki.RoleIs(identity.Admin)))
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if status.Code(err) != want {
		t.Fatalf("%s: %v, want %s", what, err, want)
	}
}

// Every method the listener serves has a rule, and every rule names a
// method it serves: a new RPC cannot be reachable without someone saying
// who may call it.
func TestPolicyCoversEveryMethod(t *testing.T) {
	t.Parallel()
	n := startTLSNode(t, pkitest.New(t), NodeConfig{
		Raft: raftnode.Config{ID: "solo", Bootstrap: true}, XDS: true, GatewayAddr: "127.0.0.1:8080",
	})
	policy := Policy()
	served := map[string]bool{}
	for svc, info := range n.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			served[full] = true
			if _, ok := policy[full]; !ok {
				t.Errorf("%s is served but has no rule in Policy", full)
			}
		}
	}
	for m := range policy {
		if !served[m] {
			t.Errorf("Policy has a rule for %s, which is not served", m)
		}
	}
}

// A node refuses to start with a certificate that is not its own admin
// identity: the others would refuse its forwards and its raft traffic.
func TestNodeRefusesAnotherIdentity(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	for _, src := range []*pki.Source{p.Source(identity.Proxy, "solo"), p.Source(identity.Admin, "other")} {
		n, err := Start(NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, GRPCAddr: "127.0.0.1:0", Logger: quiet(), TLS: src})
		if err == nil {
			_ = n.Stop(context.Background())
			t.Fatalf("started with %s", src.Identity())
		}
		if !strings.Contains(err.Error(), "want an admin/solo identity") {
			t.Fatalf("start with %s: %v", src.Identity(), err)
		}
	}
}

// A client the handshake cannot authenticate gets no answer, and its write
// changes nothing.
func TestUnauthenticatedClientsAreRefused(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	n := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, XDS: true, GatewayAddr: "127.0.0.1:8080"})
	expired := pkitest.Presented(t, p.Expired(identity.Operator, "old"))
	other := pkitest.Presented(t, pkitest.New(t).Files(identity.Operator, "op"))
	//nolint:gosec // these clients skip verifying the server: the test is about the server's check of them
	cases := []struct {
		name string
		tls  *tls.Config
		// plaintext dials without TLS at all.
		plaintext bool
	}{
		{name: "plaintext", plaintext: true},
		{name: "no client certificate", tls: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}},
		{name: "certificate of another CA", tls: other},
		{name: "expired certificate", tls: expired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var cc *grpc.ClientConn
			if tc.plaintext {
				var err error
				if cc, err = grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cc.Close() })
			} else {
				cc = dialAs(t, n.GRPCAddr(), tc.tls)
			}
			c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := adminv1.NewControlPlaneClient(cc).CreateNamespace(c, &adminv1.CreateNamespaceRequest{
				Namespace: "evil-" + strings.ReplaceAll(tc.name, " ", "-"), Config: &adminv1.NamespaceConfig{Topics: []string{"t"}},
			})
			if err == nil {
				t.Fatal("CreateNamespace succeeded")
			}
			if _, err := healthpb.NewHealthClient(cc).Check(c, &healthpb.HealthCheckRequest{}); err == nil {
				t.Fatal("health check succeeded")
			}
			if _, err := routeLookup(c, cc, "any"); err == nil {
				t.Fatal("route lookup succeeded")
			}
			if _, err := checkAlias(c, cc, "any"); err == nil {
				t.Fatal("ext_authz check succeeded")
			}
		})
	}
	t.Cleanup(func() {
		ns, _ := n.FSM.Namespaces()
		if len(ns) != 0 {
			t.Errorf("refused clients created namespaces: %v", ns)
		}
	})
}

// A proxy acts for its own proxy id only, and other roles only where the
// table lets them; a refused call changes nothing.
func TestIdentitiesActOnlyWithinTheirRole(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	logs := &records{}
	n := startTLSNode(t, p, NodeConfig{
		Raft: raftnode.Config{ID: "solo", Bootstrap: true}, XDS: true, GatewayAddr: "127.0.0.1:8080",
		Logger: slog.New(logs),
	})
	addr := n.GRPCAddr()
	c := ctx(t)
	op := as(t, p, addr, identity.Operator, "alice")
	proxyA, proxyB := as(t, p, addr, identity.Proxy, "pa"), as(t, p, addr, identity.Proxy, "pb")
	gateway, reader := as(t, p, addr, identity.Gateway, "gw"), as(t, p, addr, identity.Reader, "ro")

	// B alone is live when nb is created, so nb is placed on B; then A joins.
	if _, err := adminv1.NewControlPlaneClient(proxyB).RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "pb", Address: "127.0.0.1:9000", RunnerId: "rb",
	}}); err != nil {
		t.Fatal(err)
	}
	created, err := adminv1.NewControlPlaneClient(op).CreateNamespace(c, &adminv1.CreateNamespaceRequest{
		Namespace: "nb", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}, Principal: "someone-else",
	})
	if err != nil || created.GetNamespace().GetAssignedProxyId() != "pb" {
		t.Fatalf("create nb: %v, %v", created, err)
	}
	acq, err := adminv1.NewControlPlaneClient(proxyB).AcquireLease(c, &adminv1.AcquireLeaseRequest{
		MailboxId: "nb@pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:9001",
	})
	if err != nil || !acq.GetGranted() {
		t.Fatalf("B acquires nb@pb: %v, %v", acq, err)
	}
	if _, err := adminv1.NewControlPlaneClient(proxyA).RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "pa", Address: "127.0.0.1:9100", RunnerId: "ra",
	}}); err != nil {
		t.Fatal(err)
	}
	// The audit principal is the caller's identity, not the field it sent.
	if got, _ := logs.attr("namespace created", "principal"); got != "spiffe://prism.local/operator/alice" {
		t.Errorf("audit principal of nb = %q, want the operator's identity", got)
	}

	before := snapshot(t, n)
	cpA, cpGW, admGW, admRO := adminv1.NewControlPlaneClient(proxyA), adminv1.NewControlPlaneClient(gateway),
		adminv1.NewAdminClient(gateway), adminv1.NewAdminClient(reader)
	denied := []struct {
		name string
		call func() error
	}{
		{"proxy A acquires nb@pb", func() error {
			_, err := cpA.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:6666"})
			return err
		}},
		{"proxy A renews nb@pb", func() error {
			_, err := cpA.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "nb@pb", RunnerId: "rb", Epoch: acq.GetLease().GetEpoch()})
			return err
		}},
		{"proxy A releases nb@pb", func() error {
			_, err := cpA.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb"})
			return err
		}},
		{"proxy A registers as pb", func() error {
			_, err := cpA.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
				ProxyId: "pb", Address: "127.0.0.1:6666", RunnerId: "evil"}})
			return err
		}},
		{"proxy A heartbeats pb", func() error {
			_, err := cpA.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "pb"})
			return err
		}},
		{"proxy A watches pb", func() error {
			s, err := cpA.WatchAssignments(c, &adminv1.WatchAssignmentsRequest{ProxyId: "pb"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}},
		{"proxy A names pb as the caller", func() error {
			out := metadata.AppendToOutgoingContext(c, callerKey, "spiffe://prism.local/proxy/pb")
			_, err := cpA.ReleaseLease(out, &adminv1.ReleaseLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb"})
			return err
		}},
		{"proxy A presents its call as forwarded", func() error {
			out := metadata.AppendToOutgoingContext(c, forwardedKey, "solo")
			_, err := cpA.ProxyHeartbeat(out, &adminv1.ProxyHeartbeatRequest{ProxyId: "pa"})
			return err
		}},
		{"proxy A lists leases", func() error {
			_, err := adminv1.NewAdminClient(proxyA).ListLeases(c, &adminv1.ListLeasesRequest{})
			return err
		}},
		{"proxy A asks for the term", func() error {
			_, err := adminv1.NewPeerClient(proxyA).Term(c, &adminv1.TermRequest{})
			return err
		}},
		{"proxy A subscribes to xDS", func() error { return subscribe(c, proxyA) }},
		{"proxy A queries the not-found service", func() error {
			_, err := mailboxv1.NewMailboxQueryClient(proxyA).GetStats(c, &mailboxv1.GetStatsRequest{})
			return err
		}},
		{"gateway creates a namespace", func() error {
			_, err := cpGW.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "gw", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
			return err
		}},
		{"gateway deletes nb", func() error {
			_, err := cpGW.DeleteNamespace(c, &adminv1.DeleteNamespaceRequest{Namespace: "nb"})
			return err
		}},
		{"gateway acquires nb@pb", func() error {
			_, err := cpGW.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:6666"})
			return err
		}},
		{"gateway lists namespaces", func() error {
			_, err := admGW.ListNamespaces(c, &adminv1.ListNamespacesRequest{})
			return err
		}},
		{"reader adds a voter", func() error {
			_, err := admRO.AddVoter(c, &adminv1.AddVoterRequest{Id: "x", RaftAddress: "127.0.0.1:1"})
			return err
		}},
		{"reader removes the leader", func() error {
			_, err := admRO.RemoveServer(c, &adminv1.RemoveServerRequest{Id: "solo"})
			return err
		}},
		{"reader creates a namespace", func() error {
			_, err := adminv1.NewControlPlaneClient(reader).CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "ro", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
			return err
		}},
		{"operator acquires nb@pb", func() error {
			_, err := adminv1.NewControlPlaneClient(op).AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:6666"})
			return err
		}},
		{"operator subscribes to xDS", func() error { return subscribe(c, op) }},
		{"proxy A looks nb up", func() error { _, err := routeLookup(c, proxyA, "nb"); return err }},
		{"reader looks nb up", func() error { _, err := routeLookup(c, reader, "nb"); return err }},
		{"operator asks ext_authz about nb", func() error { _, err := checkAlias(c, op, "nb"); return err }},
		{"proxy A asks ext_authz about nb", func() error { _, err := checkAlias(c, proxyA, "nb"); return err }},
	}
	for _, d := range denied {
		wantCode(t, d.name, d.call(), codes.PermissionDenied)
	}
	if after := snapshot(t, n); !slices.Equal(before, after) {
		t.Fatalf("refused calls changed the state:\nbefore %v\nafter  %v", before, after)
	}

	allowed := []struct {
		name string
		call func() error
	}{
		{"proxy B renews nb@pb", func() error {
			r, err := adminv1.NewControlPlaneClient(proxyB).MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "nb@pb", RunnerId: "rb", Epoch: acq.GetLease().GetEpoch()})
			if err == nil && !r.GetRenewed() {
				t.Errorf("renewal refused: %v", r.GetRefusal())
			}
			return err
		}},
		{"proxy A watches its own assignments", func() error {
			s, err := cpA.WatchAssignments(c, &adminv1.WatchAssignmentsRequest{ProxyId: "pa"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}},
		{"reader lists leases", func() error {
			r, err := admRO.ListLeases(c, &adminv1.ListLeasesRequest{})
			if err == nil && len(r.GetLeases()) != 1 {
				t.Errorf("reader sees %d leases, want 1", len(r.GetLeases()))
			}
			return err
		}},
		{"reader reads the cluster status", func() error {
			_, err := admRO.GetClusterStatus(c, &adminv1.GetClusterStatusRequest{})
			return err
		}},
		{"every role checks health", func() error {
			for _, cc := range []*grpc.ClientConn{op, proxyA, gateway, reader} {
				if _, err := healthpb.NewHealthClient(cc).Check(c, &healthpb.HealthCheckRequest{}); err != nil {
					return err
				}
			}
			return nil
		}},
		{"an admin node asks for the term", func() error {
			_, err := adminv1.NewPeerClient(as(t, p, addr, identity.Admin, "other")).Term(c, &adminv1.TermRequest{})
			return err
		}},
		{"gateway queries the not-found service", func() error {
			out := metadata.AppendToOutgoingContext(c, mesh.HeaderMailboxID, "gone@pb")
			_, err := mailboxv1.NewMailboxQueryClient(gateway).GetStats(out, &mailboxv1.GetStatsRequest{})
			if status.Code(err) == codes.NotFound {
				return nil
			}
			return err
		}},
		{"gateway subscribes to xDS", func() error { return subscribe(c, gateway) }},
		{"gateway looks nb up", func() error {
			r, err := routeLookup(c, gateway, "nb")
			want := ir.LookupCluster(ir.ProxyCluster("pb"))
			if err == nil && (!slices.Equal(r.GetTargets(), []string{want}) || r.GetHeaderData() != "nb@pb") {
				t.Errorf("lookup of nb: %v, want %s with nb@pb", r, want)
			}
			return err
		}},
		{"gateway asks ext_authz about nb", func() error {
			r, err := checkAlias(c, gateway, "nb")
			if h := r.GetOkResponse().GetHeaders(); err == nil && (len(h) != 1 || h[0].GetHeader().GetValue() != "nb@pb") {
				t.Errorf("ext_authz for nb: %v, want x-mailbox-id nb@pb", r)
			}
			return err
		}},
		{"operator deletes nb", func() error {
			_, err := adminv1.NewControlPlaneClient(op).DeleteNamespace(c, &adminv1.DeleteNamespaceRequest{Namespace: "nb"})
			return err
		}},
	}
	for _, a := range allowed {
		if err := a.call(); err != nil {
			t.Errorf("%s: %v", a.name, err)
		}
	}
	if got, _ := logs.attr("namespace deleted", "principal"); got != "spiffe://prism.local/operator/alice" {
		t.Errorf("audit principal of the deletion = %q, want the operator's identity", got)
	}
}

// subscribe opens an ADS stream on cc and waits for its first answer.
func subscribe(ctx context.Context, cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	// A stream the server refused answers Send with io.EOF; Recv has why.
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "gw"}, TypeUrl: clusterType}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = s.Recv()
	return err
}

// routeLookup asks the RLS service on cc for namespace ns.
func routeLookup(ctx context.Context, cc *grpc.ClientConn, ns string) (*lookupv1.RouteLookupResponse, error) {
	res := &lookupv1.RouteLookupResponse{}
	err := cc.Invoke(ctx, lookup.RouteLookupMethod, &lookupv1.RouteLookupRequest{
		TargetType: "grpc", KeyMap: map[string]string{lookup.NamespaceKey: ns},
	}, res)
	return res, err
}

// checkAlias asks ext_authz on cc about an HTTP request for namespace ns.
func checkAlias(ctx context.Context, cc *grpc.ClientConn, ns string) (*authv3.CheckResponse, error) {
	path := "/v1/namespaces/" + ns + "/events"
	return authv3.NewAuthorizationClient(cc).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: path, Headers: map[string]string{":path": path}}},
	}})
}

// snapshot is the state a refused call must not change: namespaces and
// their placement, proxies, leases with the leader's live expiry, and the
// raft members.
func snapshot(t *testing.T, n *Node) []string {
	t.Helper()
	var out []string
	ns, _ := n.FSM.Namespaces()
	for _, x := range ns {
		out = append(out, "namespace "+x.String())
	}
	ps, _ := n.FSM.Proxies()
	for _, x := range ps {
		out = append(out, "proxy "+x.String())
	}
	ls, _ := n.FSM.Leases()
	for _, x := range ls {
		out = append(out, "lease "+n.Lessor.Annotate(x).String())
	}
	members, err := n.Raft.Members()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		out = append(out, "member "+m.ID+" "+m.Addr)
	}
	slices.Sort(out)
	return out
}

// A follower forwards with its own admin identity for the original caller,
// and the leader authorizes that caller: proxy A through the follower acts
// for itself and cannot act for B, and an admin peer naming a caller gets
// that caller's rights, not its own.
func TestForwardingKeepsTheCallersIdentity(t *testing.T) {
	t.Parallel()
	for attempt := 1; !forwardingKeepsTheCallersIdentity(t); attempt++ {
		if attempt == 3 {
			t.Fatal("leadership left the first node in three attempts")
		}
	}
}

// forwardingKeepsTheCallersIdentity runs one attempt; false when the first
// node lost leadership while the state was compared, which a loaded machine
// can cause under fast timing: the new leader's lessor annotates leases
// anew, so a changed snapshot would not be a refused call's doing.
func forwardingKeepsTheCallersIdentity(t *testing.T) bool {
	t.Helper()
	p := pkitest.New(t)
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	// No mover: once A registers, placement gives nb's partition to A, and a
	// rebalance starting between the two snapshots is not a refused call's doing.
	lead := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "a", DataDir: t.TempDir(), Listener: listen(), Bootstrap: true}, Moves: MoveConfig{Interval: time.Hour}})
	logs := &records{}
	follower := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{
		ID: "b", DataDir: t.TempDir(), Listener: listen(), JoinPeers: []raftnode.Peer{{ID: "a", Addr: lead.Raft.Addr()}},
	}, Logger: slog.New(logs)})
	c := ctx(t)
	if _, err := adminv1.NewAdminClient(as(t, p, lead.GRPCAddr(), identity.Operator, "alice")).AddVoter(c, &adminv1.AddVoterRequest{
		Id: "b", RaftAddress: follower.Raft.Addr(), GrpcAddress: follower.GRPCAddr(),
	}); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "b to follow a", func() bool {
		l, _ := follower.Raft.Leadership()
		return l.LeaderID == "a" && follower.FSM.MemberAddress("a") != ""
	})
	defer func() { _ = follower.Stop(ctx(t)) }()
	defer func() { _ = lead.Stop(ctx(t)) }()
	first, _ := lead.Raft.Leadership()

	via := follower.GRPCAddr()
	cpA, cpB := adminv1.NewControlPlaneClient(as(t, p, via, identity.Proxy, "pa")), adminv1.NewControlPlaneClient(as(t, p, via, identity.Proxy, "pb"))
	if _, err := cpB.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "pb", Address: "127.0.0.1:9000", RunnerId: "rb"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminv1.NewControlPlaneClient(as(t, p, via, identity.Operator, "bob")).CreateNamespace(c, &adminv1.CreateNamespaceRequest{
		Namespace: "nb", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}},
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := logs.attr("namespace created", "principal"); got != "spiffe://prism.local/operator/bob" {
		t.Errorf("audit principal through the follower = %q, want the operator's identity", got)
	}
	acq, err := cpB.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb", RunnerAddress: "127.0.0.1:9001"})
	if err != nil || !acq.GetGranted() {
		t.Fatalf("B acquires its own mailbox through the follower: %v, %v", acq, err)
	}
	// A renewal needs the leader's quorum round: Term asked of b over mTLS.
	if hb, err := cpB.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: "nb@pb", RunnerId: "rb", Epoch: acq.GetLease().GetEpoch()}); err != nil || !hb.GetRenewed() {
		t.Fatalf("B renews its own mailbox through the follower: %v, %v", hb, err)
	}
	if _, err := cpA.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "pa", Address: "127.0.0.1:9100", RunnerId: "ra"}}); err != nil {
		t.Fatalf("A registers itself through the follower: %v", err)
	}
	before := snapshot(t, lead)
	_, err = cpA.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb"})
	wantCode(t, "A releases nb@pb through the follower", err, codes.PermissionDenied)

	// What the follower sends the leader, from an admin identity.
	peer := adminv1.NewControlPlaneClient(as(t, p, lead.GRPCAddr(), identity.Admin, "b"))
	forwardedFor := func(caller string) context.Context {
		return metadata.AppendToOutgoingContext(c, forwardedKey, "b", callerKey, caller)
	}
	_, err = peer.ReleaseLease(forwardedFor("spiffe://prism.local/proxy/pa"), &adminv1.ReleaseLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb"})
	wantCode(t, "a release of nb@pb forwarded for A", err, codes.PermissionDenied)
	_, err = peer.CreateNamespace(forwardedFor("spiffe://prism.local/gateway/gw"), &adminv1.CreateNamespaceRequest{Namespace: "gw", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
	wantCode(t, "a create forwarded for a gateway", err, codes.PermissionDenied)
	_, err = peer.ProxyHeartbeat(forwardedFor("spiffe://elsewhere/proxy/pa"), &adminv1.ProxyHeartbeatRequest{ProxyId: "pa"})
	wantCode(t, "a heartbeat forwarded for another trust domain", err, codes.PermissionDenied)
	_, err = peer.ProxyHeartbeat(c, &adminv1.ProxyHeartbeatRequest{ProxyId: "pa"})
	wantCode(t, "an admin node's own heartbeat for A", err, codes.PermissionDenied)
	after := snapshot(t, lead)
	if now, _ := lead.Raft.Leadership(); !now.IsLeader || now.Term != first.Term {
		t.Logf("a lost leadership (term %d -> %d, leader %q): trying again", first.Term, now.Term, now.LeaderID)
		return false
	}
	if !slices.Equal(before, after) {
		t.Fatalf("refused forwards changed the state:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := peer.ProxyHeartbeat(forwardedFor("spiffe://prism.local/proxy/pa"), &adminv1.ProxyHeartbeatRequest{ProxyId: "pa"}); err != nil {
		t.Fatalf("a heartbeat forwarded for A: %v", err)
	}
	if rel, err := cpB.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "nb@pb", RunnerId: "rb"}); err != nil || !rel.GetReleased() {
		t.Fatalf("B releases its own mailbox through the follower: %v, %v", rel, err)
	}
	return true
}
