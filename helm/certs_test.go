package helm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki/kube"
)

// certsJob is the hook Job of tls.mode generate: the one running prism
// certs kube-secrets.
func (r *rendered) certsJob() (*batchv1.Job, bool) {
	for _, j := range r.Jobs {
		if cs := j.Spec.Template.Spec.Containers; len(cs) == 1 && len(cs[0].Args) > 1 && cs[0].Args[0] == "certs" && cs[0].Args[1] == "kube-secrets" {
			return j, true
		}
	}
	return nil, false
}

// certsJobSecrets are the Secrets the certs Job writes, from its
// --*-secret flags.
func (r *rendered) certsJobSecrets() map[string]bool {
	out := map[string]bool{}
	if j, ok := r.certsJob(); ok {
		for k, v := range args(j.Spec.Template.Spec.Containers[0]) {
			if strings.HasSuffix(k, "-secret") {
				out[v] = true
			}
		}
	}
	return out
}

// jobPlan is what prism certs kube-secrets makes of the Job's flags
// (TestCertsKubeSecrets in cmd/prism checks that side).
func jobPlan(t *testing.T, a map[string]string) kube.Plan {
	t.Helper()
	duration := func(flag string) time.Duration {
		d, err := time.ParseDuration(a[flag])
		if err != nil {
			t.Fatalf("%s=%q: %v", flag, a[flag], err)
		}
		return d
	}
	p := kube.Plan{Namespace: a["--namespace"], TrustDomain: a["--trust-domain"], CASecret: a["--ca-secret"],
		Validity: duration("--validity"), CAValidity: duration("--ca-validity")}
	for _, g := range []struct {
		flag string
		role identity.Role
	}{{"admin", identity.Admin}, {"runner", identity.Proxy}} {
		n, err := strconv.Atoi(a["--"+g.flag+"-replicas"])
		if err != nil {
			t.Fatalf("--%s-replicas: %v", g.flag, err)
		}
		s := kube.Secret{Name: a["--"+g.flag+"-secret"]}
		for i := range n {
			pod := a["--"+g.flag+"-statefulset"] + "-" + strconv.Itoa(i)
			s.Identities = append(s.Identities, kube.Identity{Role: g.role, Name: pod, File: pod})
		}
		p.Secrets = append(p.Secrets, s)
	}
	for _, g := range []struct {
		flag string
		role identity.Role
	}{{"gateway", identity.Gateway}, {"operator", identity.Operator}} {
		p.Secrets = append(p.Secrets, kube.Secret{Name: a["--"+g.flag+"-secret"],
			Identities: []kube.Identity{{Role: g.role, Name: a["--"+g.flag+"-name"], File: kube.FileTLS}}})
	}
	return p
}

const (
	hookAnnotation   = "helm.sh/hook"
	hookWeight       = "helm.sh/hook-weight"
	hookDeletePolicy = "helm.sh/hook-delete-policy"
)

// checkHook asserts m is a pre-install and pre-upgrade hook, replaced on
// the next run and deleted once it succeeded, and returns its weight.
func checkHook(t *testing.T, kind string, m metav1.ObjectMeta) int {
	t.Helper()
	a := m.Annotations
	if hooks := strings.Split(a[hookAnnotation], ","); !slices.Contains(hooks, "pre-install") || !slices.Contains(hooks, "pre-upgrade") {
		t.Errorf("%s %s: hook %q, want pre-install,pre-upgrade", kind, m.Name, a[hookAnnotation])
	}
	if p := strings.Split(a[hookDeletePolicy], ","); !slices.Contains(p, "before-hook-creation") || !slices.Contains(p, "hook-succeeded") {
		t.Errorf("%s %s: delete policy %q", kind, m.Name, a[hookDeletePolicy])
	}
	w, err := strconv.Atoi(a[hookWeight])
	if err != nil {
		t.Errorf("%s %s: hook weight %q: %v", kind, m.Name, a[hookWeight], err)
	}
	return w
}

// TestGeneratedCertificatesJob: in tls.mode generate a hook Job runs prism
// certs kube-secrets under an account of its own, created before it, whose
// Role reaches only the Secrets the Job writes; other modes render none.
func TestGeneratedCertificatesJob(t *testing.T) {
	t.Parallel()
	r := render(t, generateMode)
	job, ok := r.certsJob()
	if !ok {
		t.Fatalf("no certs Job; jobs %v", r.Jobs)
	}
	jobWeight := checkHook(t, "Job", job.ObjectMeta)
	spec := job.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("the Job's pod has no service account token to call the API with")
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever && spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		t.Errorf("restart policy %s", spec.RestartPolicy)
	}
	sa := chartrender.MustGet(t, r.Accounts, spec.ServiceAccountName)
	if w := checkHook(t, "ServiceAccount", sa.ObjectMeta); w >= jobWeight {
		t.Errorf("ServiceAccount weight %d not below the Job's %d: it may not exist when the Job starts", w, jobWeight)
	}
	written := r.certsJobSecrets()
	if len(written) != 5 {
		t.Fatalf("the Job writes %v, want the CA, admin, runner, gateway and operator Secrets", written)
	}
	var bound int
	for _, rb := range r.RoleBindings {
		if w := checkHook(t, "RoleBinding", rb.ObjectMeta); w >= jobWeight {
			t.Errorf("RoleBinding weight %d not below the Job's %d", w, jobWeight)
		}
		if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa.Name || rb.Subjects[0].Namespace != namespace {
			t.Errorf("RoleBinding %s subjects %v, want only the Job's account", rb.Name, rb.Subjects)
			continue
		}
		bound++
		if rb.RoleRef.Kind != "Role" {
			t.Fatalf("RoleBinding %s binds %s %s, want a namespaced Role", rb.Name, rb.RoleRef.Kind, rb.RoleRef.Name)
		}
		role := chartrender.MustGet(t, r.Roles, rb.RoleRef.Name)
		if w := checkHook(t, "Role", role.ObjectMeta); w >= jobWeight {
			t.Errorf("Role weight %d not below the Job's %d", w, jobWeight)
		}
		granted := map[string]bool{}
		for _, rule := range role.Rules {
			if !slices.Equal(rule.APIGroups, []string{""}) || !slices.Equal(rule.Resources, []string{"secrets"}) || len(rule.NonResourceURLs) > 0 {
				t.Errorf("Role %s rule %+v reaches beyond Secrets", role.Name, rule)
			}
			names := map[string]bool{}
			for _, n := range rule.ResourceNames {
				names[n] = true
			}
			for _, verb := range rule.Verbs {
				switch {
				case verb == "create" && len(names) == 0:
					// The API server cannot check a create's name.
				case (verb == "get" || verb == "update" || verb == "patch") && len(names) > 0:
					if !equalSets(names, written) {
						t.Errorf("Role %s: %s on %v, want exactly the Job's Secrets %v", role.Name, verb, rule.ResourceNames, written)
					}
				default:
					t.Errorf("Role %s grants %s on Secrets %v", role.Name, verb, rule.ResourceNames)
				}
				granted[verb] = true
			}
		}
		for _, verb := range []string{"get", "create", "update"} {
			if !granted[verb] {
				t.Errorf("Role %s does not grant %s, which prism certs kube-secrets needs", role.Name, verb)
			}
		}
	}
	if bound != 1 {
		t.Errorf("%d RoleBindings for the Job's account, want 1", bound)
	}

	for name, vals := range map[string]map[string]any{"cert-manager": valueSets["defaults"], "secret": secretMode, "insecure": insecureMode} {
		r := render(t, vals)
		if len(r.Jobs) != 0 || len(r.Roles) != 0 || len(r.RoleBindings) != 0 {
			t.Errorf("%s mode renders jobs %v roles %v bindings %v", name, r.Jobs, r.Roles, r.RoleBindings)
		}
	}
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// TestGeneratedCertificatesAreWhatPodsLoad runs what the Job runs against
// a fake cluster, then has every pod of the chart look for its files:
// each admin and runner pod (and the runner's sidecar), the gateway and
// the operator of NOTES.txt find, in the Secret their volume names, the
// CA and a certificate of their own identity that verifies against it.
func TestGeneratedCertificatesAreWhatPodsLoad(t *testing.T) {
	t.Parallel()
	r := render(t, generateMode)
	job, ok := r.certsJob()
	if !ok {
		t.Fatal("no certs Job")
	}
	cluster := fake.NewClientset()
	p := jobPlan(t, args(job.Spec.Template.Spec.Containers[0]))
	if _, err := kube.Sync(context.Background(), cluster.CoreV1().Secrets(p.Namespace), p); err != nil {
		t.Fatal(err)
	}
	secret := func(name string) *corev1.Secret {
		t.Helper()
		s, err := cluster.CoreV1().Secrets(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the Job wrote no Secret %s: %v", name, err)
		}
		return s
	}
	caPEM := secret(p.CASecret).Data[kube.KeyCA]
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA")
	}
	td := "mesh.example.com"
	// loads checks that a container told to load files finds them in vol.
	loads := func(who string, vol corev1.Volume, files map[string]string, want identity.Identity) {
		t.Helper()
		if vol.Secret == nil {
			t.Fatalf("%s: volume %s is not a Secret", who, vol.Name)
		}
		s := secret(vol.Secret.SecretName)
		key := func(file string) string {
			for _, it := range vol.Secret.Items {
				if it.Path == path.Base(file) {
					return it.Key
				}
			}
			return path.Base(file)
		}
		if got := s.Data[key(files["--tls-ca"])]; string(got) != string(caPEM) {
			t.Errorf("%s: %s in Secret %s is not the CA", who, files["--tls-ca"], s.Name)
		}
		certPEM, keyPEM := s.Data[key(files["--tls-cert"])], s.Data[key(files["--tls-key"])]
		checkLeaf(t, who, certPEM, keyPEM, roots, want)
	}

	admins := chartrender.MustGet(t, r.StatefulSets, adminName)
	for i := range int(*admins.Spec.Replicas) {
		pod := admins.Name + "-" + strconv.Itoa(i)
		c := container(t, admins.Spec.Template.Spec, "admin")
		files := tlsFiles(c, pod)
		loads(pod, checkIdentity(t, admins.Spec.Template.Spec, c, pod, files), files, identity.Identity{TrustDomain: td, Role: identity.Admin, Name: pod})
	}
	runners := chartrender.MustGet(t, r.StatefulSets, runnerName)
	for i := range int(*runners.Spec.Replicas) {
		pod := injectedRunnerNamed(t, r, runners.Name+"-"+strconv.Itoa(i))
		for _, c := range []corev1.Container{container(t, pod.Spec, "runner"), sidecarOf(t, pod)} {
			files := tlsFiles(c, pod.Name)
			loads(pod.Name+"/"+c.Name, checkIdentity(t, pod.Spec, c, pod.Name, files), files, identity.Identity{TrustDomain: td, Role: identity.Proxy, Name: pod.Name})
		}
	}
	gateway := chartrender.MustGet(t, r.Deployments, gatewayName).Spec.Template.Spec
	files := envoyFiles(t, r)
	loads("gateway", checkIdentity(t, gateway, container(t, gateway, "envoy"), "", files), files, identity.Identity{TrustDomain: td, Role: identity.Gateway, Name: gatewayName})

	// The operator Secret NOTES.txt tells the user to read.
	m := regexp.MustCompile(`kubectl get secret -n \S+ (\S+) -o jsonpath='\{\.data\.tls\\\.crt\}'`).FindStringSubmatch(r.Notes)
	if m == nil {
		t.Fatalf("NOTES.txt does not say where the operator certificate is:\n%s", r.Notes)
	}
	op := secret(m[1])
	checkLeaf(t, "operator", op.Data["tls.crt"], op.Data["tls.key"], roots, identity.Identity{TrustDomain: td, Role: identity.Operator, Name: "prismctl"})
	for _, want := range []string{"Secret " + p.CASecret, "helm upgrade", "admin.replicas or runner.replicas", "prism.io/tls-secret"} {
		if !strings.Contains(r.Notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, r.Notes)
		}
	}
}

func checkLeaf(t *testing.T, who string, certPEM, keyPEM []byte, roots *x509.CertPool, want identity.Identity) {
	t.Helper()
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Errorf("%s: certificate and key: %v", who, err)
		return
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := identity.FromCert(cert); err != nil || got != want {
		t.Errorf("%s: identity %v (%v), want %v", who, got, err, want)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("%s: does not verify against the CA: %v", who, err)
	}
}
