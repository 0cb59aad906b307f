package chart

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/podproc"
	"github.com/prism-mesh/prism/testkit/testbin"
)

// prismImage is the image whose containers run here, as the built `prism` binary mounted where the image
// has it: its ENTRYPOINT (Dockerfile) and the runner's preStop hook name /usr/local/bin/prism.
const (
	prismImage = "ghcr.io/prism-mesh/prism"
	binDir     = "/usr/local/bin"
)

// cluster is one release's pods on one podproc network, with the Kafka broker the values name on the
// bridge's address, a CA standing in for cert-manager (and for the user's Secrets in secret mode), and a
// hosts file giving every pod, Service and broker name its address.
type cluster struct {
	t       *testing.T
	net     *podproc.Network
	dir     string
	bin     string // a directory holding prism, mounted at binDir
	hosts   string
	ca      *pki.CA
	secrets map[string]map[string][]byte
	config  map[string]map[string]string
	// certificates are the release's cert-manager Certificates, written by the stand-in as cert-manager would.
	certificates map[string]*chartrender.Certificate
	brokers      []string // host names of the brokers, resolved to the bridge

	mu    sync.Mutex
	pods  []*pod
	procs []*proc
	start time.Time // the first process's start
}

// pod is one pod of a rendered workload: its template, its network namespace and its volumes on the host.
type pod struct {
	name     string
	workload string // the StatefulSet or Deployment
	host     string // the StatefulSet pod's DNS name under its Service, else ""
	labels   map[string]string
	spec     corev1.PodSpec
	net      *podproc.Pod
	volumes  map[string]string
	// injected pods (the runners) start after the injector and stop before the rest, as a real cluster
	// (its admin nodes outliving the sidecars) has them.
	injected bool
}

type proc struct {
	pod       *pod
	container string
	cmd       *exec.Cmd
	log       string
	done      chan struct{}
}

func newCluster(t *testing.T, brokers []string) *cluster {
	t.Helper()
	if err := podproc.Supported(); err != nil {
		t.Skipf("the chart's processes run in pods of their own: %v", err)
	}
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, net: podproc.NewNetwork(t), dir: t.TempDir(), secrets: map[string]map[string][]byte{}, config: map[string]map[string]string{}}
	c.bin = filepath.Join(c.dir, "bin")
	if err := os.Mkdir(c.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(bin, filepath.Join(c.bin, "prism")); err != nil {
		t.Fatal(err)
	}
	c.hosts = filepath.Join(c.dir, "hosts")
	c.startKafka(brokers)
	t.Cleanup(c.stop)
	return c
}

func copyFile(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// startKafka serves a kfake broker on the bridge's address at each broker's port; the broker's host name
// resolves there.
func (c *cluster) startKafka(brokers []string) {
	c.t.Helper()
	var ports []int
	for _, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			c.t.Fatalf("kafka.brokers %q: %v", b, err)
		}
		p, _ := strconv.Atoi(port)
		ports = append(ports, p)
		c.brokers = append(c.brokers, host)
	}
	k, err := kfake.NewCluster(kfake.NumBrokers(len(ports)), kfake.Ports(ports...),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			_, port, _ := net.SplitHostPort(addr)
			return net.Listen(network, net.JoinHostPort(c.net.Gateway.String(), port))
		}))
	if err != nil {
		c.t.Fatalf("kafka: %v", err)
	}
	c.t.Cleanup(k.Close)
}

// useCA makes the CA of trustDomain that signs every certificate of the release.
func (c *cluster) useCA(trustDomain string) {
	c.t.Helper()
	ca, err := pki.NewCA(trustDomain, 24*time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	c.ca = ca
}

func (c *cluster) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.ca.Cert.Raw})
}

// issue is a certificate and key for role/name, as cert-manager or `prism certs` would make them.
func (c *cluster) issue(role identity.Role, name string) (crt, key []byte) {
	c.t.Helper()
	crt, key, err := c.ca.Issue(pki.Request{Role: role, Name: name})
	if err != nil {
		c.t.Fatalf("issue %s/%s: %v", role, name, err)
	}
	return crt, key
}

// addRendered takes the release's own Secrets and ConfigMaps, which pods mount.
func (c *cluster) addRendered(r *chartrender.Objects) {
	for name, s := range r.Secrets {
		data := map[string][]byte{}
		for k, v := range s.Data {
			data[k] = v
		}
		for k, v := range s.StringData {
			data[k] = []byte(v)
		}
		c.secrets[name] = data
	}
	for name, cm := range r.ConfigMaps {
		c.config[name] = cm.Data
	}
	c.certificates = r.Certificates
}

// addPods makes the pods of every rendered StatefulSet and Deployment named in workloads (all when empty),
// ordinals from..replicas-1 of a StatefulSet, with their network namespaces.
func (c *cluster) addPods(r *chartrender.Objects, from int, workloads ...string) []*pod {
	c.t.Helper()
	var out []*pod
	want := func(name string) bool { return len(workloads) == 0 || slices.Contains(workloads, name) }
	for _, name := range sortedKeys(r.StatefulSets) {
		s := r.StatefulSets[name]
		if !want(name) {
			continue
		}
		for i := from; i < int(*s.Spec.Replicas); i++ {
			p := &pod{name: fmt.Sprintf("%s-%d", name, i), workload: name, labels: s.Spec.Template.Labels, spec: *s.Spec.Template.Spec.DeepCopy()}
			p.host = fmt.Sprintf("%s.%s.%s.svc", p.name, s.Spec.ServiceName, namespace)
			for _, vct := range s.Spec.VolumeClaimTemplates {
				p.spec.Volumes = append(p.spec.Volumes, corev1.Volume{Name: vct.Name, VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: vct.Name + "-" + p.name},
				}})
			}
			out = append(out, p)
		}
	}
	for _, name := range sortedKeys(r.Deployments) {
		d := r.Deployments[name]
		if !want(name) {
			continue
		}
		for i := range int(*d.Spec.Replicas) {
			out = append(out, &pod{name: fmt.Sprintf("%s-5d8f7c9b6-%05d", name, i), workload: name, labels: d.Spec.Template.Labels, spec: *d.Spec.Template.Spec.DeepCopy()})
		}
	}
	for _, p := range out {
		p.net = c.net.NewPod(p.name)
	}
	c.mu.Lock()
	c.pods = append(c.pods, out...)
	c.mu.Unlock()
	return out
}

// writeHosts writes the hosts file every container sees: each StatefulSet pod's name under its Service,
// each Service's names (all forms a pod's search path completes) to the pods it selects, and the brokers.
// Rewritten in place, it reaches containers already running (Go re-reads /etc/hosts when it changes).
func (c *cluster) writeHosts(r *chartrender.Objects) {
	c.t.Helper()
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n")
	line := func(ip netip.Addr, names ...string) { fmt.Fprintf(&b, "%s\t%s\n", ip, strings.Join(names, " ")) }
	for _, h := range c.brokers {
		line(c.net.Gateway, h)
	}
	c.mu.Lock()
	pods := slices.Clone(c.pods)
	c.mu.Unlock()
	for _, p := range pods {
		if p.host != "" {
			line(p.net.IP, p.host, p.host+".cluster.local")
		}
	}
	for _, name := range sortedKeys(r.Services) {
		svc := r.Services[name]
		for _, p := range pods {
			if selects(svc.Spec.Selector, p.labels) {
				fqdn := fmt.Sprintf("%s.%s.svc", name, namespace)
				line(p.net.IP, name, name+"."+namespace, fqdn, fqdn+".cluster.local")
			}
		}
	}
	if err := os.WriteFile(c.hosts, []byte(b.String()), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// materialize writes the pod's volumes on the host as the kubelet would: Secrets and ConfigMaps (their
// items and modes), emptyDirs, a directory per PersistentVolumeClaim, and cert-manager csi-driver volumes as
// a certificate for the URI SAN the volume asks for, ${POD_NAME} filled in. With an fsGroup the files
// belong to that group, as the kubelet and csi-driver make them. The csi-driver stand-in writes what the real
// one does by default (certmanager_test.go).
func (c *cluster) materialize(p *pod) {
	c.t.Helper()
	p.volumes = map[string]string{}
	fsGroup := -1
	if sc := p.spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		fsGroup = int(*sc.FSGroup)
	}
	for _, v := range p.spec.Volumes {
		dir := filepath.Join(c.dir, "volumes", p.name, v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			c.t.Fatal(err)
		}
		p.volumes[v.Name] = dir
		write := func(files map[string][]byte, items []corev1.KeyToPath, mode *int32) {
			m := os.FileMode(0o644)
			if mode != nil {
				m = os.FileMode(*mode)
			}
			if items == nil {
				for k := range files {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				data, ok := files[it.Key]
				if !ok {
					c.t.Fatalf("pod %s volume %s: no key %s", p.name, v.Name, it.Key)
				}
				fm := m
				if it.Mode != nil {
					fm = os.FileMode(*it.Mode)
				}
				c.writeFile(filepath.Join(dir, it.Path), data, fm, fsGroup)
			}
		}
		switch {
		case v.EmptyDir != nil:
			must(c.t, os.Chmod(dir, 0o777))
		case v.PersistentVolumeClaim != nil:
			if fsGroup >= 0 {
				must(c.t, os.Chown(dir, 0, fsGroup))
				must(c.t, os.Chmod(dir, 0o2775|os.ModeSetgid))
			}
		case v.Secret != nil:
			data, ok := c.secrets[v.Secret.SecretName]
			if !ok {
				c.t.Fatalf("pod %s mounts Secret %s, which neither the chart nor the test makes", p.name, v.Secret.SecretName)
			}
			write(data, v.Secret.Items, v.Secret.DefaultMode)
		case v.ConfigMap != nil:
			data, ok := c.config[v.ConfigMap.Name]
			if !ok {
				c.t.Fatalf("pod %s mounts ConfigMap %s, which the chart does not make", p.name, v.ConfigMap.Name)
			}
			files := map[string][]byte{}
			for k, s := range data {
				files[k] = []byte(s)
			}
			write(files, v.ConfigMap.Items, v.ConfigMap.DefaultMode)
		case v.CSI != nil && v.CSI.Driver == "csi.cert-manager.io":
			group := fsGroup
			if g, ok := v.CSI.VolumeAttributes["csi.cert-manager.io/fs-group"]; ok {
				group, _ = strconv.Atoi(g)
			}
			files, _ := c.csiFiles(p, v.CSI.VolumeAttributes)
			for name, data := range files {
				c.writeFile(filepath.Join(dir, name), data, 0o440, group)
			}
		default:
			c.t.Fatalf("pod %s: volume %s of a kind the test cannot make: %+v", p.name, v.Name, v.VolumeSource)
		}
	}
}

func (c *cluster) writeFile(path string, data []byte, mode os.FileMode, group int) {
	c.t.Helper()
	must(c.t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(c.t, os.WriteFile(path, data, mode))
	must(c.t, os.Chmod(path, mode))
	if group >= 0 {
		must(c.t, os.Chown(path, 0, group))
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// runnable says whether the container can run here: the prism image always, Envoy when on PATH.
func runnable(ctr corev1.Container) bool {
	if strings.HasPrefix(ctr.Image, prismImage+":") {
		return true
	}
	_, err := exec.LookPath("envoy")
	return strings.HasPrefix(ctr.Image, "envoyproxy/envoy:") && err == nil
}

// containers are the pod's containers in the kubelet's start order: its native sidecars (init containers
// that always restart), then its containers. Plain init containers have none in this chart.
func (p *pod) containers(t testing.TB) []corev1.Container {
	var out []corev1.Container
	for _, ic := range p.spec.InitContainers {
		if ic.RestartPolicy == nil || *ic.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Fatalf("pod %s: init container %s is not a native sidecar; the test does not run init containers", p.name, ic.Name)
		}
		out = append(out, ic)
	}
	return append(out, p.spec.Containers...)
}

// env is the container's environment as the kubelet gives it: its variables in order, $(VAR) references to
// earlier ones expanded, fieldRef and resourceFieldRef resolved for this pod.
func (p *pod) env(t testing.TB, ctr corev1.Container) (list []string, vars map[string]string) {
	t.Helper()
	vars = map[string]string{}
	list = []string{"PATH=" + binDir + ":/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + p.name}
	for _, e := range ctr.Env {
		val := expand(e.Value, vars)
		if from := e.ValueFrom; from != nil {
			switch {
			case from.FieldRef != nil:
				switch from.FieldRef.FieldPath {
				case "metadata.name":
					val = p.name
				case "metadata.namespace":
					val = namespace
				case "status.podIP":
					val = p.net.IP.String()
				case "spec.serviceAccountName":
					val = p.spec.ServiceAccountName
				default:
					t.Fatalf("pod %s container %s: env %s from field %s", p.name, ctr.Name, e.Name, from.FieldRef.FieldPath)
				}
			case from.ResourceFieldRef != nil:
				q, ok := ctr.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(from.ResourceFieldRef.Resource, "limits."))]
				if strings.HasPrefix(from.ResourceFieldRef.Resource, "requests.") {
					q, ok = ctr.Resources.Requests[corev1.ResourceName(strings.TrimPrefix(from.ResourceFieldRef.Resource, "requests."))]
				}
				if !ok {
					t.Fatalf("pod %s container %s: env %s from %s, which the container does not set", p.name, ctr.Name, e.Name, from.ResourceFieldRef.Resource)
				}
				div := from.ResourceFieldRef.Divisor
				if div.IsZero() {
					val = strconv.FormatInt(q.Value(), 10)
				} else {
					val = strconv.FormatInt((q.MilliValue()+div.MilliValue()-1)/div.MilliValue(), 10)
				}
			default:
				t.Fatalf("pod %s container %s: env %s from %+v", p.name, ctr.Name, e.Name, from)
			}
		}
		vars[e.Name] = val
		list = append(list, e.Name+"="+val)
	}
	return list, vars
}

var ref = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand is the kubelet's $(VAR) expansion: defined references are replaced, $$ is a $, the rest stays.
func expand(s string, vars map[string]string) string {
	return ref.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := vars[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// argv is the command line the container runs: its command (or the image's entrypoint) and its args, both
// expanded.
func (p *pod) argv(ctr corev1.Container, vars map[string]string) []string {
	cmd := ctr.Command
	if len(cmd) == 0 {
		cmd = []string{binDir + "/prism"} // the image's ENTRYPOINT
	}
	var out []string
	for _, a := range append(slices.Clone(cmd), ctr.Args...) {
		out = append(out, expand(a, vars))
	}
	return out
}

// run starts the pod's runnable containers in order, as the user its security context names, with the
// prism binary at binDir and its volumes at their mount paths, the root file system read-only where the
// container asks for it.
func (c *cluster) run(p *pod) {
	c.t.Helper()
	if p.volumes == nil {
		c.materialize(p)
	}
	for _, ctr := range p.containers(c.t) {
		if !runnable(ctr) {
			continue
		}
		spec := c.containerSpec(p, ctr)
		cmd, err := p.net.Command(spec)
		if err != nil {
			c.t.Fatal(err)
		}
		pr := &proc{pod: p, container: ctr.Name, cmd: cmd, log: filepath.Join(c.dir, "logs", p.name+"."+ctr.Name+".log"), done: make(chan struct{})}
		must(c.t, os.MkdirAll(filepath.Dir(pr.log), 0o755))
		f, err := os.Create(pr.log)
		must(c.t, err)
		cmd.Stdout, cmd.Stderr = f, f
		c.mu.Lock()
		if c.start.IsZero() {
			c.start = time.Now()
		}
		c.mu.Unlock()
		if err := cmd.Start(); err != nil {
			c.t.Fatalf("start %s/%s: %v", p.name, ctr.Name, err)
		}
		go func() { _ = cmd.Wait(); f.Close(); close(pr.done) }()
		c.mu.Lock()
		c.procs = append(c.procs, pr)
		c.mu.Unlock()
	}
}

// containerSpec is how ctr of p runs: its command line and environment as the kubelet gives them, as the
// user its pod's security context names, with the prism binary at binDir (prism image) and its volumes at
// their mount paths, the root file system read-only where the container asks for it.
func (c *cluster) containerSpec(p *pod, ctr corev1.Container) podproc.Container {
	c.t.Helper()
	env, vars := p.env(c.t, ctr)
	spec := podproc.Container{Argv: p.argv(ctr, vars), Env: env, Hosts: c.hosts, UID: -1}
	if strings.HasPrefix(ctr.Image, prismImage+":") {
		spec.Mounts = append(spec.Mounts, podproc.Mount{Source: c.bin, Target: binDir, ReadOnly: true})
	}
	for _, m := range ctr.VolumeMounts {
		src, ok := p.volumes[m.Name]
		if !ok {
			c.t.Fatalf("pod %s container %s mounts %s, which is not a volume of the pod", p.name, ctr.Name, m.Name)
		}
		if m.SubPath != "" {
			src = filepath.Join(src, m.SubPath)
		}
		spec.Mounts = append(spec.Mounts, podproc.Mount{Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly})
	}
	psc := p.spec.SecurityContext
	if psc != nil && psc.RunAsUser != nil {
		spec.UID, spec.GID = int(*psc.RunAsUser), int(*psc.RunAsUser)
		if psc.RunAsGroup != nil {
			spec.GID = int(*psc.RunAsGroup)
		}
		if psc.FSGroup != nil {
			spec.Groups = []int{int(*psc.FSGroup)}
		}
	}
	if sc := ctr.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		spec.ReadOnlyRoot = true
	}
	return spec
}

// stop ends every process, the injected pods' first (SIGTERM, then SIGKILL after 5 s), and, when the test
// failed, prints each log's tail.
func (c *cluster) stop() {
	began := time.Now()
	defer func() { c.t.Logf("stopped in %v", time.Since(began).Round(time.Millisecond)) }()
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for _, wave := range []bool{true, false} {
		var stopping []*proc
		for _, p := range procs {
			if p.pod.injected == wave {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				stopping = append(stopping, p)
			}
		}
		for _, p := range stopping {
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	}
	if !c.t.Failed() {
		return
	}
	for _, p := range procs {
		b, _ := os.ReadFile(p.log)
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		c.t.Logf("%s/%s (%v):\n%s", p.pod.name, p.container, p.cmd.ProcessState, b)
	}
}

// exited fails the test with the log of any process that has exited.
func (c *cluster) exited() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			c.t.Fatalf("%s/%s exited (%v):\n%s", p.pod.name, p.container, p.cmd.ProcessState, b)
		default:
		}
	}
}

// port is the container port a probe or Service names (by name or number) in the pod's containers.
func (p *pod) port(ctrs []corev1.Container, port intstr.IntOrString) (int32, bool) {
	if port.Type == intstr.Int {
		return port.IntVal, true
	}
	for _, ctr := range ctrs {
		for _, cp := range ctr.Ports {
			if cp.Name == port.StrVal {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

var probeClient = &http.Client{
	Timeout:   time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // the kubelet does not verify probe certificates either
}

// probe asks what the kubelet would, from outside the pod, at the pod's IP: nil when it answers as healthy.
func (p *pod) probe(ctr corev1.Container, pr *corev1.Probe) error {
	switch {
	case pr.HTTPGet != nil:
		port, ok := p.port([]corev1.Container{ctr}, pr.HTTPGet.Port)
		if !ok {
			return fmt.Errorf("no port %s in container %s", pr.HTTPGet.Port.String(), ctr.Name)
		}
		scheme := strings.ToLower(string(pr.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		u := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(p.net.IP.String(), strconv.Itoa(int(port))), pr.HTTPGet.Path)
		resp, err := probeClient.Get(u)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("GET %s: %s %s", u, resp.Status, bytes.TrimSpace(body))
		}
		return nil
	case pr.TCPSocket != nil:
		port, ok := p.port([]corev1.Container{ctr}, pr.TCPSocket.Port)
		if !ok {
			return fmt.Errorf("no port %s in container %s", pr.TCPSocket.Port.String(), ctr.Name)
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(p.net.IP.String(), strconv.Itoa(int(port))), time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	default:
		return fmt.Errorf("probe %+v: the test asks httpGet and tcpSocket probes only", pr.ProbeHandler)
	}
}

// inject sends p to the injector pod inj as the API server would for a pod create, through the webhook's
// Service port and the caBundle it trusts, and applies the answer's patch to p's spec.
func (c *cluster) inject(inj *pod, r *chartrender.Objects, p *pod) {
	c.t.Helper()
	var hook *admissionregistrationv1.MutatingWebhook
	for _, cfg := range r.Webhooks {
		for i := range cfg.Webhooks {
			w := &cfg.Webhooks[i]
			if sel := w.ObjectSelector; sel != nil && selects(sel.MatchLabels, p.labels) {
				hook = w
			}
		}
	}
	if hook == nil {
		return
	}
	svc := chartrender.MustGet(c.t, r.Services, hook.ClientConfig.Service.Name)
	var target intstr.IntOrString
	for _, sp := range svc.Spec.Ports {
		if hook.ClientConfig.Service.Port == nil || sp.Port == *hook.ClientConfig.Service.Port {
			target = sp.TargetPort
		}
	}
	port, ok := inj.port(inj.spec.Containers, target)
	if !ok {
		c.t.Fatalf("webhook Service %s port %v: targetPort %s is no port of the injector", svc.Name, hook.ClientConfig.Service.Port, target.String())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(hook.ClientConfig.CABundle) {
		c.t.Fatalf("webhook %s caBundle holds no certificate", hook.Name)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: fmt.Sprintf("%s.%s.svc", svc.Name, namespace),
	}}}
	obj := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: namespace, Labels: p.labels},
		Spec:       p.spec,
	}
	raw, err := json.Marshal(obj)
	must(c.t, err)
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "3b1f6c2e-0d7a-4f59-9e2b-6a1c5d8e7f00", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: namespace,
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	})
	must(c.t, err)
	path := "/"
	if hook.ClientConfig.Service.Path != nil {
		path = *hook.ClientConfig.Service.Path
	}
	u := fmt.Sprintf("https://%s%s", net.JoinHostPort(inj.net.IP.String(), strconv.Itoa(int(port))), path)
	resp, err := client.Post(u, "application/json", bytes.NewReader(body))
	if err != nil {
		c.t.Fatalf("webhook %s: %v", u, err)
	}
	defer resp.Body.Close()
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&review); err != nil || review.Response == nil || !review.Response.Allowed {
		c.t.Fatalf("webhook %s: %s: %+v %v", u, resp.Status, review.Response, err)
	}
	patch, err := jsonpatch.DecodePatch(review.Response.Patch)
	must(c.t, err)
	patched, err := patch.Apply(raw)
	must(c.t, err)
	var out corev1.Pod
	must(c.t, json.Unmarshal(patched, &out))
	p.spec = out.Spec
	p.labels = out.Labels
	p.injected = true
}

// await polls f every 100 ms until it is nil or timeout passes, failing the test with f's last error.
func (c *cluster) await(what string, timeout time.Duration, f func() error) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var err error
	for {
		c.exited()
		if err = f(); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("%s: not within %v: %v", what, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func sortedKeys[T any](m map[string]T) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
