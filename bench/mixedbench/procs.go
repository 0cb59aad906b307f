package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/testbin"
)

// The mesh of one run: `prism admin` (one node), `prism runner` and its `prism sidecar`, and `prism gateway`
// (unless -gateway=false) routed by the admin's xDS, each a process on loopback in plaintext, as a user would
// start them with product defaults; the namespace is created once the sidecar has registered, so its lease is
// granted as in production.
const (
	namespace = "bench"
	proxyID   = "proxy-01"
	mailboxID = namespace + "@" + proxyID
)

// proc is one prism process, its output in a log file.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

// startProc starts bin with args, env added to this process's environment.
func startProc(bin, dir, name string, env []string, args ...string) (*proc, error) {
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = childAttr()
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop asks p to stop (SIGTERM) and kills it after 5 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail prints the last lines of p's log, for a run that failed.
func (p *proc) tail() {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	fmt.Fprintf(os.Stderr, "# --- last lines of %s (%s)\n", p.name, p.log)
	for _, l := range lines[max(0, len(lines)-20):] {
		fmt.Fprintln(os.Stderr, "#", l)
	}
}

// freeAddrs are n distinct loopback host:ports nothing listened on a moment ago: each is held until all are
// picked, so the kernel cannot hand out one twice (a run's gateway once got the admin's port and failed).
func freeAddrs(n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

// procs is the processes of a run.
type procs struct {
	all                  []*proc
	runner               *proc
	queryAddr, httpAddr  string
	adminConn            *grpc.ClientConn
	created, leaseOpened time.Time
	// gatewayHTTP and gatewayGRPC are the gateway's listeners, empty without one; gatewayRouted is when it
	// first answered for the mailbox.
	gatewayHTTP, gatewayGRPC string
	gatewayRouted            time.Time
}

func (m *procs) close(failed bool) {
	if m.adminConn != nil {
		m.adminConn.Close()
	}
	for i := len(m.all) - 1; i >= 0; i-- {
		if failed {
			m.all[i].tail()
		}
		m.all[i].stop()
	}
}

// startProcs starts the admin node, the runner (under budget, "" for none), its sidecar and, with o.gateway,
// a gateway; creates the namespace on topic and waits for its mailbox to answer at the runner (its lease was
// granted and the store opened), then through the gateway (its xDS routes name the runner). Logs go under dir.
func startProcs(o options, brokers []string, dir string) (_ *procs, err error) {
	bin := o.prism
	if bin == "" {
		if bin, err = testbin.Path("prism"); err != nil {
			return nil, err
		}
	}
	m := &procs{}
	defer func() {
		if err != nil {
			m.close(true)
		}
	}()
	addrs, err := freeAddrs(9)
	if err != nil {
		return nil, err
	}
	raftAddr, adminGRPC, adminHTTP, control, sidecarHTTP := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4]
	m.queryAddr, m.httpAddr = addrs[5], addrs[6]
	if o.gateway {
		m.gatewayHTTP, m.gatewayGRPC = addrs[7], addrs[8]
	}
	for _, d := range []string{"admin", "runner"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	start := func(name string, args ...string) error {
		var env []string
		if name == "runner" {
			env = o.runnerEnv
		}
		p, err := startProc(bin, dir, name, env, args...)
		if err == nil {
			m.all = append(m.all, p)
		}
		return err
	}
	if err := start("admin", "admin", "--node-id", "admin-1", "--bootstrap", "--insecure", "--raft-addr", raftAddr,
		"--grpc-addr", adminGRPC, "--http-addr", adminHTTP, "--data-dir", filepath.Join(dir, "admin"), "--gateway-no-query-auth", "--log-format", "text"); err != nil {
		return nil, err
	}
	runnerArgs := []string{"runner", "--insecure", "--kafka", strings.Join(brokers, ","), "--data-dir", filepath.Join(dir, "runner"),
		"--grpc-addr", m.queryAddr, "--http-addr", m.httpAddr, "--control-addr", control,
		"--query-latency-target", o.target.String(), "--log-format", "text", "--log-level", "warn"}
	if o.budget != "" {
		runnerArgs = append(runnerArgs, "--memory-budget", o.budget)
	}
	if o.trace != "" {
		runnerArgs = append(runnerArgs, "--enable-pprof") // -trace records the runner's (/debug/pprof/trace)
	}
	runnerArgs = append(runnerArgs, o.runnerArgs...)
	if err := start("runner", runnerArgs...); err != nil {
		return nil, err
	}
	m.runner = m.all[len(m.all)-1]
	if err := start("sidecar", "sidecar", "--insecure", "--proxy-id", proxyID, "--runner-id", proxyID, "--admin-endpoints", adminGRPC,
		"--runner-addr", control, "--advertise-addr", m.queryAddr, "--http-addr", sidecarHTTP, "--log-format", "text"); err != nil {
		return nil, err
	}
	if o.gateway {
		if err := start("gateway", "gateway", "--insecure", "--no-query-auth", "--admin", adminGRPC, "--node-id", "bench-gateway",
			"--http-addr", m.gatewayHTTP, "--grpc-addr", m.gatewayGRPC, "--log-format", "text", "--log-level", "warn"); err != nil {
			return nil, err
		}
	}
	if m.adminConn, err = grpc.NewClient(adminGRPC, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	admin := adminv1.NewAdminClient(m.adminConn)
	if err := m.await(time.Minute, "the sidecar registered with the admin", func(ctx context.Context) error {
		r, err := admin.ListProxies(ctx, &adminv1.ListProxiesRequest{}) // one page: one proxy, far below a page
		if err == nil && len(r.GetProxies()) == 0 {
			err = errors.New("no proxy yet")
		}
		return err
	}); err != nil {
		return nil, err
	}
	cp := adminv1.NewControlPlaneClient(m.adminConn)
	if err := m.await(30*time.Second, "namespace created", func(ctx context.Context) error {
		_, err := cp.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: namespace, Config: &adminv1.NamespaceConfig{Topics: []string{topic}}})
		return err
	}); err != nil {
		return nil, err
	}
	m.created = time.Now()
	cl := &http.Client{Timeout: 2 * time.Second}
	if err := m.await(time.Minute, "the mailbox open at the runner", func(ctx context.Context) error {
		return fetch(ctx, cl, m.queryURL()+"/stats", nil)
	}); err != nil {
		return nil, err
	}
	m.leaseOpened = time.Now()
	if o.gateway {
		if err := m.await(time.Minute, "the gateway routing the mailbox", func(ctx context.Context) error {
			return fetch(ctx, cl, m.gatewayURL()+"/stats", nil)
		}); err != nil {
			return nil, err
		}
		m.gatewayRouted = time.Now()
	}
	return m, nil
}

func (m *procs) queryURL() string { return "http://" + m.queryAddr + "/v1/mailboxes/" + mailboxID }

// gatewayURL is the mailbox's URL at the gateway, empty without one.
func (m *procs) gatewayURL() string {
	if m.gatewayHTTP == "" {
		return ""
	}
	return "http://" + m.gatewayHTTP + "/v1/mailboxes/" + mailboxID
}

// fences counts the runner's "mailbox fenced" log lines: its sidecar fences it when the runner's control API
// goes unanswered past --runner-dead-after (a starved machine does that), and the mailbox reopens on a new lease.
func (m *procs) fences() int {
	b, err := os.ReadFile(m.runner.log)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "mailbox fenced")
}

// await retries f every 100 ms until it succeeds or d passes, failing early if a process exited.
func (m *procs) await(d time.Duration, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return nil
		}
		for _, p := range m.all {
			if !p.alive() {
				return fmt.Errorf("waiting for %s: %s exited: %v", what, p.name, p.cmd.ProcessState)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rss follows a process's resident memory from /proc: the kernel's high-water mark, and at the largest sample
// taken how much of it was anonymous (the Go heap, stacks) and how much file pages (Badger's mapped tables and
// value log).
type rss struct {
	pid  int
	mu   sync.Mutex
	peak map[string]int64 // kB: VmRSS, RssAnon, RssFile at the largest VmRSS seen
}

func followRSS(ctx context.Context, pid int) *rss {
	r := &rss{pid: pid}
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if s, err := r.read(); err == nil {
				r.mu.Lock()
				if s["VmRSS"] > r.peak["VmRSS"] {
					r.peak = s
				}
				r.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return r
}

func (r *rss) read() (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", r.pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch k {
		case "VmHWM", "VmRSS", "RssAnon", "RssFile":
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", k, v, err)
			}
			out[k] = n
		}
	}
	return out, sc.Err()
}

// report prints the high-water mark as mixed.runner_rss_peak_mb and the split of the largest sample.
func (r *rss) report(budget string) {
	s, err := r.read()
	if err != nil {
		fmt.Fprintln(os.Stderr, "# runner RSS:", err)
		return
	}
	r.mu.Lock()
	peak := r.peak
	r.mu.Unlock()
	if budget == "" {
		budget = "none"
	}
	fmt.Fprintf(os.Stderr, "# runner RSS peak %.0f MiB under --memory-budget %s; largest sample %.0f MiB: %.0f MiB anonymous, %.0f MiB file pages\n",
		float64(s["VmHWM"])/1024, budget, float64(peak["VmRSS"])/1024, float64(peak["RssAnon"])/1024, float64(peak["RssFile"])/1024)
	fmt.Printf("BENCH mixed.runner_rss_peak_mb %.0f MiB\n", float64(s["VmHWM"])/1024)
}

// namedPID is a process whose CPU time a loop reports.
type namedPID struct {
	name string
	pid  int
}

func (m *procs) pids() []namedPID {
	var out []namedPID
	for _, p := range m.all {
		out = append(out, namedPID{p.name, p.cmd.Process.Pid})
	}
	return out
}

// cpuSample is the CPU time (user and system) each process had used when it was taken.
type cpuSample struct {
	names []string
	secs  []float64
}

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on Linux everywhere).
const clockTick = 100

func cpuTimes(pids []namedPID) cpuSample {
	s := cpuSample{}
	for _, p := range pids {
		s.names = append(s.names, p.name)
		s.secs = append(s.secs, procCPU(p.pid))
	}
	return s
}

// procCPU is pid's utime+stime in seconds from /proc, NaN if unreadable.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return math.NaN()
	}
	// The command name (field 2) may hold spaces: count fields after its closing parenthesis.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return math.NaN()
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return math.NaN()
	}
	return (utime + stime) / clockTick
}

// since says what each process used between before and s.
func (s cpuSample) since(before cpuSample) string {
	parts := make([]string, len(s.names))
	for i, n := range s.names {
		parts[i] = fmt.Sprintf("%s %.1f", n, s.secs[i]-before.secs[i])
	}
	return strings.Join(parts, ", ")
}

// schedSample is the time each process's threads had spent on a core and waiting in a run queue for one
// (/proc/<pid>/task/*/schedstat, in seconds) when it was taken: a thread that exits in between is missed.
type schedSample struct {
	at         time.Time
	names      []string
	run, ready []float64
}

func schedTimes(pids []namedPID) schedSample {
	s := schedSample{at: time.Now()}
	for _, p := range pids {
		run, ready := procSched(p.pid)
		s.names = append(s.names, p.name)
		s.run = append(s.run, run)
		s.ready = append(s.ready, ready)
	}
	return s
}

// procSched sums pid's threads' schedstat: seconds on a core and seconds runnable in a run queue.
func procSched(pid int) (run, ready float64) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return math.NaN(), math.NaN()
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		r, err1 := strconv.ParseFloat(f[0], 64)
		w, err2 := strconv.ParseFloat(f[1], 64)
		if err1 == nil && err2 == nil {
			run += r / 1e9
			ready += w / 1e9
		}
	}
	return run, ready
}

// since says, per process, how many of its threads were on a core and how many waited for one, on average
// between before and s: the second is what the kernel's scheduler, not Go's, made it wait.
func (s schedSample) since(before schedSample) string {
	secs := s.at.Sub(before.at).Seconds()
	parts := make([]string, len(s.names))
	for i, n := range s.names {
		parts[i] = fmt.Sprintf("%s %.2f / %.2f", n, (s.run[i]-before.run[i])/secs, (s.ready[i]-before.ready[i])/secs)
	}
	return strings.Join(parts, ", ")
}
