package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// proc is one server process of a cluster under test.
type proc struct {
	name   string
	args   []string
	bin    string
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
}

func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(p.exited) }()
	return nil
}

func (p *proc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.cmd = nil
}

// cpuTicks is the process's user+system time in clock ticks (1/100 s).
func (p *proc) cpuTicks() int64 {
	if p.cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// prismCluster is size `prism admin` processes with fsync'd raft-wal stores.
type prismCluster struct {
	nodes []*proc
	grpc  []string
	http  []string
	conns *conns
}

// startPrism starts the nodes over mutual TLS with identities from certs,
// or in plaintext (--insecure) when certs is nil, each with extra flags
// appended.
func startPrism(bin, dir string, size int, xds bool, certs *certs, extra ...string) (*prismCluster, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &prismCluster{}
	var peers []string
	type addrs struct{ raft, grpc, http string }
	var as []addrs
	for range size {
		a := addrs{freeAddr(), freeAddr(), freeAddr()}
		as = append(as, a)
		c.grpc = append(c.grpc, a.grpc)
		c.http = append(c.http, a.http)
	}
	for i, a := range as {
		peers = append(peers, fmt.Sprintf("admin-%d=%s=%s", i+1, a.raft, a.grpc))
	}
	c.conns = newConns(c.grpc, certs)
	for i, a := range as {
		args := []string{"admin", "--node-id", fmt.Sprintf("admin-%d", i+1), "--raft-addr", a.raft, "--grpc-addr", a.grpc,
			"--http-addr", a.http, "--data-dir", filepath.Join(dir, fmt.Sprintf("prism-%d", i+1)),
			"--log-level", "warn", fmt.Sprintf("--xds=%v", xds),
			// The bench registers its proxies once and never heartbeats them:
			// ProxyHeartbeat is a Raft write, and a stream of them would enter
			// the acquire, commit and CPU figures. So proxies stay live for
			// the whole run instead of going stale (and their namespaces
			// moving) after the default 30 s.
			"--stale-proxy-after", "24h"}
		if xds {
			// No gateway queries in this bench: the token check is not its cost.
			args = append(args, "--gateway-no-query-auth")
		}
		if size == 1 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--peers", strings.Join(peers, ","))
		}
		if certs == nil {
			args = append(args, "--insecure")
		} else {
			tlsArgs, err := certs.serverArgs(identity.Admin, fmt.Sprintf("admin-%d", i+1))
			if err != nil {
				c.stop()
				return nil, err
			}
			args = append(args, tlsArgs...)
		}
		args = append(args, extra...)
		p := &proc{name: fmt.Sprintf("admin-%d", i+1), args: args, bin: bin, log: filepath.Join(dir, fmt.Sprintf("prism-%d.log", i+1))}
		if err := p.start(); err != nil {
			c.stop()
			return nil, err
		}
		c.nodes = append(c.nodes, p)
	}
	return c, nil
}

func (c *prismCluster) stop() {
	for _, n := range c.nodes {
		n.kill()
	}
	c.conns.close()
}

// leader waits for the running nodes (except skip) to agree on a leader.
func (c *prismCluster) leader(ctx context.Context, skip int) (int, error) {
	for ctx.Err() == nil {
		idx, agreed := -1, true
		var leaderID string
		for i, n := range c.nodes {
			if i == skip || n.cmd == nil {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			st, err := adminv1.NewAdminClient(c.conns.operator(i)).GetClusterStatus(sctx, &adminv1.GetClusterStatusRequest{})
			cancel()
			if err != nil || st.GetLeaderId() == "" || (leaderID != "" && st.GetLeaderId() != leaderID) {
				agreed = false
				break
			}
			leaderID = st.GetLeaderId()
			if st.GetState() == "Leader" {
				idx = i
			}
		}
		if agreed && idx >= 0 {
			return idx, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1, fmt.Errorf("no leader: %w", ctx.Err())
}

// etcdCluster is size etcd members with default (fsync'd) storage.
type etcdCluster struct {
	nodes     []*proc
	endpoints []string
}

func startEtcd(bin, dir string, size int) (*etcdCluster, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &etcdCluster{}
	type addrs struct{ peer, client string }
	var as []addrs
	var initial []string
	for i := range size {
		a := addrs{freeAddr(), freeAddr()}
		as = append(as, a)
		initial = append(initial, fmt.Sprintf("e%d=http://%s", i+1, a.peer))
		c.endpoints = append(c.endpoints, a.client)
	}
	for i, a := range as {
		args := []string{"--name", fmt.Sprintf("e%d", i+1), "--data-dir", filepath.Join(dir, fmt.Sprintf("etcd-%d", i+1)),
			"--listen-peer-urls", "http://" + a.peer, "--initial-advertise-peer-urls", "http://" + a.peer,
			"--listen-client-urls", "http://" + a.client, "--advertise-client-urls", "http://" + a.client,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "prism-bench", "--log-level", "warn"}
		p := &proc{name: fmt.Sprintf("etcd-%d", i+1), args: args, bin: bin, log: filepath.Join(dir, fmt.Sprintf("etcd-%d.log", i+1))}
		if err := p.start(); err != nil {
			c.stop()
			return nil, err
		}
		c.nodes = append(c.nodes, p)
	}
	return c, nil
}

func (c *etcdCluster) stop() {
	for _, n := range c.nodes {
		n.kill()
	}
}
