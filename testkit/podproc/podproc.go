// Package podproc runs processes the way a kubelet runs a pod's containers, on one Linux host, for tests that
// start a rendered chart's commands: every pod in a network namespace of its own (its own IP on a bridge the
// test owns, its own loopback shared by its containers, so two pods both bind 0.0.0.0:7001 or 127.0.0.1:7071),
// and every container in a mount namespace of its own where a hosts file is bind-mounted over /etc/hosts (Go's
// resolver reads it, so Service and pod names resolve to the pods' IPs) and the pod's volumes at the container's
// mount paths. It needs root, iproute2's ip and util-linux's nsenter, unshare, mount and setpriv: Supported says
// what is missing.
package podproc

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var tools = []string{"ip", "nsenter", "unshare", "mount", "setpriv"}

// Supported is nil when this process can make pods: it runs as root on Linux and finds the tools it needs.
func Supported() error {
	if os.Geteuid() != 0 {
		return errors.New("podproc: needs root (network and mount namespaces, a bridge)")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("podproc: %s not found: %w", tool, err)
		}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("podproc: no network namespaces: %w", err)
	}
	return nil
}

// Network is a bridge with a /24 of its own; every pod is a network namespace with one address in it. The
// bridge's own address (Gateway) is the host's side: a pod reaches a server the test runs there, and the test
// reaches every pod's IP directly.
type Network struct {
	Bridge  string
	Prefix  netip.Prefix
	Gateway netip.Addr

	t       testing.TB
	id      string
	mu      sync.Mutex
	next    int
	created []string // mount targets this package made on the host, removed at cleanup
	// stageDir holds a staging mount point per container mount (see Command), staged counts them.
	stageDir string
	staged   int
}

// NewNetwork makes the bridge, on a 10.x.y.0/24 no interface of this host uses, and removes it, its pods'
// namespaces and the mount targets it had to create when the test ends.
func NewNetwork(t testing.TB) *Network {
	t.Helper()
	if err := Supported(); err != nil {
		t.Fatal(err)
	}
	n := &Network{t: t, id: fmt.Sprintf("%04x", rand.IntN(1<<16)), next: 2}
	n.Bridge = "ppb" + n.id
	prefix, err := freePrefix()
	if err != nil {
		t.Fatal(err)
	}
	n.Prefix = prefix
	n.Gateway = prefix.Addr().Next()
	t.Cleanup(n.close)
	n.run("ip", "link", "add", n.Bridge, "type", "bridge")
	n.run("ip", "addr", "add", fmt.Sprintf("%s/%d", n.Gateway, prefix.Bits()), "dev", n.Bridge)
	n.run("ip", "link", "set", n.Bridge, "up")
	return n
}

func freePrefix() (netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("podproc: interface addresses: %w", err)
	}
	for range 100 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + rand.IntN(150)), byte(rand.IntN(256)), 0}), 24)
		used := slices.ContainsFunc(addrs, func(a net.Addr) bool {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				return false
			}
			pa, ok := netip.AddrFromSlice(ipn.IP)
			return ok && p.Contains(pa.Unmap())
		})
		if !used {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("podproc: no free 10.x.y.0/24")
}

func (n *Network) run(argv ...string) {
	n.t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		n.t.Fatalf("podproc: %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

func (n *Network) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := 2; i < n.next; i++ {
		_ = exec.Command("ip", "netns", "del", n.netns(i)).Run()
	}
	_ = exec.Command("ip", "link", "del", n.Bridge).Run()
	// Deepest first; a target someone else has since filled stays.
	slices.SortFunc(n.created, func(a, b string) int { return len(b) - len(a) })
	for _, dir := range n.created {
		_ = os.Remove(dir)
	}
	if n.stageDir != "" {
		_ = os.RemoveAll(n.stageDir)
	}
}

func (n *Network) netns(i int) string { return fmt.Sprintf("podproc-%s-%d", n.id, i) }

// Pod is one network namespace: its containers share its IP and its loopback.
type Pod struct {
	Name string
	IP   netip.Addr
	net  *Network
	ns   string
}

// NewPod makes a pod's network namespace with the next address of the network, loopback up and a default
// route through the bridge.
func (n *Network) NewPod(name string) *Pod {
	n.t.Helper()
	n.mu.Lock()
	i := n.next
	n.next++
	n.mu.Unlock()
	if i > 254 {
		n.t.Fatalf("podproc: more than 253 pods on %s", n.Prefix)
	}
	a := n.Prefix.Addr().As4()
	a[3] = byte(i)
	p := &Pod{Name: name, IP: netip.AddrFrom4(a), net: n, ns: n.netns(i)}
	host, peer := fmt.Sprintf("pp%s-%dh", n.id, i), fmt.Sprintf("pp%s-%dp", n.id, i)
	n.run("ip", "netns", "add", p.ns)
	n.run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
	n.run("ip", "link", "set", host, "master", n.Bridge)
	n.run("ip", "link", "set", host, "up")
	n.run("ip", "link", "set", peer, "netns", p.ns)
	in := func(argv ...string) { n.run(append([]string{"ip", "-n", p.ns}, argv...)...) }
	in("link", "set", "lo", "up")
	in("link", "set", peer, "name", "eth0")
	in("addr", "add", fmt.Sprintf("%s/%d", p.IP, n.Prefix.Bits()), "dev", "eth0")
	in("link", "set", "eth0", "up")
	in("route", "add", "default", "via", n.Gateway.String())
	return p
}

// Mount is a host path bind-mounted at Target inside the container.
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// Container is what a kubelet would start: the command line, the environment, the hosts file and the
// mounts, and the user and groups it runs as (UID < 0 keeps root).
type Container struct {
	Argv   []string
	Env    []string
	Hosts  string
	Mounts []Mount
	UID    int
	GID    int
	Groups []int
	// ReadOnlyRoot makes / read-only for the container (readOnlyRootFilesystem); its mounts stay as given.
	ReadOnlyRoot bool
}

// Command is c as a command in p: nsenter joins the pod's network namespace, unshare gives the container a
// mount namespace of its own (private, so nothing it mounts is seen outside), a shell mounts the hosts file
// and the volumes, and setpriv drops to the container's user. Every step execs the next, so the Cmd's
// process is the container's and a signal sent to it reaches the container.
func (p *Pod) Command(c Container) (*exec.Cmd, error) {
	mounts := slices.Clone(c.Mounts)
	if c.Hosts != "" {
		mounts = append(mounts, Mount{Source: c.Hosts, Target: "/etc/hosts", ReadOnly: true})
	}
	// Parents before children, as the kubelet mounts them.
	slices.SortStableFunc(mounts, func(a, b Mount) int { return strings.Count(a.Target, "/") - strings.Count(b.Target, "/") })
	stage, err := p.net.stage(mounts)
	if err != nil {
		return nil, err
	}
	// A shell script with the mounts as its arguments, so no path is quoted into it. Every source is first
	// bound into a staging directory outside any target, so a volume kept under a directory that another
	// volume then covers (a test's /tmp) is still there to mount.
	script := `root=$1; shift; while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; ` +
		`while [ "$1" != -- ]; do mount --bind "$2" "$3" || exit 1; ` +
		`if [ "$1" = ro ]; then mount -o remount,bind,ro "$3" || exit 1; fi; shift 3; done; shift; ` +
		`if [ "$root" = ro ]; then mount -o remount,bind,ro / || exit 1; fi; exec "$@"`
	root := "rw"
	if c.ReadOnlyRoot {
		root = "ro"
	}
	argv := []string{"nsenter", "--net=/run/netns/" + p.ns, "--", "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", script, "sh", root}
	for i, m := range mounts {
		argv = append(argv, m.Source, stage[i])
	}
	argv = append(argv, "--")
	for i, m := range mounts {
		if err := p.net.target(m); err != nil {
			return nil, err
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		argv = append(argv, mode, stage[i], m.Target)
	}
	argv = append(argv, "--")
	if c.UID >= 0 {
		groups := "--clear-groups"
		if len(c.Groups) > 0 {
			var gs []string
			for _, g := range c.Groups {
				gs = append(gs, strconv.Itoa(g))
			}
			groups = "--groups=" + strings.Join(gs, ",")
		}
		argv = append(argv, "setpriv", "--reuid="+strconv.Itoa(c.UID), "--regid="+strconv.Itoa(c.GID), groups, "--")
	}
	argv = append(argv, c.Argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = c.Env
	return cmd, nil
}

// stage makes one staging mount point per mount, like its source (a file or a directory), in a directory
// of the network's under /run, which no container mounts over.
func (n *Network) stage(mounts []Mount) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stageDir == "" {
		dir, err := os.MkdirTemp("/run", "podproc-"+n.id+"-")
		if err != nil {
			return nil, fmt.Errorf("podproc: staging directory: %w", err)
		}
		n.stageDir = dir
	}
	var out []string
	for _, m := range mounts {
		src, err := os.Stat(m.Source)
		if err != nil {
			return nil, fmt.Errorf("podproc: mount source: %w", err)
		}
		n.staged++
		path := filepath.Join(n.stageDir, strconv.Itoa(n.staged))
		if src.IsDir() {
			err = os.Mkdir(path, 0o700)
		} else {
			err = os.WriteFile(path, nil, 0o600)
		}
		if err != nil {
			return nil, fmt.Errorf("podproc: staging mount point: %w", err)
		}
		out = append(out, path)
	}
	return out, nil
}

// target makes sure m's mount point exists on the host, as a file or a directory like its source; what it
// creates is removed when the network goes.
func (n *Network) target(m Mount) error {
	src, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("podproc: mount source: %w", err)
	}
	if _, err := os.Stat(m.Target); err == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	dir := m.Target
	if !src.IsDir() {
		dir = filepath.Dir(m.Target)
	}
	var missing []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("podproc: mount point: %w", err)
	}
	n.created = append(n.created, missing...)
	if !src.IsDir() {
		if err := os.WriteFile(m.Target, nil, 0o644); err != nil {
			return fmt.Errorf("podproc: mount point: %w", err)
		}
		n.created = append(n.created, m.Target)
	}
	return nil
}

// Hosts is an /etc/hosts mapping each name to its address, localhost included.
func Hosts(names map[string]netip.Addr) []byte {
	var b bytes.Buffer
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s\t%s\n", names[k], k)
	}
	return b.Bytes()
}
