// Package routing proves, on real admin nodes with real xDS clients, that the
// routes follow the proxies and not the leases: lease changes put no route,
// cluster or endpoint on the wire, a runner's new address is one endpoint
// resource, and a new proxy is one route table and one cluster list of a
// bounded size (docs/architecture.md#routing).
package routing

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// The resource types as prism_xds_push_bytes_total labels them.
const (
	routeType    = "RouteConfiguration"
	clusterType  = "Cluster"
	endpointType = "ClusterLoadAssignment"
	listenerType = "Listener"
)

var metrics = e2e.NewHTTP(5 * time.Second)

// pushes is what the admin nodes have sent, summed over nodes: by type
// ("Cluster") and by type and protocol ("Cluster/sotw", "Cluster/delta").
type pushes map[string]struct{ n, bytes float64 }

func scrape(t *testing.T, c *e2e.AdminCluster) pushes {
	t.Helper()
	out := pushes{}
	for _, typ := range []string{routeType, clusterType, endpointType, listenerType} {
		for _, proto := range []string{"sotw", "delta"} {
			var p struct{ n, bytes float64 }
			for _, n := range c.Nodes {
				for name, into := range map[string]*float64{"prism_xds_pushes_total": &p.n, "prism_xds_push_bytes_total": &p.bytes} {
					v, err := metrics.Metric("http://"+n.HTTPAddr, name, e2e.Label("type", typ), e2e.Label("protocol", proto))
					if err != nil && !isNoSeries(err) {
						t.Fatalf("%s %s on %s: %v", name, typ, n.ID, err)
					}
					*into += v
				}
			}
			out[typ+"/"+proto] = p
			sum := out[typ]
			sum.n, sum.bytes = sum.n+p.n, sum.bytes+p.bytes
			out[typ] = sum
		}
	}
	return out
}

func isNoSeries(err error) bool { return errors.Is(err, e2e.ErrNoSeries) }

// sub is what was pushed between two scrapes.
func (p pushes) sub(before pushes) pushes {
	out := pushes{}
	for typ, v := range p {
		out[typ] = struct{ n, bytes float64 }{v.n - before[typ].n, v.bytes - before[typ].bytes}
	}
	return out
}

// wireMesh is three admin nodes, two registered proxies kept live by their
// heartbeats, namespaces placed on them, and xDS clients of both kinds: a
// `prism gateway` (grpc-go's xDS client, state of the world) and a delta
// client asking as Envoy does.
type wireMesh struct {
	t       *testing.T
	c       *e2e.AdminCluster
	proxies []string
	// mailboxes are "{ns}@{proxy}" ids each proxy's runner may lease.
	mailboxes []string
	clients   int
}

func startMesh(t *testing.T, ctx context.Context, namespaces int) *wireMesh {
	t.Helper()
	m := &wireMesh{t: t, c: e2e.StartAdmins(t, e2e.AdminOptions{Size: 3}), proxies: []string{"proxy-a", "proxy-b"}}
	for _, p := range m.proxies {
		m.register(ctx, p, "127.0.0.1:"+strconv.Itoa(9100+len(p)))
	}
	m.heartbeat(ctx)
	tab := placement.Compute(m.proxies)
	for i := 0; len(m.mailboxes) < namespaces; i++ {
		ns := fmt.Sprintf("wire-%d", i)
		m.any(ctx, "create "+ns, func(ctx context.Context, n *e2e.AdminNode) error {
			_, err := n.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{ns}}})
			return err
		})
		m.mailboxes = append(m.mailboxes, ns+"@"+tab.Owner(placement.Partition(ns)))
	}
	gw := e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gw", Admins: m.c.GRPCAddrs(), Timeout: 5 * time.Second})
	testwait.For(t, 60*time.Second, "prism gateway's routes", func() (bool, string) {
		code, body, _, err := e2e.NewHTTP(2 * time.Second).Get(gw.HTTPURL() + "/readyz")
		return err == nil && code == 200, fmt.Sprint(code, body, err)
	})
	startDelta(ctx, t, m.c.Nodes[1], "envoy-gw")
	m.clients = 2
	return m
}

// any runs f on the first node that answers.
func (m *wireMesh) any(ctx context.Context, what string, f func(context.Context, *e2e.AdminNode) error) {
	m.t.Helper()
	var err error
	for attempt := 0; attempt < 50 && ctx.Err() == nil; attempt++ {
		n := m.c.Nodes[attempt%len(m.c.Nodes)]
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = f(actx, n)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.t.Fatalf("%s: %v", what, err)
}

func (m *wireMesh) register(ctx context.Context, proxy, addr string) {
	m.t.Helper()
	m.any(ctx, "register "+proxy, func(ctx context.Context, n *e2e.AdminNode) error {
		_, err := n.ControlAs(proxy).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: proxy, Address: addr, RunnerId: proxy}})
		return err
	})
}

// heartbeat keeps every proxy of m live until ctx ends, so no staleness
// changes what is routed while the test counts.
func (m *wireMesh) heartbeat(ctx context.Context) {
	var wg sync.WaitGroup
	m.t.Cleanup(wg.Wait)
	for _, p := range m.proxies {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				n := m.c.Nodes[i%len(m.c.Nodes)]
				hctx, cancel := context.WithTimeout(ctx, time.Second)
				_, _ = n.ControlAs(p).ProxyHeartbeat(hctx, &adminv1.ProxyHeartbeatRequest{ProxyId: p})
				cancel()
				select {
				case <-ctx.Done():
				case <-time.After(300 * time.Millisecond):
				}
			}
		})
	}
}

// settle waits until no admin node has pushed anything for quiet, so a
// count starts from rest.
func (m *wireMesh) settle(quiet time.Duration) pushes {
	m.t.Helper()
	last := scrape(m.t, m.c)
	stable := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(quiet / 4)
		now := scrape(m.t, m.c)
		if fmt.Sprint(now) != fmt.Sprint(last) {
			last, stable = now, time.Now()
			continue
		}
		if time.Since(stable) >= quiet {
			return last
		}
	}
	m.t.Fatalf("the admin nodes never stopped pushing: %v", last)
	return nil
}

// TestLeaseChangesPutNothingOnTheWire runs 10,000 lease operations
// (acquire, renew, release, re-grant) through the admin nodes while both
// kinds of xDS client are connected: no route, cluster, listener or endpoint
// byte may be pushed, because routing follows proxies, not leases.
func TestLeaseChangesPutNothingOnTheWire(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	m := startMesh(t, ctx, 40)
	before := m.settle(time.Second)

	const ops = 10000
	var done, regranted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(m.mailboxes))
	for w, id := range m.mailboxes {
		wg.Go(func() {
			proxy := id[strings.LastIndexByte(id, '@')+1:]
			n := m.c.Nodes[w%len(m.c.Nodes)]
			cl := n.ControlAs(proxy)
			// An election under this load (2 cores, three nodes) refuses
			// calls Unavailable (no leader, NOT_LEADER) without running
			// them; a sidecar's admin client retries those, and so does
			// this loop, since what is measured is the wire, not the flap.
			call := func(f func(context.Context) error) error {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				err := f(cctx)
				for status.Code(err) == codes.Unavailable && cctx.Err() == nil {
					time.Sleep(20 * time.Millisecond)
					err = f(cctx)
				}
				done.Add(1)
				return err
			}
			for done.Load() < ops && ctx.Err() == nil {
				var epoch uint64
				if err := call(func(ctx context.Context) error {
					r, err := cl.AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: id, RunnerId: proxy, RunnerAddress: "127.0.0.1:9100"})
					if err == nil && !r.GetGranted() {
						err = fmt.Errorf("refused: %v", r.GetRefusal())
					}
					epoch = r.GetLease().GetEpoch()
					return err
				}); err != nil {
					errs <- fmt.Errorf("acquire %s: %w", id, err)
					return
				}
				if err := call(func(ctx context.Context) error {
					r, err := cl.MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: id, RunnerId: proxy, Epoch: epoch})
					if err == nil && !r.GetRenewed() {
						err = fmt.Errorf("not renewed: %v", r)
					}
					return err
				}); err != nil {
					errs <- fmt.Errorf("renew %s: %w", id, err)
					return
				}
				if err := call(func(ctx context.Context) error {
					_, err := cl.ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: id, RunnerId: proxy, Epoch: epoch})
					return err
				}); err != nil {
					errs <- fmt.Errorf("release %s: %w", id, err)
					return
				}
				regranted.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := m.settle(time.Second)
	d := after.sub(before)
	t.Logf("%d lease operations (%d acquire-renew-release rounds on %d mailboxes): pushed %v", done.Load(), regranted.Load(), len(m.mailboxes), d)
	if done.Load() < ops {
		t.Fatalf("only %d operations ran", done.Load())
	}
	for _, typ := range []string{routeType, clusterType, listenerType, endpointType} {
		if d[typ].n != 0 || d[typ].bytes != 0 {
			t.Errorf("%d lease operations pushed %v %s responses (%v bytes); routing must not follow leases", done.Load(), d[typ].n, typ, d[typ].bytes)
		}
	}
}

// TestProxyChangesPushOnlyWhatChanged: a runner back at a new address is
// one endpoint resource per client, under 1 KB; a new proxy is one route
// table and one cluster list per client, each under 512 KB.
func TestProxyChangesPushOnlyWhatChanged(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m := startMesh(t, ctx, 4)

	before := m.settle(time.Second)
	m.register(ctx, "proxy-a", freeAddr(t))
	moved := m.settle(time.Second).sub(before)
	t.Logf("runner of proxy-a at a new address: pushed %v", moved)
	if got := moved[endpointType]; got.n != float64(m.clients) || got.bytes > float64(m.clients)*1024 {
		t.Errorf("a runner's new address pushed %v endpoint responses of %v bytes, want %d of at most 1 KB each", got.n, got.bytes, m.clients)
	}
	for _, typ := range []string{routeType, clusterType, listenerType} {
		if moved[typ].n != 0 {
			t.Errorf("a runner's new address pushed %v %s responses", moved[typ].n, typ)
		}
	}

	before = m.settle(time.Second)
	m.proxies = append(m.proxies, "proxy-c")
	m.register(ctx, "proxy-c", freeAddr(t))
	joined := m.settle(time.Second).sub(before)
	t.Logf("proxy-c joined: pushed %v", joined)
	// Envoy (delta) gets the one new route table and the one new cluster.
	// grpc-go (state of the world) gets the route table once and the
	// cluster list at most twice: once when the version moves, with the
	// clusters it asked for, and once when it asks for proxy-c's cluster,
	// which it learns of from that route table.
	for _, c := range []struct {
		key  string
		want float64
		max  bool
	}{
		{routeType + "/delta", 1, false}, {clusterType + "/delta", 1, false},
		{routeType + "/sotw", 1, false}, {clusterType + "/sotw", 2, true},
	} {
		got := joined[c.key]
		if got.n != c.want && !(c.max && got.n >= 1 && got.n <= c.want) {
			t.Errorf("a joining proxy pushed %v %s responses, want %v", got.n, c.key, c.want)
		}
		if got.n > 0 && got.bytes/got.n > 512<<10 {
			t.Errorf("a joining proxy pushed %s responses of %v bytes on average, over 512 KB", c.key, got.bytes/got.n)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startDelta subscribes to everything over delta ADS as Envoy does (user
// agent "envoy", gateway identity), ACKing every response, until ctx ends.
func startDelta(ctx context.Context, t *testing.T, n *e2e.AdminNode, nodeID string) {
	t.Helper()
	conn := n.ConnAs(identity.Gateway, nodeID)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatalf("delta ADS stream to %s: %v", n.ID, err)
	}
	node := &corev3.Node{Id: nodeID, UserAgentName: "envoy"}
	for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType} {
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typ, ResourceNamesSubscribe: []string{"*"}}); err != nil {
			t.Fatalf("subscribe %s: %v", typ, err)
		}
	}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
				return
			}
		}
	}()
}
