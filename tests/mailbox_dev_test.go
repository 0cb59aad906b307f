package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testbin"
	"github.com/prism-mesh/prism/testkit/testproc"
)

// devProcess is a running `prism dev` on free loopback ports.
type devProcess struct {
	cmd *exec.Cmd
	// addrs maps each address flag of prism dev to the port given to it.
	addrs map[string]string
	// ctlConfig is where prism dev writes prismctl's config file.
	ctlConfig string
	// done is closed once the process has exited, with waitErr set.
	done    chan struct{}
	waitErr error

	mu     sync.Mutex
	stdout []string
	stderr bytes.Buffer
}

// devAddrFlags are every listen address of prism dev, so a test never
// touches the fixed defaults (another prism dev, or a helper's test, may hold
// them).
var devAddrFlags = []string{
	"--gateway-addr", "--gateway-grpc-addr", "--envoy-admin-addr", "--admin-addr", "--admin-http-addr",
	"--raft-addr", "--runner-addr", "--runner-http-addr", "--control-addr", "--sidecar-http-addr",
}

// startDev runs prism dev with every address on a free port and waits for
// its ready line. The process is killed at cleanup if still running.
func startDev(t *testing.T, args ...string) *devProcess {
	t.Helper()
	return startDevEnv(t, nil, args...)
}

// startDevEnv is startDev with env added to the process's environment.
func startDevEnv(t *testing.T, env []string, args ...string) *devProcess {
	t.Helper()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	d := &devProcess{addrs: map[string]string{}, done: make(chan struct{})}
	// An address flag in args is kept; the others get free ports.
	for i := 0; i+1 < len(args); i++ {
		if strings.HasSuffix(args[i], "-addr") {
			d.addrs[args[i]] = args[i+1]
		}
	}
	argv := []string{"dev", "--log-level", "info", "--kafka-port", strconv.Itoa(freePort(t))}
	for _, f := range devAddrFlags {
		if _, given := d.addrs[f]; !given {
			d.addrs[f] = testproc.FreeAddr(t)
			argv = append(argv, f, d.addrs[f])
		}
	}
	d.cmd = exec.Command(bin, append(argv, args...)...)
	// prism dev leaves prismctl its identity in the config file; a test's
	// stays in the test's directory.
	d.ctlConfig = filepath.Join(t.TempDir(), "prismctl.yaml")
	d.cmd.Env = append(append(os.Environ(), client.EnvConfig+"="+d.ctlConfig), env...)
	d.cmd.Stderr = &lockedWriter{mu: &d.mu, w: &d.stderr}
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	var readyOnce sync.Once
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.mu.Lock()
			d.stdout = append(d.stdout, sc.Text())
			d.mu.Unlock()
			if strings.HasPrefix(sc.Text(), "prism dev: ready") {
				readyOnce.Do(func() { close(ready) })
			}
		}
		d.waitErr = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill() // no-op once it has exited
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			t.Error("prism dev still running 30s after kill")
		}
		if t.Failed() {
			d.mu.Lock()
			t.Logf("prism dev stdout:\n%s\nstderr (tail):\n%s", strings.Join(d.stdout, "\n"), tail(d.stderr.String(), 8000))
			d.mu.Unlock()
		}
	})
	select {
	case <-ready:
	case <-d.done:
		t.Fatalf("prism dev exited before ready: %v", d.waitErr)
	case <-time.After(150 * time.Second):
		t.Fatal("prism dev not ready within 150s")
	}
	return d
}

// output is what prism dev printed to stdout so far.
func (d *devProcess) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.stdout, "\n")
}

func (d *devProcess) logs() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.String()
}

// interrupt sends SIGINT and expects a clean exit within 60s.
func (d *devProcess) interrupt(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
		if d.waitErr != nil {
			t.Fatalf("prism dev exited with %v after SIGINT", d.waitErr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("prism dev did not stop within 60s of SIGINT")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func freePort(t *testing.T) int {
	t.Helper()
	_, p, err := net.SplitHostPort(testproc.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

type devEvents struct {
	MailboxID string `json:"mailbox_id"`
	Items     []struct {
		MessageID string `json:"message_id"`
		Principal string `json:"principal"`
	} `json:"items"`
}

// TestMailboxDevCurlLine runs `prism dev` and follows the curl line it
// prints: through the gateway, it must return demo events from mailbox
// demo@proxy-01, which the sidecar holds a lease on. SIGINT then stops the
// parts in order, the leases released before the admin node stops.
func TestMailboxDevCurlLine(t *testing.T) {
	t.Parallel()
	d := startDev(t, "--rate", "100")
	out := d.output()

	gw := d.addrs["--gateway-addr"]
	curl := regexp.MustCompile(`curl -s '(http://` + regexp.QuoteMeta(gw) + `/v1/mailboxes/demo@proxy-01/events\?limit=5)'`)
	m := curl.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no curl line through the gateway %s in:\n%s", gw, out)
	}
	for _, want := range []string{
		"http://" + gw + " ",
		"prismctl --admin " + d.addrs["--admin-addr"],
		"prism gateway (in-process",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	var body devEvents
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(body.Items) == 0 || body.Items[0].Principal == "" || body.MailboxID != "demo@proxy-01" {
		t.Fatalf("GET %s: %d, %v, %+v", m[1], resp.StatusCode, err, body)
	}
	// The gateway got the route from the lease: the answer came from the
	// runner the sidecar registered (its query address), under an epoch.
	if ep := resp.Header.Get(mesh.HeaderEpoch); ep == "" || ep == "0" {
		t.Errorf("x-prism-epoch = %q, want the lease's epoch", ep)
	}

	// The second command of the quickstart: prismctl, given nothing, calls
	// the admin over mTLS as the operator prism dev issued.
	ctl, err := testbin.Path("prismctl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(ctl, "namespace", "list")
	cmd.Env = append(os.Environ(), client.EnvConfig+"="+d.ctlConfig, "PRISM_ADMIN=")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "demo") {
		t.Errorf("prismctl namespace list with prism dev's config: %v\n%s", err, out)
	}

	d.interrupt(t)
	if _, err := os.Stat(d.ctlConfig); !os.IsNotExist(err) {
		t.Errorf("prism dev left its prismctl config pointing at a removed CA: %v", err)
	}
	logs := d.logs()
	last := -1
	for _, c := range []string{`"demo producer"`, "gateway", "sidecar", "runner", "admin", "kafka"} {
		i := strings.Index(logs, "msg=stopped component="+c)
		if i < 0 || i < last {
			t.Errorf("stop of %s missing or out of order (demo producer, gateway, sidecar, runner, admin, kafka)", c)
		}
		last = max(last, i)
	}
	// Released on its own, or with the sidecar's session (which holds it) closed.
	rel := regexp.MustCompile(`msg="lease released" .*mailbox_id=demo@proxy-01|msg="session closed" .*component=sidecar.* leases=[1-9][0-9]* `).FindStringIndex(logs)
	if rel == nil || rel[0] > strings.Index(logs, "msg=stopped component=admin") {
		t.Error("lease of demo@proxy-01 not released before the admin stopped")
	}
}

type devStatsBody struct {
	TotalEvents int64  `json:"total_events"`
	Epoch       uint64 `json:"epoch"`
}

func devStats(t *testing.T, d *devProcess) devStatsBody {
	t.Helper()
	var st devStatsBody
	code, err := getJSON("http://"+d.addrs["--gateway-addr"], "/v1/mailboxes/demo@proxy-01/stats", &st)
	if err != nil || code != http.StatusOK {
		t.Fatalf("stats through the gateway: %d %v", code, err)
	}
	return st
}

// TestMailboxDevDataDirAndExternalKafka stops a prism dev that kept its
// state in --data-dir and starts it again on other ports, against a broker
// of the test's (--kafka) and without demo traffic: the admin comes back
// from its Raft log (namespace demo, proxy-01), the sidecar takes a new
// lease, and the gateway serves every event the first run stored.
func TestMailboxDevDataDirAndExternalKafka(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := startDev(t, "--data-dir", dir, "--rate", "100")
	first := devStats(t, d)
	d.interrupt(t)
	if first.TotalEvents == 0 || first.Epoch == 0 {
		t.Fatalf("first run: %+v, want events under a lease", first)
	}

	brokers := kafkatest.Start(t, kafkatest.Topics(1, "audit.events", "admin.events", "audit.events.dlq", "admin.events.dlq")).Brokers
	d2 := startDev(t, "--data-dir", dir, "--demo=false", "--kafka", strings.Join(brokers, ","))
	if out := d2.output(); !strings.Contains(out, "kafka     "+brokers[0]+"\n") || strings.Contains(out, "demo      ") {
		t.Errorf("second run should name the test's broker %s and no demo producer:\n%s", brokers[0], out)
	}
	second := devStats(t, d2)
	if second.TotalEvents < first.TotalEvents || second.Epoch <= first.Epoch {
		t.Errorf("second run %+v, first %+v: want every stored event kept and a later lease epoch", second, first)
	}
	d2.interrupt(t)
}

// fakeEnvoy stands in for an envoy binary, which cannot be installed on our
// build machines: it keeps a copy of the bootstrap it was started with, then
// serves the gateway address it is told (in Envoy that listener comes over
// ADS) as prism gateway, which exits on SIGTERM as Envoy does.
const fakeEnvoy = `#!/bin/sh
[ "$1" = "-c" ] && [ -f "$2" ] || { echo "fake envoy: want -c BOOTSTRAP, got $*" >&2; exit 2; }
cp "$2" "$FAKE_ENVOY_BOOTSTRAP_COPY" || exit 2
pki=$(dirname "$(grep -o '/[^" ]*/ca[.]pem' "$2" | head -n 1)")
exec "$FAKE_ENVOY_PRISM" gateway --admin "$FAKE_ENVOY_ADMIN" --http-addr "$FAKE_ENVOY_LISTEN" --grpc-addr "" --log-format text \
  --tls-ca "$pki/ca.pem" --tls-cert "$pki/gateway-prism-dev-gateway.pem" --tls-key "$pki/gateway-prism-dev-gateway-key.pem" --no-query-auth
`

// TestMailboxDevEnvoyOnPath: with an envoy on PATH, prism dev starts it
// with the envoy/ bootstrap pointing at its admin node, says so, waits for
// events through it, and stops it on SIGINT. Envoy itself is a stand-in
// here (see fakeEnvoy); its routing is covered by tests/xds_envoy.
func TestMailboxDevEnvoyOnPath(t *testing.T) {
	t.Parallel()
	prism, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "envoy"), []byte(fakeEnvoy), 0o755); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "bootstrap-copy.yaml")
	// The stand-in is told the addresses prism dev is given.
	admin, gw := testproc.FreeAddr(t), testproc.FreeAddr(t)
	d := startDevEnv(t, []string{
		"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"FAKE_ENVOY_BOOTSTRAP_COPY=" + copyPath, "FAKE_ENVOY_PRISM=" + prism,
		"FAKE_ENVOY_ADMIN=" + admin, "FAKE_ENVOY_LISTEN=" + gw,
	}, "--admin-addr", admin, "--gateway-addr", gw)
	if out := d.output(); !strings.Contains(out, "envoy ("+filepath.Join(dir, "envoy")+")") {
		t.Errorf("output does not say envoy runs the gateway:\n%s", out)
	}
	y, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	b, err := envoy.Parse(y)
	if err != nil {
		t.Fatal(err)
	}
	var xds []string
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, ep := range le.GetLbEndpoints() {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				xds = append(xds, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
			}
		}
	}
	if len(xds) != 1 || xds[0] != admin {
		t.Errorf("bootstrap xDS endpoints %v, want the admin node %s", xds, admin)
	}
	if st := devStats(t, d); st.TotalEvents == 0 {
		t.Errorf("no events through the gateway: %+v", st)
	}
	d.interrupt(t)
	if !strings.Contains(d.logs(), "msg=stopped component=gateway") {
		t.Error("the envoy gateway was not stopped")
	}
}
