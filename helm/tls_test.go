package helm

import (
	"log/slog"
	"path"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/sidecar/inject"
)

var (
	secretMode = withQueryAuth(map[string]any{"tls": map[string]any{"mode": "secret", "secret": map[string]any{
		"admin": "admin-certs", "runner": "proxy-certs", "gateway": "gateway-certs",
	}}})
	generateMode = withQueryAuth(map[string]any{"tls": map[string]any{"mode": "generate", "trustDomain": "mesh.example.com"},
		"admin": map[string]any{"replicas": 5}, "runner": map[string]any{"replicas": 4}})
	insecureMode = withQueryAuth(map[string]any{"tls": map[string]any{"mode": "insecure"}})
	corpIssuer   = withQueryAuth(map[string]any{"tls": map[string]any{"trustDomain": "mesh.example.com",
		"certManager": map[string]any{"issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"}}}})
)

// injectedRunner is the chart's runner pod prism-runner-0 after the
// chart's injector has run on it.
func injectedRunner(t *testing.T, r *rendered) *corev1.Pod {
	t.Helper()
	return injectedRunnerNamed(t, r, runnerName+"-0")
}

// injectedRunnerNamed is the chart's runner pod podName after the chart's
// injector has run on it.
func injectedRunnerNamed(t *testing.T, r *rendered, podName string) *corev1.Pod {
	t.Helper()
	sts := chartrender.MustGet(t, r.StatefulSets, runnerName)
	opts := injectorOptions(t, container(t, chartrender.MustGet(t, r.Deployments, injectorName).Spec.Template.Spec, "injector"))
	if _, err := inject.NewWebhook(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), clock.RealClock{}); err != nil {
		t.Fatalf("injector refuses the chart's flags: %v", err)
	}
	pod := &corev1.Pod{ObjectMeta: *sts.Spec.Template.ObjectMeta.DeepCopy(), Spec: *sts.Spec.Template.Spec.DeepCopy()}
	pod.Name, pod.Namespace = podName, namespace
	o, err := inject.ParseOptions(pod.Annotations, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := inject.Mutate(pod, o); err != nil {
		t.Fatal(err)
	}
	return pod
}

func sidecarOf(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.InitContainers {
		if c.Name == inject.ContainerName {
			return c
		}
	}
	t.Fatal("no sidecar injected")
	return corev1.Container{}
}

// tlsFiles are the files c is told to load (by --tls-* or PRISM_TLS_*), as
// the kubelet expands them in pod podName.
func tlsFiles(c corev1.Container, podName string) map[string]string {
	fieldRefStandIns := map[string]string{"metadata.name": podName}
	out := map[string]string{}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = fieldRefStandIns[e.ValueFrom.FieldRef.FieldPath]
			continue
		}
		env[e.Name] = e.Value
	}
	for flag, name := range map[string]string{"--tls-ca": inject.EnvTLSCA, "--tls-cert": inject.EnvTLSCert, "--tls-key": inject.EnvTLSKey} {
		if v := env[name]; v != "" {
			out[flag] = v
		}
	}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--tls-") {
			out[k] = strings.ReplaceAll(v, "$(POD_NAME)", env["POD_NAME"])
		}
	}
	return out
}

// volumeFiles are the file names a TLS volume holds: csi-driver's defaults,
// a Secret's projected items, or for a whole Secret the keys the chart
// documents (ca.crt and <pod>.crt/.key, or tls.crt/.key).
func volumeFiles(v corev1.Volume, podName string) map[string]bool {
	switch {
	case v.CSI != nil:
		return map[string]bool{inject.FileCA: true, inject.FileCert: true, inject.FileKey: true}
	case v.Secret != nil && len(v.Secret.Items) > 0:
		out := map[string]bool{}
		for _, it := range v.Secret.Items {
			out[it.Path] = true
		}
		return out
	case v.Secret != nil:
		return map[string]bool{"ca.crt": true, podName + ".crt": true, podName + ".key": true, "tls.crt": true, "tls.key": true}
	}
	return nil
}

// checkIdentity asserts that c loads its three TLS files from the pod's
// identity volume, and returns that volume.
func checkIdentity(t *testing.T, spec corev1.PodSpec, c corev1.Container, podName string, files map[string]string) corev1.Volume {
	t.Helper()
	if len(files) != 3 {
		t.Fatalf("%s: TLS files %v, want --tls-ca, --tls-cert and --tls-key (or PRISM_TLS_*)", c.Name, files)
	}
	var vol *corev1.Volume
	for flag, file := range files {
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if path.Dir(file) == m.MountPath {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil || !mount.ReadOnly {
			t.Fatalf("%s: %s=%s is not in a read-only mount (%v)", c.Name, flag, file, c.VolumeMounts)
		}
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == mount.Name {
				vol = &spec.Volumes[i]
			}
		}
		if vol == nil {
			t.Fatalf("%s: mount %s has no volume", c.Name, mount.Name)
		}
		if !volumeFiles(*vol, podName)[path.Base(file)] {
			t.Errorf("%s: %s=%s: volume %s does not hold %s", c.Name, flag, file, vol.Name, path.Base(file))
		}
	}
	if a := c.Args; contains(a, "--insecure") {
		t.Errorf("%s: --insecure next to TLS files", c.Name)
	}
	return *vol
}

// TestTLSIdentities: in every TLS mode each prism container and Envoy load
// their files from the identity volume they mount, and in cert-manager mode
// the csi-driver volume asks the chart's (or the user's) CA issuer for the
// SPIFFE identity of the pod's role and name.
func TestTLSIdentities(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		vals        map[string]any
		trustDomain string
		issuer      string
		issuerKind  string
	}{
		{"cert-manager with the chart's CA", valueSets["defaults"], "prism.local", "prism-ca", "Issuer"},
		{"cert-manager with a cluster issuer", corpIssuer, "mesh.example.com", "corp-ca", "ClusterIssuer"},
		{"secrets", secretMode, "", "", ""},
		{"secrets from the hook Job", generateMode, "mesh.example.com", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := render(t, tc.vals)
			admin := chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec
			gateway := chartrender.MustGet(t, r.Deployments, gatewayName).Spec.Template.Spec
			runner := injectedRunner(t, r)
			type member struct {
				role, podName string
				spec          corev1.PodSpec
				containers    []corev1.Container
			}
			members := []member{
				{"admin", adminName + "-0", admin, []corev1.Container{container(t, admin, "admin")}},
				{"gateway", gatewayName + "-6d4f9-x2x7q", gateway, []corev1.Container{container(t, gateway, "envoy")}},
				{"proxy", runnerName + "-0", runner.Spec, []corev1.Container{container(t, runner.Spec, "runner"), sidecarOf(t, runner)}},
			}
			for _, m := range members {
				var vols []string
				for _, c := range m.containers {
					files := tlsFiles(c, m.podName)
					if c.Name == "envoy" {
						files = envoyFiles(t, r)
					}
					vol := checkIdentity(t, m.spec, c, m.podName, files)
					vols = append(vols, vol.Name)
					if tc.issuer == "" {
						continue
					}
					a := vol.CSI.VolumeAttributes
					if want := "spiffe://" + tc.trustDomain + "/" + m.role + "/" + inject.CSIPodNameVar; a[inject.CSIURISANs] != want {
						t.Errorf("%s/%s: uri-sans %q, want %q", m.role, c.Name, a[inject.CSIURISANs], want)
					}
					if a[inject.CSIIssuerName] != tc.issuer || a[inject.CSIIssuerKind] != tc.issuerKind || a[inject.CSIIssuerGroup] != "cert-manager.io" {
						t.Errorf("%s/%s: issuer %v", m.role, c.Name, a)
					}
					if fs := m.spec.SecurityContext.FSGroup; fs == nil || a[inject.CSIFSGroup] != strings.TrimSpace(toYAML(*fs)) {
						t.Errorf("%s/%s: fs-group %q, pod fsGroup %v: the non-root container could not read its key", m.role, c.Name, a[inject.CSIFSGroup], fs)
					}
					if !strings.Contains(a[inject.CSIKeyUsages], "client auth") || !strings.Contains(a[inject.CSIKeyUsages], "server auth") {
						t.Errorf("%s/%s: key usages %q", m.role, c.Name, a[inject.CSIKeyUsages])
					}
					// Named, not csi-driver's default (RSA 2048 as PKCS#1).
					if a[inject.CSIKeyAlgorithm] != "ECDSA" || a[inject.CSIKeySize] != "256" || a[inject.CSIKeyEncoding] != "PKCS8" {
						t.Errorf("%s/%s: key %q %q %q, want the values' ECDSA 256 PKCS8", m.role, c.Name,
							a[inject.CSIKeyAlgorithm], a[inject.CSIKeySize], a[inject.CSIKeyEncoding])
					}
				}
				if len(vols) == 2 && vols[0] != vols[1] {
					t.Errorf("runner and sidecar load different volumes %v: they must share proxy/<proxy id>", vols)
				}
			}
			// The admin's identity is admin/<node id>: the node id is the
			// pod name that csi-driver puts in the certificate.
			if a := args(container(t, admin, "admin")); a["--node-id"] != "$(POD_NAME)" {
				t.Errorf("--node-id %q is not the pod name in the certificate", a["--node-id"])
			}
			// The runner's proxy id, which its certificate names, is the
			// pod name too.
			if ref := envOf(sidecarOf(t, runner))[inject.EnvProxyID].ValueFrom; ref == nil || ref.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("sidecar proxy id is not the pod name")
			}
			checkEnvoyTLS(t, r, container(t, gateway, "envoy"), tc.trustDomain)
			if tc.issuer != "" {
				checkIssuers(t, r, tc.issuer, tc.issuerKind, tc.trustDomain)
			}
		})
	}
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// checkEnvoyTLS: the chart's bootstrap has what envoy.Bootstrap gives a
// gateway with TLS: the static secrets read from the mounted files, and
// mutual TLS to the admin nodes.
func checkEnvoyTLS(t *testing.T, r *rendered, c corev1.Container, trustDomain string) {
	t.Helper()
	files := envoyFiles(t, r)
	if trustDomain == "" {
		trustDomain = "prism.local"
	}
	want, err := envoy.Bootstrap(envoy.Config{NodeID: "g", AdminNodes: []string{"10.0.0.1:7001"}, TLS: &envoy.TLS{
		CA: "/etc/prism/tls/ca.crt", Cert: "/etc/prism/tls/tls.crt", Key: "/etc/prism/tls/tls.key", TrustDomain: trustDomain,
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := parseBootstrap(t, "chart bootstrap", []byte(chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap").Data["bootstrap.yaml"]))
	gotSecrets, wantSecrets := got.GetStaticResources().GetSecrets(), want.GetStaticResources().GetSecrets()
	if len(gotSecrets) != len(wantSecrets) {
		t.Fatalf("bootstrap secrets %v, want %v", gotSecrets, wantSecrets)
	}
	for i := range wantSecrets {
		if !proto.Equal(gotSecrets[i], wantSecrets[i]) {
			t.Errorf("bootstrap secret %d:\n%v\nwant\n%v", i, gotSecrets[i], wantSecrets[i])
		}
	}
	gotTS := got.GetStaticResources().GetClusters()[0].GetTransportSocket()
	wantTS := want.GetStaticResources().GetClusters()[0].GetTransportSocket()
	if gotTS == nil || !proto.Equal(gotTS, wantTS) {
		t.Errorf("xDS cluster transport socket\n%v\nwant\n%v", gotTS, wantTS)
	}
	// Envoy reads static secrets once: it must be restarted on renewal.
	if p := c.LivenessProbe; p == nil || p.Exec == nil || !strings.Contains(strings.Join(p.Exec.Command, " "), files["--tls-cert"]) {
		t.Errorf("envoy liveness %s does not watch %s", toYAML(p), files["--tls-cert"])
	}
}

// envoyFiles are the files the chart's bootstrap has Envoy read.
func envoyFiles(t *testing.T, r *rendered) map[string]string {
	t.Helper()
	b := parseBootstrap(t, "chart bootstrap", []byte(chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap").Data["bootstrap.yaml"]))
	out := map[string]string{}
	for _, s := range b.GetStaticResources().GetSecrets() {
		if c := s.GetTlsCertificate(); c != nil {
			out["--tls-cert"], out["--tls-key"] = c.GetCertificateChain().GetFilename(), c.GetPrivateKey().GetFilename()
		}
		if v := s.GetValidationContext(); v != nil {
			out["--tls-ca"] = v.GetTrustedCa().GetFilename()
		}
	}
	return out
}

// checkIssuers: the csi-driver's issuer is a CA issuer backed by a CA
// Certificate from a self-signed issuer (or the user's issuer, not
// rendered), and the operator Certificate carries operator/<name>.
func checkIssuers(t *testing.T, r *rendered, issuer, kind, trustDomain string) {
	t.Helper()
	if kind == "Issuer" {
		ca := chartrender.MustGet(t, r.Issuers, issuer)
		ref, _ := ca.Spec["ca"].(map[string]any)
		caCert := chartrender.MustGet(t, r.Certificates, issuer)
		if ref == nil || ref["secretName"] != caCert.Spec.SecretName || !caCert.Spec.IsCA {
			t.Errorf("issuer %s: %v, CA certificate %+v", issuer, ca.Spec, caCert.Spec)
		}
		self := chartrender.MustGet(t, r.Issuers, caCert.Spec.IssuerRef.Name)
		if _, ok := self.Spec["selfSigned"]; !ok {
			t.Errorf("CA certificate signed by %s %v, want a self-signed issuer", self.Metadata.Name, self.Spec)
		}
	} else if len(r.Issuers) != 0 {
		t.Errorf("issuers %v rendered next to the user's %s", r.Issuers, issuer)
	}
	op := chartrender.MustGet(t, r.Certificates, "prism-operator")
	if want := "spiffe://" + trustDomain + "/operator/prismctl"; len(op.Spec.URIs) != 1 || op.Spec.URIs[0] != want {
		t.Errorf("operator uris %v, want %s", op.Spec.URIs, want)
	}
	if op.Spec.IssuerRef.Name != issuer || op.Spec.IssuerRef.Kind != kind || !contains(op.Spec.Usages, "client auth") {
		t.Errorf("operator certificate %+v", op.Spec)
	}
	// Every Certificate names its key, not cert-manager's default (RSA
	// 2048 as PKCS#1).
	for name, c := range r.Certificates {
		if k := c.Spec.PrivateKey; k.Algorithm != "ECDSA" || k.Size != 256 || k.Encoding != "PKCS8" {
			t.Errorf("Certificate %s: private key %+v, want the values' ECDSA 256 PKCS8", name, k)
		}
	}
	if !strings.Contains(r.Notes, op.Spec.SecretName) || !strings.Contains(r.Notes, "--cacert") {
		t.Errorf("NOTES.txt does not say how to use Secret %s with prismctl:\n%s", op.Spec.SecretName, r.Notes)
	}
}

// TestInsecureMode: tls.mode insecure passes --insecure to every prism
// process, mounts no identity, keeps Envoy in plaintext, and says so.
func TestInsecureMode(t *testing.T) {
	t.Parallel()
	r := render(t, insecureMode)
	admin := container(t, chartrender.MustGet(t, r.StatefulSets, adminName).Spec.Template.Spec, "admin")
	runnerPod := injectedRunner(t, r)
	for _, c := range []corev1.Container{admin, container(t, runnerPod.Spec, "runner"), sidecarOf(t, runnerPod)} {
		if !contains(c.Args, "--insecure") || len(tlsFiles(c, "p")) != 0 {
			t.Errorf("%s: args %v env %v, want --insecure and no TLS files", c.Name, c.Args, c.Env)
		}
	}
	for wl, tmpl := range r.PodTemplates() {
		for _, v := range tmpl.Spec.Volumes {
			if v.CSI != nil || v.Name == inject.TLSVolumeName {
				t.Errorf("%s: identity volume %s in insecure mode", wl, v.Name)
			}
		}
	}
	if len(r.Certificates) != 0 || len(r.Issuers) != 0 {
		t.Errorf("certificates %v issuers %v in insecure mode", r.Certificates, r.Issuers)
	}
	b := parseBootstrap(t, "chart bootstrap", []byte(chartrender.MustGet(t, r.ConfigMaps, gatewayName+"-bootstrap").Data["bootstrap.yaml"]))
	if b.GetStaticResources().GetClusters()[0].GetTransportSocket() != nil || len(b.GetStaticResources().GetSecrets()) != 0 {
		t.Errorf("insecure bootstrap has TLS")
	}
	for _, want := range []string{"WARNING", "plaintext", "--insecure namespace create"} {
		if !strings.Contains(r.Notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, r.Notes)
		}
	}
}
