package chart

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/testkit/podproc"
)

// apiServer stands in for the part of the Kubernetes API the chart's hook Job uses (`prism certs
// kube-secrets`: get, create and update the release namespace's Secrets), over TLS on the bridge's address
// with a service account token, answering as the API server does (a Status body on errors).
type apiServer struct {
	addr, token string
	caPEM       []byte

	mu      sync.Mutex
	secrets map[string]corev1.Secret
}

// startAPIServer serves the stand-in until the test ends.
func (c *cluster) startAPIServer() *apiServer {
	c.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(c.t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IP(c.net.Gateway.AsSlice())}, DNSNames: []string{"kubernetes.default.svc"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	must(c.t, err)
	ln, err := net.Listen("tcp", net.JoinHostPort(c.net.Gateway.String(), "0"))
	must(c.t, err)
	a := &apiServer{addr: ln.Addr().String(), token: "chart-test-token", secrets: map[string]corev1.Secret{},
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second, TLSConfig: &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	c.t.Cleanup(func() { _ = srv.Close() })
	return a
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+a.token {
		a.status(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "no valid service account token")
		return
	}
	prefix := "/api/v1/namespaces/" + namespace + "/secrets"
	if !strings.HasPrefix(r.URL.Path, prefix) {
		a.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the stand-in serves "+prefix+" only")
		return
	}
	name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, prefix), "/")
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		s, ok := a.secrets[name]
		if !ok {
			a.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("secrets %q not found", name))
			return
		}
		a.write(w, http.StatusOK, s)
	case http.MethodPost, http.MethodPut:
		var s corev1.Secret
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
			a.status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		_, exists := a.secrets[s.Name]
		switch {
		case r.Method == http.MethodPost && exists:
			a.status(w, http.StatusConflict, metav1.StatusReasonAlreadyExists, fmt.Sprintf("secrets %q already exists", s.Name))
			return
		case r.Method == http.MethodPut && (!exists || s.Name != name):
			a.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("secrets %q not found", name))
			return
		}
		s.Namespace = namespace
		a.secrets[s.Name] = s
		code := http.StatusOK
		if r.Method == http.MethodPost {
			code = http.StatusCreated
		}
		a.write(w, code, s)
	default:
		a.status(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, r.Method)
	}
}

func (a *apiServer) write(w http.ResponseWriter, code int, s corev1.Secret) {
	s.APIVersion, s.Kind = "v1", "Secret"
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(s)
}

func (a *apiServer) status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

// runHookJobs runs the release's pre-install hook Jobs as the API server and the kubelet would before the
// release's other objects: each Job's pod with its service account's token mounted and
// KUBERNETES_SERVICE_HOST/PORT pointing at the stand-in, to completion; then the Secrets they wrote become
// the ones pods mount.
func (c *cluster) runHookJobs(r *chartrender.Objects) {
	c.t.Helper()
	api := c.startAPIServer()
	host, port, _ := net.SplitHostPort(api.addr)
	sa := filepath.Join(c.dir, "serviceaccount")
	must(c.t, os.MkdirAll(sa, 0o755))
	for name, data := range map[string][]byte{"token": []byte(api.token), "ca.crt": api.caPEM, "namespace": []byte(namespace)} {
		c.writeFile(filepath.Join(sa, name), data, 0o644, -1)
	}
	for _, name := range sortedKeys(r.Jobs) {
		j := r.Jobs[name]
		if !strings.Contains(j.Annotations["helm.sh/hook"], "pre-install") {
			continue
		}
		p := &pod{name: name + "-x7k2p", workload: name, labels: j.Spec.Template.Labels, spec: *j.Spec.Template.Spec.DeepCopy()}
		p.net = c.net.NewPod(p.name)
		c.materialize(p)
		for _, ctr := range p.spec.Containers {
			ctr.Env = append([]corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: host}, {Name: "KUBERNETES_SERVICE_PORT", Value: port}}, ctr.Env...)
			spec := c.containerSpec(p, ctr)
			spec.Hosts = "" // it dials the API server by address, before any pod has one
			if p.spec.AutomountServiceAccountToken == nil || *p.spec.AutomountServiceAccountToken {
				spec.Mounts = append(spec.Mounts, podproc.Mount{Source: sa, Target: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true})
			}
			cmd, err := p.net.Command(spec)
			must(c.t, err)
			out, err := cmd.CombinedOutput()
			if err != nil {
				c.t.Fatalf("hook Job %s container %s: %v\n%s", name, ctr.Name, err, out)
			}
			c.t.Logf("hook Job %s: %s", name, strings.TrimSpace(lastLine(string(out))))
		}
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	for name, s := range api.secrets {
		c.secrets[name] = s.Data
	}
	c.t.Logf("the hook Jobs wrote %d Secrets", len(api.secrets))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
