package inject

import (
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestTLSIdentityInjected: the sidecar and the runner container get the same
// identity files, from a csi-driver volume asking for the pod's proxy
// identity or from the Secret's entries of that proxy id, or run with
// --insecure.
func TestTLSIdentityInjected(t *testing.T) {
	t.Parallel()
	fsGroup := int64(65532)
	tests := []struct {
		name      string
		opts      func(*Options)
		edit      func(*corev1.Pod)
		wantURI   string            // csi: the requested URI SAN
		wantItems map[string]string // secret: key -> file
		wantFS    string            // csi: fs-group attribute
		shared    []string          // containers that must carry the identity
	}{
		{
			name:    "csi, proxy id is the pod name",
			edit:    func(p *corev1.Pod) { p.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: &fsGroup} },
			wantURI: "spiffe://prism.local/proxy/${POD_NAME}", wantFS: "65532", shared: []string{"runner"},
		},
		{
			name: "csi, annotated proxy id, trust domain, issuer and containers",
			opts: func(o *Options) {
				o.TLS.TrustDomain, o.TLS.Issuer = "mesh.example.com", IssuerRef{Name: "corp", Kind: "ClusterIssuer", Group: "cert-manager.io"}
			},
			edit: func(p *corev1.Pod) {
				p.Annotations = map[string]string{AnnotationProxyID: "proxy-01", AnnotationTLSContainers: "runner, helper"}
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "helper", Image: "x"}, corev1.Container{Name: "bystander", Image: "y"})
			},
			wantURI: "spiffe://mesh.example.com/proxy/proxy-01", shared: []string{"runner", "helper"},
		},
		{
			name: "secret, pod name",
			opts: func(o *Options) {
				o.TLS = TLSOptions{Mode: TLSSecret, SecretName: "proxies-tls", Containers: []string{"runner"}}
			},
			wantItems: map[string]string{"ca.crt": FileCA, "prism-runner-0.crt": FileCert, "prism-runner-0.key": FileKey},
			shared:    []string{"runner"},
		},
		{
			name: "secret named by annotation, proxy id annotated on a pod without a name",
			opts: func(o *Options) {
				o.TLS = TLSOptions{Mode: TLSSecret, SecretName: "default-tls", Containers: []string{"runner"}}
			},
			edit: func(p *corev1.Pod) {
				p.Name, p.GenerateName = "", "prism-runner-7d9f-"
				p.Annotations = map[string]string{AnnotationProxyID: "proxy-02", AnnotationTLSSecret: "proxies-tls"}
			},
			wantItems: map[string]string{"ca.crt": FileCA, "proxy-02.crt": FileCert, "proxy-02.key": FileKey},
			shared:    []string{"runner"},
		},
		{
			name: "insecure",
			opts: func(o *Options) { o.TLS.Mode = TLSInsecure },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := runnerPod()
			if tc.edit != nil {
				tc.edit(pod)
			}
			defaults := testDefaults()
			if tc.opts != nil {
				tc.opts(&defaults)
			}
			o, err := ParseOptions(pod.Annotations, defaults)
			if err != nil {
				t.Fatal(err)
			}
			if err := Mutate(pod, o); err != nil {
				t.Fatal(err)
			}
			sc := pod.Spec.InitContainers[len(pod.Spec.InitContainers)-1]
			if o.TLS.Mode == TLSInsecure {
				if !slices.Contains(sc.Args, "--insecure") || len(pod.Spec.Volumes) != 0 || envOf(sc)[EnvTLSCert].Value != "" {
					t.Fatalf("insecure: args %v volumes %v env %v", sc.Args, pod.Spec.Volumes, sc.Env)
				}
				return
			}
			if slices.Contains(sc.Args, "--insecure") {
				t.Errorf("sidecar args %v: --insecure with TLS", sc.Args)
			}
			if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].Name != TLSVolumeName {
				t.Fatalf("volumes %+v, want %s", pod.Spec.Volumes, TLSVolumeName)
			}
			files := map[string]bool{}
			switch vol := pod.Spec.Volumes[0]; {
			case tc.wantURI != "":
				csi := vol.CSI
				if csi == nil || csi.Driver != CSIDriver || csi.ReadOnly == nil || !*csi.ReadOnly {
					t.Fatalf("volume %+v, want a read-only %s volume", vol, CSIDriver)
				}
				a := csi.VolumeAttributes
				if a[CSIURISANs] != tc.wantURI || a[CSIIssuerName] != o.TLS.Issuer.Name || a[CSIFSGroup] != tc.wantFS {
					t.Errorf("attributes %v, want uri %q issuer %q fs-group %q", a, tc.wantURI, o.TLS.Issuer.Name, tc.wantFS)
				}
				if want := o.TLS.Issuer.Kind; want != "" && a[CSIIssuerKind] != want {
					t.Errorf("issuer kind %q, want %q", a[CSIIssuerKind], want)
				}
				if !strings.Contains(a[CSIKeyUsages], "client auth") || !strings.Contains(a[CSIKeyUsages], "server auth") {
					t.Errorf("key usages %q: the identity serves and dials", a[CSIKeyUsages])
				}
				// csi-driver's default file names.
				files = map[string]bool{FileCA: true, FileCert: true, FileKey: true}
			default:
				if vol.Secret == nil || vol.Secret.SecretName != "proxies-tls" {
					t.Fatalf("volume %+v, want Secret proxies-tls", vol)
				}
				got := map[string]string{}
				for _, it := range vol.Secret.Items {
					got[it.Key] = it.Path
					files[it.Path] = true
				}
				if !mapsEqual(got, tc.wantItems) {
					t.Errorf("secret items %v, want %v", got, tc.wantItems)
				}
			}
			carriers := map[string]corev1.Container{ContainerName: sc}
			for _, c := range pod.Spec.Containers {
				carriers[c.Name] = c
			}
			for name, c := range carriers {
				wants := name == ContainerName || slices.Contains(tc.shared, name)
				if got := checkTLSMount(t, c, files); got != wants {
					t.Errorf("container %s carries the identity: %v, want %v", name, got, wants)
				}
			}
		})
	}
}

// checkTLSMount reports whether c mounts the identity volume, and if it
// does, that its PRISM_TLS_* variables name files the volume holds.
func checkTLSMount(t *testing.T, c corev1.Container, files map[string]bool) bool {
	t.Helper()
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == TLSVolumeName {
			mount = &c.VolumeMounts[i]
		}
	}
	env := envOf(c)
	if mount == nil {
		if env[EnvTLSCert].Value != "" {
			t.Errorf("%s: %s set without the mount", c.Name, EnvTLSCert)
		}
		return false
	}
	if !mount.ReadOnly {
		t.Errorf("%s: identity mounted writable", c.Name)
	}
	for _, k := range []string{EnvTLSCA, EnvTLSCert, EnvTLSKey} {
		dir, file, _ := strings.Cut(env[k].Value, mount.MountPath+"/")
		if dir != "" || !files[file] {
			t.Errorf("%s: %s=%q is not a file of the volume mounted at %s (%v)", c.Name, k, env[k].Value, mount.MountPath, files)
		}
	}
	return true
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestTLSOptionsRefused: the injector does not start without a TLS mode or
// with an incomplete one, and a pod whose identity cannot be named is
// denied, not given a sidecar that cannot start.
func TestTLSOptionsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no mode", func(o *Options) { o.TLS.Mode = "" }, "--mesh-tls"},
		{"unknown mode", func(o *Options) { o.TLS.Mode = "tls" }, "--mesh-tls"},
		{"csi without issuer", func(o *Options) { o.TLS.Issuer.Name = "" }, "--mesh-issuer-name"},
		{"csi with a bad trust domain", func(o *Options) { o.TLS.TrustDomain = "Bad Domain" }, "--mesh-trust-domain"},
		{"secret without a Secret", func(o *Options) { o.TLS = TLSOptions{Mode: TLSSecret} }, "--mesh-tls-secret"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := testDefaults()
			tc.edit(&o)
			if _, err := NewWebhook(o, nil, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewWebhook: %v, want an error naming %s", err, tc.want)
			}
		})
	}

	for _, ann := range []map[string]string{
		{AnnotationTLSSecret: "Not_A_Name"},
		{AnnotationTLSContainers: "runner,Bad Name"},
	} {
		if _, err := ParseOptions(ann, testDefaults()); err == nil {
			t.Errorf("annotations %v accepted", ann)
		} else if ae := (*AnnotationError)(nil); !errors.As(err, &ae) {
			t.Errorf("annotations %v: error %v names no annotation", ann, err)
		}
	}

	// Secret mode cannot name the keys of a pod that has neither a name
	// nor a proxy id yet.
	o := testDefaults()
	o.TLS = TLSOptions{Mode: TLSSecret, SecretName: "proxies-tls"}
	w, err := NewWebhook(o, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := runnerPod()
	pod.Name, pod.GenerateName = "", "prism-runner-7d9f-"
	code, body := post(t, NewHandler(w, nil), PathInjectPod, reviewFor(t, mustJSON(t, pod), admissionv1.Create, podKind))
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	resp := decodeResponse(t, body)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity || !strings.Contains(resp.Result.Message, AnnotationProxyID) {
		t.Fatalf("response %+v, want a 422 denial naming %s", resp, AnnotationProxyID)
	}
}

// TestCSIKey: csi mode asks csi-driver for the key named (else the
// driver's default, RSA 2048 as PKCS#1), and a key it cannot make is
// refused before any pod is mutated.
func TestCSIKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		key     KeyOptions
		want    map[string]string
		wantErr string
	}{
		{"named", KeyOptions{Algorithm: "ECDSA", Size: 256, Encoding: "PKCS8"},
			map[string]string{CSIKeyAlgorithm: "ECDSA", CSIKeySize: "256", CSIKeyEncoding: "PKCS8"}, ""},
		{"driver default", KeyOptions{}, map[string]string{}, ""},
		{"bad algorithm", KeyOptions{Algorithm: "DSA"}, nil, "--mesh-key-algorithm"},
		{"bad encoding", KeyOptions{Encoding: "SEC1"}, nil, "--mesh-key-encoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			defaults := testDefaults()
			defaults.TLS.Key = tc.key
			pod := runnerPod()
			o, err := ParseOptions(pod.Annotations, defaults)
			if err == nil {
				err = Mutate(pod, o)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a := pod.Spec.Volumes[0].CSI.VolumeAttributes
			for _, k := range []string{CSIKeyAlgorithm, CSIKeySize, CSIKeyEncoding} {
				if a[k] != tc.want[k] {
					t.Errorf("%s %q, want %q", k, a[k], tc.want[k])
				}
			}
		})
	}
}
