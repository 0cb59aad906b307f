package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// apiServer is the part of the Kubernetes API NewSecrets uses: one
// namespace's Secrets, answering as the API server does (a Status body on
// errors), recording each request as "METHOD path".
type apiServer struct {
	mu       gosync.Mutex
	secrets  map[string]corev1.Secret
	requests []string
	// forbid refuses writes with 403.
	forbid bool
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, r.Method+" "+r.URL.Path)
	prefix := "/api/v1/namespaces/" + ns + "/secrets"
	name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, prefix), "/")
	if !strings.HasPrefix(r.URL.Path, prefix) {
		a.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path")
		return
	}
	switch r.Method {
	case http.MethodGet:
		s, ok := a.secrets[name]
		if !ok {
			a.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("secrets %q not found", name))
			return
		}
		a.write(w, http.StatusOK, s)
	case http.MethodPost, http.MethodPut:
		if a.forbid {
			a.status(w, http.StatusForbidden, metav1.StatusReasonForbidden, "secrets is forbidden")
			return
		}
		var s corev1.Secret
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
			a.status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		_, exists := a.secrets[s.Name]
		if r.Method == http.MethodPost && exists {
			a.status(w, http.StatusConflict, metav1.StatusReasonAlreadyExists, "exists")
			return
		}
		if r.Method == http.MethodPut && (!exists || name != s.Name) {
			a.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "not found")
			return
		}
		a.secrets[s.Name] = s
		a.write(w, http.StatusOK, s)
	default:
		a.status(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, r.Method)
	}
}

func (a *apiServer) write(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *apiServer) status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	a.write(w, code, metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
}

func (a *apiServer) took() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.requests
	a.requests = nil
	return out
}

// TestNewSecretsAgainstAnAPIServer: Sync over the REST client reads,
// creates and updates Secrets at the API's paths, a missing Secret is
// NotFound (so the CA is made once), a second run only reads, and the API
// server's refusal reaches the caller.
func TestNewSecretsAgainstAnAPIServer(t *testing.T) {
	t.Parallel()
	api := &apiServer{secrets: map[string]corev1.Secret{}}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	secrets, err := NewSecrets(&rest.Config{Host: srv.URL}, ns)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := secrets.Get(ctx, "nope", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a missing Secret: %v, want NotFound", err)
	}
	api.took()

	p := plan(2, 1)
	res, err := Sync(ctx, secrets, p)
	if err != nil {
		t.Fatal(err)
	}
	if !res.CACreated || len(res.Issued) != 2+1+1+1 {
		t.Fatalf("first run: %+v", res)
	}
	base := "/api/v1/namespaces/" + ns + "/secrets"
	wantFirst := []string{"GET " + base + "/prism-ca", "POST " + base}
	for _, name := range []string{"prism-admin-tls", "prism-runner-tls", "prism-gateway-tls", "prism-operator-tls"} {
		wantFirst = append(wantFirst, "GET "+base+"/"+name, "POST "+base)
	}
	if got := api.took(); strings.Join(got, "\n") != strings.Join(wantFirst, "\n") {
		t.Fatalf("first run requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantFirst, "\n"))
	}
	for _, name := range []string{"prism-ca", "prism-admin-tls", "prism-runner-tls", "prism-gateway-tls", "prism-operator-tls"} {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Labels[LabelKey] != LabelSelf || len(s.Data[KeyCA]) == 0 {
			t.Errorf("Secret %s as read back: labels %v, keys %d", name, s.Labels, len(s.Data))
		}
	}
	api.took()

	res, err = Sync(ctx, secrets, p)
	if err != nil || res.CACreated || len(res.Issued) != 0 || res.Kept != 5 {
		t.Fatalf("second run: %+v, %v; want nothing issued and 5 kept", res, err)
	}
	for _, r := range api.took() {
		if !strings.HasPrefix(r, "GET ") {
			t.Errorf("second run wrote: %s", r)
		}
	}

	api.mu.Lock()
	delete(api.secrets["prism-runner-tls"].Data, "prism-runner-0"+CertExt)
	api.mu.Unlock()
	res, err = Sync(ctx, secrets, p)
	if err != nil || len(res.Issued) != 1 {
		t.Fatalf("run after a lost certificate: %+v, %v; want it issued again", res, err)
	}
	var puts []string
	for _, r := range api.took() {
		if !strings.HasPrefix(r, "GET ") {
			puts = append(puts, r)
		}
	}
	if want := "PUT " + base + "/prism-runner-tls"; len(puts) != 1 || puts[0] != want {
		t.Fatalf("run after a lost certificate wrote %v, want %s", puts, want)
	}

	p.Secrets = append(p.Secrets, Secret{Name: "prism-extra-tls", Identities: []Identity{{Role: "gateway", Name: "extra", File: FileTLS}}})
	api.mu.Lock()
	api.forbid = true
	api.mu.Unlock()
	_, err = Sync(ctx, secrets, p)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "write Secret mesh/prism-extra-tls") {
		t.Fatalf("a refused write: %v, want Forbidden naming the Secret", err)
	}
}
