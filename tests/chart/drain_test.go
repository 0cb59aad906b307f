package chart

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/prism-mesh/prism/testkit/podproc"
)

// envoyAdminEnv makes this test binary the stand-in for Envoy's admin interface (see TestMain): its value is
// "adminPort,statsPort".
const envoyAdminEnv = "PRISM_CHART_TEST_ENVOY_ADMIN"

func TestMain(m *testing.M) {
	if ports := os.Getenv(envoyAdminEnv); ports != "" {
		os.Exit(envoyAdminStandIn(ports))
	}
	os.Exit(m.Run())
}

// envoyAdminStandIn serves what the gateway's preStop hook and readiness probe use of Envoy, with Envoy's
// semantics, for machines without Envoy: on 127.0.0.1:adminPort POST /healthcheck/fail (from then on /ready
// answers 503 DRAINING) and POST /drain_listeners (GET on either is refused, as Envoy refuses a GET on an
// endpoint that changes state), and GET /ready there and on the stats port (the bootstrap's stats listener
// forwards exactly /ready to the admin interface). Every request is printed, one line each.
func envoyAdminStandIn(ports string) int {
	admin, stats, _ := strings.Cut(ports, ",")
	var (
		mu     sync.Mutex
		failed bool
	)
	ready := func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if failed {
			http.Error(w, "DRAINING", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "LIVE")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /healthcheck/fail", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		failed = true
		mu.Unlock()
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("POST /drain_listeners", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })
	mux.HandleFunc("GET /ready", ready)
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("%s %s\n", r.Method, r.URL.RequestURI())
		mux.ServeHTTP(w, r)
	})
	statsMux := http.NewServeMux()
	statsMux.HandleFunc("GET /ready", ready)
	errs := make(chan error, 2)
	go func() { errs <- http.ListenAndServe("127.0.0.1:"+admin, logged) }() //nolint:gosec // a test stand-in on the pod's loopback
	go func() { errs <- http.ListenAndServe("0.0.0.0:"+stats, statsMux) }() //nolint:gosec // likewise, the pod's stats port
	fmt.Fprintln(os.Stderr, <-errs)
	return 1
}

// TestGatewayDrainsBeforeItStops stops a gateway pod in the kubelet's order, its Envoy container's preStop
// hook first, and checks what the hook does to Envoy: /ready on the stats port (the readiness probe) turns
// 503 while the listener still answers for the drain, and the hook returns only after gateway.drain.seconds
// plus tailSeconds, so SIGTERM comes after the drain. Without Envoy on PATH a stand-in of its admin
// interface runs in the gateway pod instead, and the hook is also seen to fail the health check before it
// drains the listeners.
func TestGatewayDrainsBeforeItStops(t *testing.T) {
	files := []string{"testdata/defaults.yaml", "testdata/gateway-drain.yaml"}
	c, _ := runChart(t, files, "")
	gw := c.podsOf(gatewayName)[0]
	ctr := gw.spec.Containers[slices.IndexFunc(gw.spec.Containers, func(ctr corev1.Container) bool { return ctr.Name == "envoy" })]
	statsPort, ok := gw.port([]corev1.Container{ctr}, intstr.FromString("stats"))
	if !ok {
		t.Fatal("Envoy's container has no stats port")
	}
	readyURL := fmt.Sprintf("http://%s/ready", net.JoinHostPort(gw.net.IP.String(), strconv.Itoa(int(statsPort))))
	drain := str2port(t, value(t, "gateway.drain.seconds", files...))
	tail := str2port(t, value(t, "gateway.drain.tailSeconds", files...))

	var standIn *exec.Cmd
	standInLog := &syncWriter{}
	if _, err := exec.LookPath("envoy"); err != nil {
		t.Log("envoy not on PATH: the preStop hook drives a stand-in of Envoy's admin interface in the gateway pod")
		cmd, err := gw.net.Command(podprocSelf(fmt.Sprintf("%s=%d,%d", envoyAdminEnv, str2port(t, value(t, "gateway.adminPort", files...)), statsPort)))
		must(t, err)
		cmd.Stdout, cmd.Stderr = standInLog, os.Stderr
		must(t, cmd.Start())
		standIn = cmd
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	c.await("the gateway's /ready", 10*time.Second, func() error { return getStatus(readyURL, http.StatusOK) })

	if ctr.Lifecycle == nil || ctr.Lifecycle.PreStop == nil || ctr.Lifecycle.PreStop.Exec == nil {
		t.Fatalf("Envoy's container has no preStop exec hook (%+v): on SIGTERM it closes its listeners at once", ctr.Lifecycle)
	}
	hook := c.containerSpec(gw, ctr)
	hook.Argv = ctr.Lifecycle.PreStop.Exec.Command
	cmd, err := gw.net.Command(hook)
	must(t, err)
	out := &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	began := time.Now()
	must(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var sawDraining time.Duration
	for running := true; running; {
		select {
		case err := <-done:
			running = false
			if err != nil {
				t.Fatalf("preStop %v: %v\n%s", hook.Argv, err, out.String())
			}
		case <-time.After(100 * time.Millisecond):
			err := getStatus(readyURL, http.StatusServiceUnavailable)
			switch {
			case err == nil && sawDraining == 0:
				sawDraining = time.Since(began)
			case err != nil && time.Since(began) < time.Duration(drain)*time.Second:
				t.Errorf("%v into the drain, /ready: %v; want 503 from a listener still open", time.Since(began).Round(time.Millisecond), err)
			}
		}
	}
	took := time.Since(began)
	t.Logf("preStop took %v, /ready 503 after %v; its output:\n%s", took.Round(time.Millisecond), sawDraining.Round(time.Millisecond), out.String())
	if took < time.Duration(drain+tail)*time.Second {
		t.Errorf("preStop returned after %v, before the drain (%d s) and its tail (%d s): SIGTERM would cut queries in flight", took, drain, tail)
	}
	if sawDraining == 0 {
		t.Error("/ready never answered 503 while the hook ran: the gateway stays in the Service's endpoints")
	}
	if standIn != nil {
		var posts []string
		sc := bufio.NewScanner(strings.NewReader(standInLog.String()))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "POST ") {
				posts = append(posts, sc.Text())
			}
		}
		if want := []string{"POST /healthcheck/fail", "POST /drain_listeners?graceful"}; !slices.Equal(posts, want) {
			t.Errorf("Envoy's admin interface was sent %q, want %q", posts, want)
		}
	}
}

func getStatus(url string, want int) error {
	resp, err := probeClient.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("GET %s: %s, want %d", url, resp.Status, want)
	}
	return nil
}

// syncWriter is a process's output, written from exec's copying goroutines and read by the test.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(b)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// podprocSelf runs this test binary in a pod, as root, with env, to be the stand-in TestMain picks by env.
func podprocSelf(env string) podproc.Container {
	return podproc.Container{Argv: []string{os.Args[0], "-test.run=^$"}, Env: []string{env, "PATH=/usr/bin:/bin"}, UID: -1}
}

// podsOf are the pods of a workload, in order.
func (c *cluster) podsOf(workload string) []*pod {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*pod
	for _, p := range c.pods {
		if p.workload == workload {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		c.t.Fatalf("no pods of %s", workload)
	}
	return out
}
