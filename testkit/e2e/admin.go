// Package e2e starts the parts of a Prism mesh as real `prism` processes on loopback for the suites under
// tests/: an admin cluster, runners, sidecars and gateways, each on free ports, awaited until it can be used,
// killed when the test ends and its log tail printed when the test failed. Every part is a testproc.Proc, so a
// test can kill -9, pause, resume, SIGTERM or restart it.
package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/faultproxy"
	"github.com/prism-mesh/prism/testkit/testproc"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// AdminNode is one `prism admin` process with a gRPC connection to it.
type AdminNode struct {
	*testproc.Proc
	ID, RaftAddr, GRPCAddr, HTTPAddr string
	// DataDir holds the node's raft log and snapshots; a restart finds them there.
	DataDir string
	conn    *grpc.ClientConn
	// insecure runs the node in plaintext; as caches the node's connections by caller identity.
	insecure bool
	pki      *PKI
	t        testing.TB
	mu       sync.Mutex
	as       map[string]*grpc.ClientConn
}

// Admin is the node's Admin API (reads, cluster status, members), called as the operator.
func (n *AdminNode) Admin() adminv1.AdminClient { return adminv1.NewAdminClient(n.conn) }

// Control is the node's ControlPlane API called as the operator: namespaces, not leases.
func (n *AdminNode) Control() adminv1.ControlPlaneClient {
	return adminv1.NewControlPlaneClient(n.conn)
}

// ControlAs is the node's ControlPlane API called as proxy's sidecar: its registration and the leases of
// its mailboxes (*@proxy).
func (n *AdminNode) ControlAs(proxy string) adminv1.ControlPlaneClient {
	return adminv1.NewControlPlaneClient(n.ConnAs(identity.Proxy, proxy))
}

// SessionsAs is the node's Sessions API called as proxy's sidecar: its sessions and their leases.
func (n *AdminNode) SessionsAs(proxy string) adminv1.SessionsClient {
	return adminv1.NewSessionsClient(n.ConnAs(identity.Proxy, proxy))
}

// ConnAs is a connection to the node with role/name's identity (the operator's connection in plaintext).
func (n *AdminNode) ConnAs(role identity.Role, name string) *grpc.ClientConn {
	if n.insecure {
		return n.conn
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	key := string(role) + "/" + name
	if cc, ok := n.as[key]; ok {
		return cc
	}
	cc := Dial(n.t, n.pki, n.GRPCAddr, role, name)
	n.as[key] = cc
	return cc
}

// Status is the node's cluster status, asked with a one-second bound.
func (n *AdminNode) Status(ctx context.Context) (*adminv1.GetClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return n.Admin().GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
}

// AdminOptions shape an admin cluster.
type AdminOptions struct {
	// Size is the number of voters: one bootstraps alone, more start from a static peer list.
	Size int
	// RaftFaults puts a fault proxy on every directed raft link (AdminCluster.Links), so that a test can cut
	// any node off.
	RaftFaults bool
	// Args are added to every node's flags.
	Args []string
	// Insecure runs the nodes in plaintext (--insecure); by default they run over mutual TLS with
	// certificates from PKI (Shared when nil).
	Insecure bool
	PKI      *PKI
	// DataDirs, when set, are the voters' data directories in order (an empty one: a temp dir), e.g. on a file
	// system the test can stall.
	DataDirs []string
}

// AdminCluster is the admin nodes of one test, on fast raft timing with raft-wal on temp dirs.
type AdminCluster struct {
	t        testing.TB
	insecure bool
	pki      *PKI
	// args are the options' Args, given to every node, a joiner's too.
	args  []string
	Nodes []*AdminNode
	// Links[i][j] carries node i's raft connections to node j; nil without RaftFaults.
	Links [][]*faultproxy.Proxy
}

// StartAdmins starts the voters and waits up to 60s for one of them to lead.
func StartAdmins(t testing.TB, o AdminOptions) *AdminCluster {
	t.Helper()
	c := &AdminCluster{t: t, insecure: o.Insecure, pki: orShared(t, o.PKI)}
	var peers []string
	for i := range o.Size {
		n := c.newNode(fmt.Sprintf("admin-%d", i+1))
		if i < len(o.DataDirs) && o.DataDirs[i] != "" {
			n.DataDir = o.DataDirs[i]
		}
		c.Nodes = append(c.Nodes, n)
		peers = append(peers, n.peer())
	}
	if o.RaftFaults {
		c.Links = make([][]*faultproxy.Proxy, o.Size)
	}
	if !slices.ContainsFunc(o.Args, func(a string) bool { return strings.HasPrefix(a, "--gateway-jwks") }) {
		o.Args = append(slices.Clone(o.Args), "--gateway-no-query-auth")
	}
	c.args = o.Args
	for i, n := range c.Nodes {
		args := append(n.flags(), o.Args...)
		switch o.Size {
		case 1:
			args = append(args, "--bootstrap")
		default:
			args = append(args, "--peers", strings.Join(peers, ","))
		}
		if o.RaftFaults {
			args = append(args, "--peer-dial", strings.Join(c.proxyLinks(i), ","))
		}
		n.Proc = testproc.Start(t, n.ID, args...)
	}
	testwait.For(t, 60*time.Second, "an admin leader", func() (bool, string) {
		return Leader(c.Nodes...) != nil, "no leader"
	})
	return c
}

func (c *AdminCluster) newNode(id string) *AdminNode {
	c.t.Helper()
	n := &AdminNode{ID: id, RaftAddr: testproc.FreeAddr(c.t), GRPCAddr: testproc.FreeAddr(c.t), HTTPAddr: testproc.FreeAddr(c.t), DataDir: c.t.TempDir(),
		insecure: c.insecure, pki: c.pki, t: c.t, as: map[string]*grpc.ClientConn{}}
	if c.insecure {
		cc, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { cc.Close() })
		n.conn = cc
		return n
	}
	n.conn = Dial(c.t, n.pki, n.GRPCAddr, identity.Operator, Operator)
	return n
}

// peer is the node's entry in --peers: id=raft=grpc.
func (n *AdminNode) peer() string { return n.ID + "=" + n.RaftAddr + "=" + n.GRPCAddr }

func (n *AdminNode) flags() []string {
	args := []string{"admin", "--node-id", n.ID, "--raft-addr", n.RaftAddr, "--grpc-addr", n.GRPCAddr,
		"--http-addr", n.HTTPAddr, "--data-dir", n.DataDir, "--raft-timing", "fast", "--log-format", "text"}
	if n.insecure {
		return append(args, "--insecure")
	}
	return append(args, TLSArgs(n.t, n.pki, identity.Admin, n.ID)...)
}

// proxyLinks starts a fault proxy from node i to every other node and returns node i's --peer-dial entries.
func (c *AdminCluster) proxyLinks(i int) []string {
	c.t.Helper()
	c.Links[i] = make([]*faultproxy.Proxy, len(c.Nodes))
	var dial []string
	for j, to := range c.Nodes {
		if i == j {
			continue
		}
		p, err := faultproxy.New("127.0.0.1:0", to.RaftAddr)
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { p.Close() })
		c.Links[i][j] = p
		dial = append(dial, to.ID+"="+p.Addr())
	}
	return dial
}

// GRPCAddrs are the nodes' gRPC addresses, in order.
func (c *AdminCluster) GRPCAddrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.GRPCAddr)
	}
	return out
}

// Leader is the running node among nodes that says it leads, or nil.
func Leader(nodes ...*AdminNode) *AdminNode {
	for _, n := range nodes {
		if !n.Alive() {
			continue
		}
		st, err := n.Status(context.Background())
		if err == nil && st.GetState() == "Leader" {
			return n
		}
	}
	return nil
}

// AwaitLeader waits up to 30s until the running nodes (except those in skip) agree on one leader that reports
// itself as such, and returns its index.
func (c *AdminCluster) AwaitLeader(skip ...int) int {
	c.t.Helper()
	idx := -1
	testwait.For(c.t, 30*time.Second, "an agreed leader", func() (bool, string) {
		ids := map[string]int{}
		var seen []string
		for i, n := range c.Nodes {
			if !n.Alive() || slices.Contains(skip, i) {
				continue
			}
			st, err := n.Status(context.Background())
			if err != nil {
				return false, fmt.Sprintf("%s: %v", n.ID, err)
			}
			seen = append(seen, n.ID+"->"+st.GetLeaderId())
			if st.GetLeaderId() == "" {
				return false, strings.Join(seen, " ")
			}
			ids[st.GetLeaderId()]++
			if st.GetState() == "Leader" {
				idx = i
			}
		}
		if len(ids) != 1 || idx < 0 || ids[c.Nodes[idx].ID] == 0 {
			return false, strings.Join(seen, " ")
		}
		return true, ""
	})
	return idx
}

// Follower is the index of a running node other than leader.
func (c *AdminCluster) Follower(leader int) int {
	c.t.Helper()
	for i, n := range c.Nodes {
		if i != leader && n.Alive() {
			return i
		}
	}
	c.t.Fatal("no running follower")
	return -1
}

// Isolate cuts node i off from every peer in both directions (cut) or heals it; it needs RaftFaults.
func (c *AdminCluster) Isolate(i int, cut bool) {
	for j := range c.Links {
		if i == j {
			continue
		}
		for _, p := range []*faultproxy.Proxy{c.Links[i][j], c.Links[j][i]} {
			if cut {
				p.Blackhole()
			} else {
				p.Restore()
			}
		}
	}
}

// AddJoiner starts one more node with --join: it knows every member's gRPC address but bootstraps nothing
// until the leader adds it. It returns the node's index.
func (c *AdminCluster) AddJoiner() int {
	c.t.Helper()
	n := c.newNode(fmt.Sprintf("admin-%d", len(c.Nodes)+1))
	var peers []string
	for _, o := range append(slices.Clone(c.Nodes), n) {
		peers = append(peers, o.peer())
	}
	n.Proc = testproc.Start(c.t, n.ID, append(append(n.flags(), c.args...), "--join", "--peers", strings.Join(peers, ","))...)
	c.Nodes = append(c.Nodes, n)
	return len(c.Nodes) - 1
}

// Lease is the lease timing of a namespace and of the sidecars that heartbeat its mailboxes.
type Lease struct {
	TTL, Grace, Heartbeat time.Duration
}

// Config is the namespace's lease configuration.
func (l Lease) Config() *adminv1.LeaseConfig {
	return &adminv1.LeaseConfig{Ttl: durationpb.New(l.TTL), Grace: durationpb.New(l.Grace), HeartbeatInterval: durationpb.New(l.Heartbeat)}
}

// CreateNamespace creates ns through any running node (followers forward writes to the leader), retrying
// until it succeeds within d.
func (c *AdminCluster) CreateNamespace(d time.Duration, ns string, cfg *adminv1.NamespaceConfig) {
	c.t.Helper()
	testwait.For(c.t, d, "namespace "+ns+" created", func() (bool, string) {
		var errs []string
		for _, n := range c.Nodes {
			if !n.Alive() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := n.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: cfg})
			cancel()
			if err == nil {
				return true, ""
			}
			errs = append(errs, n.ID+": "+err.Error())
		}
		return false, strings.Join(errs, "; ")
	})
}
