// Package admincluster runs real `prism admin` processes on loopback: three
// voters with raft-wal on temp dirs, the real TCP transport, and a fault
// proxy on every directed raft link so a node can be cut off completely.
package admincluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/faultproxy"
	"github.com/prism-mesh/prism/internal/testbin"
	"github.com/prism-mesh/prism/internal/testproc"
	"github.com/prism-mesh/prism/internal/testwait"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

type node struct {
	id       string
	raftAddr string
	grpcAddr string
	httpAddr string
	dataDir  string
	logPath  string
	args     []string
	cmd      *exec.Cmd
	exited   chan struct{}
	cc       *grpc.ClientConn
}

type cluster struct {
	t     *testing.T
	bin   string
	nodes []*node
	// links[i][j] carries node i's raft connections to node j.
	links [][]*faultproxy.Proxy
}

// startCluster starts size voters with a static peer list.
func startCluster(t *testing.T, size int) *cluster {
	t.Helper()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: bin}
	root := t.TempDir()
	var peers []string
	for i := range size {
		n := &node{
			id:       fmt.Sprintf("admin-%d", i+1),
			raftAddr: testproc.FreeAddr(t),
			grpcAddr: testproc.FreeAddr(t),
			httpAddr: testproc.FreeAddr(t),
			dataDir:  filepath.Join(root, fmt.Sprintf("n%d", i+1)),
			logPath:  filepath.Join(root, fmt.Sprintf("n%d.log", i+1)),
		}
		c.nodes = append(c.nodes, n)
		peers = append(peers, n.id+"="+n.raftAddr+"="+n.grpcAddr)
	}
	c.links = make([][]*faultproxy.Proxy, size)
	for i := range size {
		c.links[i] = make([]*faultproxy.Proxy, size)
		var dial []string
		for j := range size {
			if i == j {
				continue
			}
			p, err := faultproxy.New("127.0.0.1:0", c.nodes[j].raftAddr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			c.links[i][j] = p
			dial = append(dial, c.nodes[j].id+"="+p.Addr())
		}
		n := c.nodes[i]
		n.args = []string{"admin",
			"--node-id", n.id, "--raft-addr", n.raftAddr, "--grpc-addr", n.grpcAddr, "--http-addr", n.httpAddr,
			"--data-dir", n.dataDir, "--peers", strings.Join(peers, ","), "--peer-dial", strings.Join(dial, ","),
			"--raft-timing", "fast", "--log-format", "text", "--snapshot-threshold", "512", "--trailing-logs", "256",
		}
		cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		n.cc = cc
		t.Cleanup(func() { cc.Close() })
	}
	for i := range c.nodes {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.kill(i)
		}
		if t.Failed() {
			for _, n := range c.nodes {
				b, _ := os.ReadFile(n.logPath)
				lines := strings.Split(string(b), "\n")
				if len(lines) > 60 {
					lines = lines[len(lines)-60:]
				}
				t.Logf("--- %s log tail ---\n%s", n.id, strings.Join(lines, "\n"))
			}
		}
	})
	return c
}

func (c *cluster) start(i int) {
	c.t.Helper()
	n := c.nodes[i]
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, n.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	n.cmd = cmd
	n.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(n.exited) }()
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone.
func (c *cluster) kill(i int) {
	n := c.nodes[i]
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	n.cmd = nil
}

// stop sends SIGTERM and waits for a graceful exit.
func (c *cluster) stop(i int) error {
	n := c.nodes[i]
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not exit on SIGTERM", n.id)
	}
	n.cmd = nil
	return nil
}

// isolate cuts node i off from every peer in both directions.
func (c *cluster) isolate(i int, cut bool) {
	for j := range c.nodes {
		if i == j {
			continue
		}
		for _, p := range []*faultproxy.Proxy{c.links[i][j], c.links[j][i]} {
			if cut {
				p.Blackhole()
			} else {
				p.Restore()
			}
		}
	}
}

func (n *node) admin() adminv1.AdminClient          { return adminv1.NewAdminClient(n.cc) }
func (n *node) control() adminv1.ControlPlaneClient { return adminv1.NewControlPlaneClient(n.cc) }

func (n *node) status(ctx context.Context) (*adminv1.GetClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return n.admin().GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
}

// leader waits until the running nodes (except those in skip) agree on one
// leader that reports itself as such, and returns its index.
func (c *cluster) leader(skip ...int) int {
	c.t.Helper()
	idx := -1
	testwait.For(c.t, 30*time.Second, "an agreed leader", func() (bool, string) {
		ids := map[string]int{}
		var seen []string
		for i, n := range c.nodes {
			if n.cmd == nil || contains(skip, i) {
				continue
			}
			st, err := n.status(context.Background())
			if err != nil {
				return false, fmt.Sprintf("%s: %v", n.id, err)
			}
			seen = append(seen, n.id+"->"+st.GetLeaderId())
			if st.GetLeaderId() == "" {
				return false, strings.Join(seen, " ")
			}
			ids[st.GetLeaderId()]++
			if st.GetState() == "Leader" {
				idx = i
			}
		}
		if len(ids) != 1 || idx < 0 || c.nodes[idx].id != keys(ids)[0] {
			return false, strings.Join(seen, " ")
		}
		return true, ""
	})
	return idx
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (c *cluster) follower(leader int) int {
	for i, n := range c.nodes {
		if i != leader && n.cmd != nil {
			return i
		}
	}
	c.t.Fatal("no running follower")
	return -1
}

// anyNode retries f on each running node in turn while it answers
// Unavailable or times out, like a real client of the cluster.
func anyNode[T any](ctx context.Context, c *cluster, start int, f func(context.Context, *node) (T, error)) (T, error) {
	var (
		zero T
		err  error
	)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		n := c.nodes[(start+attempt)%len(c.nodes)]
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var resp T
		resp, err = f(actx, n)
		cancel()
		switch status.Code(err) {
		case codes.OK:
			return resp, nil
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		default:
			return zero, err
		}
		if attempt%len(c.nodes) == len(c.nodes)-1 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return zero, fmt.Errorf("no node answered: %w", err)
}

// addJoiner starts one more node with --join: it knows every member's gRPC
// address but bootstraps nothing until the leader adds it.
func (c *cluster) addJoiner() int {
	c.t.Helper()
	n := &node{
		id:       fmt.Sprintf("admin-%d", len(c.nodes)+1),
		raftAddr: testproc.FreeAddr(c.t),
		grpcAddr: testproc.FreeAddr(c.t),
		httpAddr: testproc.FreeAddr(c.t),
		dataDir:  filepath.Join(c.t.TempDir(), "joiner"),
	}
	n.logPath = n.dataDir + ".log"
	var peers []string
	for _, o := range append(append([]*node(nil), c.nodes...), n) {
		peers = append(peers, o.id+"="+o.raftAddr+"="+o.grpcAddr)
	}
	n.args = []string{"admin", "--join",
		"--node-id", n.id, "--raft-addr", n.raftAddr, "--grpc-addr", n.grpcAddr, "--http-addr", n.httpAddr,
		"--data-dir", n.dataDir, "--peers", strings.Join(peers, ","), "--raft-timing", "fast", "--log-format", "text",
	}
	cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cc.Close() })
	n.cc = cc
	c.nodes = append(c.nodes, n)
	c.start(len(c.nodes) - 1)
	return len(c.nodes) - 1
}
