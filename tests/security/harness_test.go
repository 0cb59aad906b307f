// Package security runs a whole mesh over mutual TLS as real processes on loopback (three `prism admin`
// nodes, `prism runner` with `prism sidecar`, `prism gateway` with query tokens, all started by
// testkit/e2e) and knocks on every door with the wrong credentials: no TLS, no client certificate, a
// certificate of another CA, an expired one, and a valid certificate of an identity the door does not
// serve. Each must be refused, and the state read back afterwards must be what it was. A second test
// rotates every certificate and then the CA under a running mesh without losing a lease.
package security

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

const (
	proxyID   = "proxy-1"
	namespace = "audit"
	topic     = "audit.events"
	mailboxID = namespace + "@" + proxyID
)

var lease = e2e.Lease{TTL: 3 * time.Second, Grace: 2 * time.Second, Heartbeat: 500 * time.Millisecond}

// credential is one way a stranger may present itself.
type credential struct {
	name string
	// tls is nil for plaintext.
	tls *tls.Config
	// wrongIdentity marks a valid certificate of the mesh's CA whose identity the door does not serve: the
	// door may let the handshake through and refuse the call.
	wrongIdentity bool
}

// strangers are the credentials every door must refuse: no TLS, TLS without a client certificate, a
// certificate of another CA (with the identity the door would accept), and an expired certificate of the
// mesh's CA.
func strangers(t *testing.T, good identity.Identity) []credential {
	t.Helper()
	other, err := e2e.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shared, err := e2e.Shared()
	if err != nil {
		t.Fatal(err)
	}
	ef, err := shared.CA().IssueFiles(t.TempDir(), pki.Request{Role: good.Role, Name: good.Name,
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return []credential{
		{name: "plaintext"},
		{name: "no client certificate", tls: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}, //nolint:gosec // a stranger does not check the server
		{name: "certificate of another CA", tls: e2e.ClientTLS(t, other, good.Role, good.Name)},
		{name: "expired certificate", tls: pkitest.Presented(t, ef)},
	}
}

// wrong is a valid certificate of the mesh for role/name.
func wrong(t *testing.T, role identity.Role, name string) credential {
	t.Helper()
	return credential{name: fmt.Sprintf("valid %s/%s", role, name), tls: e2e.ClientTLS(t, nil, role, name), wrongIdentity: true}
}

func (c credential) dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func (c credential) http() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = c.tls
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// mesh is one of everything over mTLS, with a mailbox served under a lease.
type mesh struct {
	admins  *e2e.AdminCluster
	runner  *e2e.Runner
	sidecar *e2e.Sidecar
	gateway *e2e.Gateway
}

// state is what a refused call must not change.
type state struct {
	namespaces []string
	leases     []string // mailbox holder epoch address
	members    []string
	terms      []uint64
}

func (m *mesh) state(t *testing.T) state {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s state
	lin := adminv1.Consistency_CONSISTENCY_LINEARIZABLE
	n := e2e.Leader(m.admins.Nodes...)
	if n == nil {
		t.Fatal("no leader")
	}
	ns, err := n.Admin().ListNamespaces(ctx, &adminv1.ListNamespacesRequest{Consistency: lin})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ns.GetNamespaces() {
		s.namespaces = append(s.namespaces, x.GetName())
	}
	ls, err := n.Admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: lin})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls.GetLeases() {
		s.leases = append(s.leases, fmt.Sprint(l.GetMailboxId(), " ", l.GetRunnerId(), " ", l.GetEpoch(), " ", l.GetRunnerAddress()))
	}
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, mb := range st.GetMembers() {
		s.members = append(s.members, mb.GetId())
	}
	for _, node := range m.admins.Nodes {
		st, err := node.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.terms = append(s.terms, st.GetTerm())
	}
	slices.Sort(s.namespaces)
	slices.Sort(s.leases)
	slices.Sort(s.members)
	return s
}

// queryStats is the mailbox's stats through the gateway with token, and the epoch it was served under.
func (m *mesh) queryStats(token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, m.gateway.HTTPURL()+"/v1/mailboxes/"+mailboxID+"/stats", nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var body struct {
		Error string `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Error, nil
}

// startMesh starts the mesh and waits until the gateway serves the mailbox with a token for its namespace.
func startMesh(t *testing.T, brokers []string, gatewayArgs []string, token string) *mesh {
	t.Helper()
	m := &mesh{admins: e2e.StartAdmins(t, e2e.AdminOptions{Size: 3})}
	m.admins.CreateNamespace(60*time.Second, namespace, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
	m.runner = e2e.StartRunner(t, e2e.RunnerOptions{ProxyID: proxyID, Brokers: brokers, Args: []string{"--batch-wait", "20ms", "--log-format", "json"}})
	m.sidecar = e2e.StartSidecar(t, e2e.SidecarOptions{ProxyID: proxyID, RunnerID: "runner-1", Runner: m.runner, Admins: m.admins.GRPCAddrs(), Lease: lease})
	testwait.For(t, 60*time.Second, "sidecar ready", m.sidecar.Ready)
	m.gateway = e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gw-1", Admins: m.admins.GRPCAddrs(), Timeout: 3 * time.Second, Args: gatewayArgs})
	testwait.For(t, 60*time.Second, "the mailbox through the gateway", func() (bool, string) {
		code, msg, err := m.queryStats(token)
		return err == nil && code == http.StatusOK, fmt.Sprint(code, " ", msg, " ", err)
	})
	return m
}

func jwksArgs(dir string) []string {
	return []string{"--jwks-file", filepath.Join(dir, "jwks.json"), "--jwt-issuer", "https://issuer.test", "--jwt-audience", "prism"}
}

// diff names what differs between two states, or "".
func diff(before, after state) string {
	var out []string
	if !slices.Equal(before.namespaces, after.namespaces) {
		out = append(out, fmt.Sprintf("namespaces %v -> %v", before.namespaces, after.namespaces))
	}
	if !slices.Equal(before.leases, after.leases) {
		out = append(out, fmt.Sprintf("leases %v -> %v", before.leases, after.leases))
	}
	if !slices.Equal(before.members, after.members) {
		out = append(out, fmt.Sprintf("members %v -> %v", before.members, after.members))
	}
	// An election on a loaded machine raises a term by one or two; a refused RequestVote or
	// AppendEntries of a stranger at term+100 would raise it far more.
	for i := range min(len(before.terms), len(after.terms)) {
		if after.terms[i] > before.terms[i]+5 {
			out = append(out, fmt.Sprintf("terms %v -> %v", before.terms, after.terms))
			break
		}
	}
	return strings.Join(out, "; ")
}
