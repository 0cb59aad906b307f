package kube

import (
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

const (
	ns = "mesh"
	td = "mesh.example.com"
)

// plan is a chart-like install: admins and runners in one Secret each,
// one gateway and one operator identity.
func plan(admins, runners int) Plan {
	p := Plan{
		Namespace: ns, TrustDomain: td, CASecret: "prism-ca",
		CAValidity: 10 * 365 * 24 * time.Hour, Validity: 365 * 24 * time.Hour,
		Labels: map[string]string{"app.kubernetes.io/instance": "prism"},
	}
	add := func(secret string, role identity.Role, prefix string, n int) {
		s := Secret{Name: secret}
		for i := range n {
			name := fmt.Sprintf("%s-%d", prefix, i)
			s.Identities = append(s.Identities, Identity{Role: role, Name: name, File: name})
		}
		p.Secrets = append(p.Secrets, s)
	}
	add("prism-admin-tls", identity.Admin, "prism-admin", admins)
	add("prism-runner-tls", identity.Proxy, "prism-runner", runners)
	p.Secrets = append(p.Secrets,
		Secret{Name: "prism-gateway-tls", Identities: []Identity{{Role: identity.Gateway, Name: "prism-gateway", File: FileTLS}}},
		Secret{Name: "prism-operator-tls", Identities: []Identity{{Role: identity.Operator, Name: "prismctl", File: FileTLS}}},
	)
	return p
}

func sync(t *testing.T, c *fake.Clientset, p Plan) Result {
	t.Helper()
	res, err := Sync(context.Background(), c.CoreV1().Secrets(p.Namespace), p)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

func get(t *testing.T, c *fake.Clientset, name string) *corev1.Secret {
	t.Helper()
	s, err := c.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Secret %s: %v", name, err)
	}
	return s
}

// writes counts the create and update calls on Secrets.
func writes(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "secrets" && (a.GetVerb() == "create" || a.GetVerb() == "update" || a.GetVerb() == "patch") {
			n++
		}
	}
	return n
}

// checkSecrets asserts every identity of p is in its Secret, with the
// SPIFFE id it names, verifying against the CA in the CA Secret, which is
// also each Secret's ca.crt; the CA's key is in the CA Secret only.
func checkSecrets(t *testing.T, c *fake.Clientset, p Plan) {
	t.Helper()
	caSecret := get(t, c, p.CASecret)
	caCert, err := parseCert(caSecret.Data[KeyCA])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	for _, want := range p.Secrets {
		s := get(t, c, want.Name)
		if s.Labels[LabelKey] != LabelSelf || s.Labels["app.kubernetes.io/instance"] != "prism" {
			t.Errorf("Secret %s labels %v", s.Name, s.Labels)
		}
		if string(s.Data[KeyCA]) != string(caSecret.Data[KeyCA]) {
			t.Errorf("Secret %s: ca.crt is not the CA", s.Name)
		}
		if _, ok := s.Data[KeyCAKey]; ok {
			t.Errorf("Secret %s holds the CA key", s.Name)
		}
		for _, w := range want.Identities {
			cert, err := parseCert(s.Data[w.File+CertExt])
			if err != nil {
				t.Fatalf("Secret %s/%s: %v", s.Name, w.File, err)
			}
			key, err := pki.ParsePrivateKey(s.Data[w.File+KeyExt])
			if err != nil || !samePublicKey(cert, key) {
				t.Errorf("Secret %s/%s: key %v does not match the certificate", s.Name, w.File, err)
			}
			wantURI := "spiffe://" + td + "/" + string(w.Role) + "/" + w.Name
			if len(cert.URIs) != 1 || cert.URIs[0].String() != wantURI {
				t.Errorf("Secret %s/%s: URI SANs %v, want %s", s.Name, w.File, cert.URIs, wantURI)
			}
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("Secret %s/%s does not verify against the CA for usage %v: %v", s.Name, w.File, usage, err)
				}
			}
		}
	}
}

func TestFirstRunCreatesEverythingSecondChangesNothing(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset()
	p := plan(3, 2)
	res := sync(t, c, p)
	if !res.CACreated || len(res.Issued) != 3+2+1+1 || res.Kept != 0 {
		t.Fatalf("first run: %+v", res)
	}
	checkSecrets(t, c, p)
	if typ := get(t, c, "prism-gateway-tls").Type; typ != corev1.SecretTypeTLS {
		t.Errorf("gateway Secret type %s, want %s", typ, corev1.SecretTypeTLS)
	}
	if typ := get(t, c, "prism-admin-tls").Type; typ != corev1.SecretTypeOpaque {
		t.Errorf("admin Secret type %s", typ)
	}
	before := map[string]map[string][]byte{}
	for _, name := range []string{"prism-ca", "prism-admin-tls", "prism-runner-tls", "prism-gateway-tls", "prism-operator-tls"} {
		before[name] = get(t, c, name).Data
	}

	c.ClearActions()
	res = sync(t, c, p)
	if res.CACreated || len(res.Issued) != 0 || res.Kept != 7 {
		t.Fatalf("second run: %+v, want nothing issued and 7 kept", res)
	}
	if n := writes(c); n != 0 {
		t.Fatalf("second run wrote %d times: %v", n, c.Actions())
	}
	for name, data := range before {
		if !maps.EqualFunc(data, get(t, c, name).Data, func(a, b []byte) bool { return string(a) == string(b) }) {
			t.Errorf("second run changed Secret %s", name)
		}
	}
}

// TestScaleUpIssuesOnlyTheNew: more replicas on the next upgrade get their
// certificates; those already issued, and the CA, stay.
func TestScaleUpIssuesOnlyTheNew(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset()
	sync(t, c, plan(3, 2))
	ca := string(get(t, c, "prism-ca").Data[KeyCAKey])
	runners := get(t, c, "prism-runner-tls").Data

	p := plan(3, 4)
	res := sync(t, c, p)
	slices.Sort(res.Issued)
	if want := []string{"prism-runner-tls/prism-runner-2", "prism-runner-tls/prism-runner-3"}; res.CACreated || !slices.Equal(res.Issued, want) {
		t.Fatalf("scale-up: %+v, want only %v issued", res, want)
	}
	if string(get(t, c, "prism-ca").Data[KeyCAKey]) != ca {
		t.Fatal("the CA changed")
	}
	after := get(t, c, "prism-runner-tls").Data
	for _, k := range []string{"prism-runner-0.crt", "prism-runner-0.key", "prism-runner-1.crt", "prism-runner-1.key"} {
		if string(after[k]) != string(runners[k]) {
			t.Errorf("scale-up reissued %s", k)
		}
	}
	checkSecrets(t, c, p)
}

// TestReissues: a certificate with a third or less of its validity left,
// another identity, from another CA, or without its key is issued again;
// the others in the same Secret stay.
func TestReissues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		damage func(t *testing.T, ca *pki.CA, data map[string][]byte)
	}{
		{"expiring", func(t *testing.T, ca *pki.CA, data map[string][]byte) {
			now := time.Now()
			// 100 days of validity, 30 left.
			data["prism-admin-1.crt"], data["prism-admin-1.key"] = issue(t, ca, pki.Request{Role: identity.Admin, Name: "prism-admin-1",
				NotBefore: now.Add(-70 * 24 * time.Hour), NotAfter: now.Add(30 * 24 * time.Hour)})
		}},
		{"expired", func(t *testing.T, ca *pki.CA, data map[string][]byte) {
			now := time.Now()
			data["prism-admin-1.crt"], data["prism-admin-1.key"] = issue(t, ca, pki.Request{Role: identity.Admin, Name: "prism-admin-1",
				NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})
		}},
		{"wrong identity", func(t *testing.T, ca *pki.CA, data map[string][]byte) {
			data["prism-admin-1.crt"], data["prism-admin-1.key"] = issue(t, ca, pki.Request{Role: identity.Proxy, Name: "prism-admin-1"})
		}},
		{"another CA", func(t *testing.T, _ *pki.CA, data map[string][]byte) {
			other, err := pki.NewCA(td, time.Hour*24*365)
			if err != nil {
				t.Fatal(err)
			}
			data["prism-admin-1.crt"], data["prism-admin-1.key"] = issue(t, other, pki.Request{Role: identity.Admin, Name: "prism-admin-1"})
		}},
		{"key lost", func(t *testing.T, _ *pki.CA, data map[string][]byte) {
			delete(data, "prism-admin-1.key")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset()
			p := plan(3, 1)
			sync(t, c, p)
			caSecret := get(t, c, "prism-ca")
			ca, err := parseCA(td, caSecret.Data[KeyCA], caSecret.Data[KeyCAKey])
			if err != nil {
				t.Fatal(err)
			}
			s := get(t, c, "prism-admin-tls")
			tc.damage(t, ca, s.Data)
			if _, err := c.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			kept := string(s.Data["prism-admin-0.crt"])

			res := sync(t, c, p)
			if want := []string{"prism-admin-tls/prism-admin-1"}; !slices.Equal(res.Issued, want) || res.CACreated {
				t.Fatalf("%+v, want %v issued", res, want)
			}
			if string(get(t, c, "prism-admin-tls").Data["prism-admin-0.crt"]) != kept {
				t.Error("a current certificate was reissued")
			}
			checkSecrets(t, c, p)
		})
	}
}

func issue(t *testing.T, ca *pki.CA, r pki.Request) (cert, key []byte) {
	t.Helper()
	cert, key, err := ca.Issue(r)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestCAKeptAndSecretsRepaired: the CA made on the first run is the one
// every later run signs with, and a Secret deleted in between is made
// again from it.
func TestCAKeptAndSecretsRepaired(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset()
	p := plan(1, 1)
	sync(t, c, p)
	ca := get(t, c, "prism-ca").Data
	if err := c.CoreV1().Secrets(ns).Delete(context.Background(), "prism-gateway-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	res := sync(t, c, p)
	if res.CACreated || !slices.Equal(res.Issued, []string{"prism-gateway-tls/tls"}) {
		t.Fatalf("%+v", res)
	}
	if got := get(t, c, "prism-ca").Data; string(got[KeyCA]) != string(ca[KeyCA]) || string(got[KeyCAKey]) != string(ca[KeyCAKey]) {
		t.Fatal("the CA changed")
	}
	checkSecrets(t, c, p)
}

// TestRefuses: Secrets it did not make, an expired CA and API errors stop
// the run with the Secret named.
func TestRefuses(t *testing.T) {
	t.Parallel()
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "prism-admin-tls", Namespace: ns}, Data: map[string][]byte{"x": []byte("y")}}
	foreignCA := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "prism-ca", Namespace: ns}, Type: corev1.SecretTypeTLS}
	tests := []struct {
		name    string
		objects []*corev1.Secret
		setup   func(c *fake.Clientset)
		now     time.Time
		want    string
	}{
		{name: "a user's Secret", objects: []*corev1.Secret{foreign}, want: "prism-admin-tls exists and was not made by prism certs"},
		{name: "cert-manager's CA", objects: []*corev1.Secret{foreignCA}, want: "prism-ca exists and was not made by prism certs"},
		{name: "an expired CA", now: time.Now().Add(11 * 365 * 24 * time.Hour), want: "the CA expired"},
		{name: "forbidden", setup: func(c *fake.Clientset) {
			c.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, fmt.Errorf("secrets is forbidden")
			})
		}, now: time.Now().Add(300 * 24 * time.Hour), want: "write Secret mesh/prism-admin-tls: secrets is forbidden"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset()
			for _, o := range tc.objects {
				if _, err := c.CoreV1().Secrets(ns).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			p := plan(1, 1)
			if !tc.now.IsZero() {
				sync(t, c, p)
				p.Now = func() time.Time { return tc.now }
			}
			if tc.setup != nil {
				tc.setup(c)
			}
			_, err := Sync(context.Background(), c.CoreV1().Secrets(p.Namespace), p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if len(tc.objects) > 0 && len(get(t, c, tc.objects[0].Name).Data) != len(tc.objects[0].Data) {
				t.Error("the foreign Secret was changed")
			}
		})
	}
}
