package chart

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/sidecar/inject"
)

const (
	adminName    = releaseName + "-admin"
	gatewayName  = releaseName + "-gateway"
	injectorName = releaseName + "-injector"
)

// TestChartRuns starts the chart's Prism containers with their rendered arguments and environment, each pod
// on its own address with its volumes, and checks that every readiness and liveness probe answers on its
// port and path, that every Service targetPort has a listener on the pods it selects, and that the gateway
// listener the admin nodes announce over xDS, read as the Envoy pods' node id with their identity, is the
// port of Envoy's container and of the gateway Service. Envoy itself runs only when on PATH. With three
// admin nodes the StatefulSet is then grown to five: the two new pods, started with the new render's
// arguments beside the three running ones, join by themselves and become voters.
func TestChartRuns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		bench string
		grow  bool
	}{
		{"defaults", []string{"testdata/defaults.yaml"}, "chart.ready_s", false},
		{"3 admins 5 runners", []string{"testdata/defaults.yaml", "testdata/three-admins-five-runners.yaml"}, "chart.ready_s_3a5r", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, r := runChart(t, tc.files, tc.bench)
			if tc.grow {
				began := time.Now()
				defer func() { t.Logf("grown to 5 admin nodes in %v", time.Since(began).Round(time.Millisecond)) }()
				growAdmins(t, c, append(slices.Clone(tc.files), "testdata/five-admins.yaml"), r)
			}
		})
	}
}

// runChart renders the chart with files and runs it: admin nodes, injectors (and Envoy when on PATH) at
// once, the runner pods once an injector is ready to inject them, as the API server would have it call.
func runChart(t *testing.T, files []string, bench string) (*cluster, *chartrender.Objects) {
	began := time.Now()
	defer func() { t.Logf("ran and checked in %v", time.Since(began).Round(time.Millisecond)) }()
	r := render(t, files...)
	var brokers []string
	for _, b := range value(t, "kafka.brokers", files...).([]any) {
		brokers = append(brokers, str(b))
	}
	c := newCluster(t, brokers)
	c.useCA(str(value(t, "tls.trustDomain", files...)))
	c.addRendered(r)
	if str(value(t, "tls.mode", files...)) == "secret" {
		c.userSecrets(r, files)
	}
	pods := c.addPods(r, 0)
	c.writeHosts(r)

	var injectors, injected []*pod
	for _, p := range pods {
		switch {
		case c.injectedBy(r, p):
			injected = append(injected, p)
		default:
			c.run(p)
			if p.workload == injectorName {
				injectors = append(injectors, p)
			}
		}
	}
	if len(injectors) == 0 {
		t.Fatal("no injector pods rendered")
	}
	c.awaitReady(injectors, 30*time.Second)
	for _, p := range injected {
		c.inject(injectors[0], r, p)
		if !slices.ContainsFunc(p.spec.InitContainers, func(ctr corev1.Container) bool { return ctr.Name == inject.ContainerName }) {
			t.Fatalf("the injector gave runner pod %s no sidecar", p.name)
		}
		c.run(p)
	}
	c.awaitReady(pods, 60*time.Second)
	ready := time.Since(c.start)
	t.Logf("%d pods ready %.2fs after the first process started", len(pods), ready.Seconds())
	if bench != "" && os.Getenv("PRISM_CHART_BENCH") != "" {
		fmt.Printf("BENCH %s %.2f s\n", bench, ready.Seconds())
	}
	c.checkLiveness(pods)
	c.checkServices(r, pods)
	c.checkGatewayListener(r, pods)
	return c, r
}

// injectedBy says whether one of the release's webhooks selects p's pod (the runners).
func (c *cluster) injectedBy(r *chartrender.Objects, p *pod) bool {
	for _, cfg := range r.Webhooks {
		for _, w := range cfg.Webhooks {
			if w.ObjectSelector != nil && selects(w.ObjectSelector.MatchLabels, p.labels) {
				return true
			}
		}
	}
	return false
}

// userSecrets makes the Secrets of tls.mode secret as the values name them and values.yaml describes them:
// ca.crt in each, <pod>.crt and .key for every admin and runner pod, tls.crt and tls.key of the gateway's
// one identity (tls.secret.gatewayName, else the gateway's name).
func (c *cluster) userSecrets(r *chartrender.Objects, files []string) {
	c.t.Helper()
	ca := c.caPEM()
	for _, role := range []struct {
		key, workload string
		role          identity.Role
	}{{"admin", adminName, identity.Admin}, {"runner", releaseName + "-runner", identity.Proxy}} {
		data := map[string][]byte{"ca.crt": ca}
		s := chartrender.MustGet(c.t, r.StatefulSets, role.workload)
		for i := range int(*s.Spec.Replicas) {
			name := fmt.Sprintf("%s-%d", role.workload, i)
			data[name+".crt"], data[name+".key"] = c.issue(role.role, name)
		}
		c.secrets[str(value(c.t, "tls.secret."+role.key, files...))] = data
	}
	gw := str(value(c.t, "tls.secret.gatewayName", files...))
	if gw == "" {
		gw = gatewayName
	}
	crt, key := c.issue(identity.Gateway, gw)
	c.secrets[str(value(c.t, "tls.secret.gateway", files...))] = map[string][]byte{"ca.crt": ca, "tls.crt": crt, "tls.key": key}
}

// awaitReady waits until every readiness probe of the pods' running containers passes.
func (c *cluster) awaitReady(pods []*pod, timeout time.Duration) {
	c.t.Helper()
	c.await("readiness probes", timeout, func() error {
		var errs []error
		for _, p := range pods {
			for _, ctr := range p.containers(c.t) {
				if runnable(ctr) && ctr.ReadinessProbe != nil {
					if err := p.probe(ctr, ctr.ReadinessProbe); err != nil {
						errs = append(errs, fmt.Errorf("%s/%s readiness: %w", p.name, ctr.Name, err))
					}
				}
			}
		}
		return errors.Join(errs...)
	})
}

// checkLiveness asks every liveness and startup probe of the running containers once: all must pass.
func (c *cluster) checkLiveness(pods []*pod) {
	c.t.Helper()
	for _, p := range pods {
		for _, ctr := range p.containers(c.t) {
			if !runnable(ctr) {
				continue
			}
			if ctr.LivenessProbe == nil && ctr.ReadinessProbe == nil {
				c.t.Errorf("%s/%s has no probes", p.name, ctr.Name)
			}
			for what, pr := range map[string]*corev1.Probe{"liveness": ctr.LivenessProbe, "startup": ctr.StartupProbe} {
				if pr == nil || pr.Exec != nil && !strings.HasPrefix(ctr.Image, prismImage+":") {
					continue
				}
				if err := p.probe(ctr, pr); err != nil {
					c.t.Errorf("%s/%s %s probe: %v", p.name, ctr.Name, what, err)
				}
			}
		}
	}
}

// checkServices: every port of every Service names a port of the pods it selects, and something listens
// there on each pod whose container runs. Envoy's ports are judged against its bootstrap and xDS instead.
func (c *cluster) checkServices(r *chartrender.Objects, pods []*pod) {
	c.t.Helper()
	for _, name := range sortedKeys(r.Services) {
		svc := r.Services[name]
		var selected int
		for _, p := range pods {
			if !selects(svc.Spec.Selector, p.labels) {
				continue
			}
			selected++
			for _, sp := range svc.Spec.Ports {
				tp := sp.TargetPort
				if tp.Type == intstr.Int && tp.IntVal == 0 {
					tp = intstr.FromInt32(sp.Port) // unset: the Service's port
				}
				ctrs := p.containers(c.t)
				port, ok := p.port(ctrs, tp)
				if !ok {
					c.t.Errorf("Service %s port %s: targetPort %s is no container port of pod %s", name, sp.Name, tp.String(), p.name)
					continue
				}
				owner := slices.IndexFunc(ctrs, func(ctr corev1.Container) bool {
					return slices.ContainsFunc(ctr.Ports, func(cp corev1.ContainerPort) bool { return cp.ContainerPort == port })
				})
				if owner >= 0 && !runnable(ctrs[owner]) {
					continue
				}
				addr := net.JoinHostPort(p.net.IP.String(), strconv.Itoa(int(port)))
				conn, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					c.t.Errorf("Service %s port %s (targetPort %s): nothing listens on pod %s at %s: %v", name, sp.Name, tp.String(), p.name, addr, err)
					continue
				}
				conn.Close()
			}
		}
		if selected == 0 {
			c.t.Errorf("Service %s selects no pod", name)
		}
	}
}

// checkGatewayListener reads, over delta ADS from the admin address the Envoy bootstrap names, with the
// identity mounted in the Envoy pod and its node id, the listener the admin nodes send, and checks it is on
// the port of Envoy's http container port, which the gateway Service targets. Envoy's readiness probe
// (Envoy's /ready on the stats listener) is judged by helm/'s bootstrap tests and, with envoy on PATH, run.
func (c *cluster) checkGatewayListener(r *chartrender.Objects, pods []*pod) {
	c.t.Helper()
	if _, err := exec.LookPath("envoy"); err != nil {
		c.t.Log("envoy not on PATH: the gateway pods' Envoy is not started; its listener is checked over xDS")
	}
	var gw *pod
	for _, p := range pods {
		if p.workload == gatewayName {
			gw = p
			break
		}
	}
	if gw == nil {
		c.t.Fatal("no gateway pod")
	}
	if gw.volumes == nil {
		c.materialize(gw)
	}
	envoyCtr := gw.spec.Containers[slices.IndexFunc(gw.spec.Containers, func(ctr corev1.Container) bool { return ctr.Name == "envoy" })]
	_, vars := gw.env(c.t, envoyCtr)
	var nodeID, nodeCluster, config string
	for _, a := range gw.argv(envoyCtr, vars) {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "--service-node":
			nodeID = v
		case "--service-cluster":
			nodeCluster = v
		case "--config-path":
			config = v
		}
	}
	bootstrap := c.mountedFile(gw, envoyCtr, config)
	var b struct {
		StaticResources struct {
			Clusters []struct {
				Name           string `json:"name"`
				LoadAssignment struct {
					Endpoints []struct {
						LbEndpoints []struct {
							Endpoint struct {
								Address struct {
									SocketAddress struct {
										Address   string `json:"address"`
										PortValue int    `json:"port_value"`
									} `json:"socket_address"`
								} `json:"address"`
							} `json:"endpoint"`
						} `json:"lb_endpoints"`
					} `json:"endpoints"`
				} `json:"load_assignment"`
			} `json:"clusters"`
		} `json:"static_resources"`
	}
	if err := yaml.Unmarshal(bootstrap, &b); err != nil || len(b.StaticResources.Clusters) == 0 {
		c.t.Fatalf("Envoy bootstrap %s: %v\n%s", config, err, bootstrap)
	}
	xds := b.StaticResources.Clusters[0].LoadAssignment.Endpoints[0].LbEndpoints[0].Endpoint.Address.SocketAddress
	ip := c.resolve(xds.Address)
	target := net.JoinHostPort(ip.String(), strconv.Itoa(xds.PortValue))

	creds := insecure.NewCredentials()
	if dir, ok := c.mountDir(gw, envoyCtr, "/etc/prism/tls"); ok {
		src, err := pki.Load(pki.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}, nil)
		if err != nil {
			c.t.Fatalf("the gateway pod's identity: %v", err)
		}
		creds = credentials.NewTLS(src.ClientConfig(pki.Any))
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		c.t.Fatalf("delta ADS to %s (%s): %v", xds.Address, target, err)
	}
	node := &corev3.Node{Id: nodeID, Cluster: nodeCluster, UserAgentName: "envoy"}
	if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		c.t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		c.t.Fatalf("listeners for node %s from %s: %v", nodeID, xds.Address, err)
	}
	var ports []uint32
	for _, res := range resp.GetResources() {
		var l listenerv3.Listener
		if err := res.GetResource().UnmarshalTo(&l); err != nil {
			c.t.Fatalf("listener %s: %v", res.GetName(), err)
		}
		if err := l.ValidateAll(); err != nil {
			c.t.Errorf("listener %s: %v", l.GetName(), err)
		}
		if l.GetApiListener() != nil {
			c.t.Errorf("node %s (Envoy) is sent listener %s, grpc-go's API listener: Envoy skips it with a warning", nodeID, l.GetName())
			continue
		}
		ports = append(ports, l.GetAddress().GetSocketAddress().GetPortValue())
	}
	httpPort, ok := gw.port([]corev1.Container{envoyCtr}, intstr.FromString("http"))
	if !ok {
		c.t.Fatal("Envoy's container has no http port")
	}
	if len(ports) != 1 || ports[0] != uint32(httpPort) {
		c.t.Errorf("the admin nodes send node %s listeners on ports %v; Envoy's container port http is %d", nodeID, ports, httpPort)
	}
	svc := chartrender.MustGet(c.t, r.Services, gatewayName)
	for _, sp := range svc.Spec.Ports {
		if port, ok := gw.port([]corev1.Container{envoyCtr}, sp.TargetPort); !ok || len(ports) != 1 || uint32(port) != ports[0] {
			c.t.Errorf("gateway Service port %s targets %s (%d); the announced listener is on %v", sp.Name, sp.TargetPort.String(), port, ports)
		}
	}
	c.t.Logf("node %s gets its listener on port %d from %s: Envoy's http port, the gateway Service's target", nodeID, httpPort, xds.Address)
}

// resolve is the address the hosts file gives name.
func (c *cluster) resolve(name string) netip.Addr {
	c.t.Helper()
	b, err := os.ReadFile(c.hosts)
	must(c.t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains(f[1:], name) {
			return netip.MustParseAddr(f[0])
		}
	}
	c.t.Fatalf("%s resolves to nothing in the pods' hosts file", name)
	return netip.Addr{}
}

// mountDir is the host directory behind path in the container, when a volume is mounted there.
func (c *cluster) mountDir(p *pod, ctr corev1.Container, path string) (string, bool) {
	for _, m := range ctr.VolumeMounts {
		if m.MountPath == path {
			return p.volumes[m.Name], true
		}
	}
	return "", false
}

// mountedFile reads path as the container sees it through its volume mounts.
func (c *cluster) mountedFile(p *pod, ctr corev1.Container, path string) []byte {
	c.t.Helper()
	for _, m := range ctr.VolumeMounts {
		if rel, err := filepath.Rel(m.MountPath, path); err == nil && !strings.HasPrefix(rel, "..") {
			b, err := os.ReadFile(filepath.Join(p.volumes[m.Name], rel))
			must(c.t, err)
			return b
		}
	}
	c.t.Fatalf("%s is on no volume of %s/%s", path, p.name, ctr.Name)
	return nil
}

// growAdmins renders the chart again with five admin nodes and starts the two new pods with that render's
// arguments beside the three running ones (a rolling update would restart those with the new --peers too;
// on their data they keep their state either way). Nobody calls member add: the render keeps
// --bootstrap-expect=3, so the new pods, not among the first three of --peers, ask the running cluster to
// add them, and must become voters at the addresses of their --peers entries, and ready.
func growAdmins(t *testing.T, c *cluster, files []string, before *chartrender.Objects) {
	r := render(t, files...)
	if str(value(t, "tls.mode", files...)) == "secret" {
		c.userSecrets(r, files)
	}
	added := c.addPods(r, int(*before.StatefulSets[adminName].Spec.Replicas), adminName)
	if len(added) != 2 {
		t.Fatalf("growing to 5 added %d admin pods", len(added))
	}
	sts := chartrender.MustGet(t, r.StatefulSets, adminName)
	peers := map[string]string{}
	for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--peers="); ok {
			for _, e := range strings.Split(v, ",") {
				f := strings.Split(e, "=")
				peers[f[0]] = f[1]
			}
		}
	}
	if was, is := bootstrapExpect(t, before), bootstrapExpect(t, r); was != "3" || is != was {
		t.Fatalf("--bootstrap-expect %q, then %q when grown: want 3 both times, or the new pods bootstrap a cluster of their own", was, is)
	}
	c.writeHosts(r)
	began := time.Now()
	for _, p := range added {
		c.run(p)
	}
	cc := c.operator(c.podNamed(adminName + "-0"))
	defer cc.Close()
	admin := adminv1.NewAdminClient(cc)
	want := map[string]string{}
	for i := range 5 {
		id := fmt.Sprintf("%s-%d", adminName, i)
		want[id] = peers[id]
	}
	c.await("five voters at their --peers addresses", 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := admin.GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
		if err != nil {
			return err
		}
		voters := map[string]string{}
		for _, m := range st.GetMembers() {
			if m.GetSuffrage() == adminv1.MemberSuffrage_MEMBER_SUFFRAGE_VOTER {
				voters[m.GetId()] = m.GetRaftAddress()
			}
		}
		if !maps.Equal(voters, want) {
			return fmt.Errorf("voters %v, want %v", voters, want)
		}
		return nil
	})
	t.Logf("the new admin pods voters %v after they started", time.Since(began).Round(time.Millisecond))
	c.awaitReady(added, 30*time.Second)
	t.Logf("and ready %v after they started", time.Since(began).Round(time.Millisecond))
	c.checkLiveness(added)
}

// bootstrapExpect is the admin StatefulSet's --bootstrap-expect in r.
func bootstrapExpect(t *testing.T, r *chartrender.Objects) string {
	t.Helper()
	for _, a := range chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--bootstrap-expect="); ok {
			return v
		}
	}
	return ""
}

func (c *cluster) podNamed(name string) *pod {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.pods {
		if p.name == name {
			return p
		}
	}
	c.t.Fatalf("no pod %s", name)
	return nil
}

// operator is a gRPC connection to p's admin gRPC port as operator/prismctl: in cert-manager mode with the
// files of the operator Secret NOTES.txt tells prismctl to use, as cert-manager writes them for the rendered
// Certificate, read by prismctl's loader.
func (c *cluster) operator(p *pod) *grpc.ClientConn {
	c.t.Helper()
	dir := filepath.Join(c.dir, "operator")
	files := pki.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}
	data := map[string][]byte{}
	for _, crt := range c.certificates {
		if crt.Metadata.Labels["app.kubernetes.io/component"] == "operator" {
			data = c.certificateFiles(crt)
		}
	}
	if len(data) == 0 {
		crt, key := c.issue(identity.Operator, "prismctl")
		data = map[string][]byte{"ca.crt": c.caPEM(), "tls.crt": crt, "tls.key": key}
	}
	c.writeFile(files.CA, data["ca.crt"], 0o644, -1)
	c.writeFile(files.Cert, data["tls.crt"], 0o644, -1)
	c.writeFile(files.Key, data["tls.key"], 0o600, -1)
	src, err := pki.Load(files, nil)
	must(c.t, err)
	port, ok := p.port(p.spec.Containers, intstr.FromString("grpc"))
	if !ok {
		c.t.Fatal("admin container has no grpc port")
	}
	cc, err := grpc.NewClient(net.JoinHostPort(p.net.IP.String(), strconv.Itoa(int(port))), grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig(pki.Any))))
	must(c.t, err)
	return cc
}
