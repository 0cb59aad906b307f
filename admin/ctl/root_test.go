package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/admin/server"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/testkit/testproc"
)

// testAdmin is an in-memory single-node admin over mTLS and the CA that
// issued its certificate, for the CLI to talk to.
type testAdmin struct {
	addr string
	pki  *pkitest.PKI
}

// as are the flags that make prismctl call the admin as role/name.
func (a testAdmin) as(role identity.Role, name string) []string {
	f := a.pki.Files(role, name)
	return []string{"--admin", a.addr, "--cacert", f.CA, "--cert", f.Cert, "--key", f.Key}
}

// dial connects to the admin as role/name over mTLS, closed when the test ends.
func (a testAdmin) dial(t *testing.T, role identity.Role, name string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(a.pki.Source(role, name).ClientConfig(pki.RoleIs(identity.Admin)))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// testServerVersion is the build the test admin reports.
const testServerVersion = "v0.0.0-test"

func startAdmin(t *testing.T) testAdmin {
	t.Helper()
	p := pkitest.New(t)
	n, err := server.Start(server.NodeConfig{
		Raft:     raftnode.Config{ID: "solo", Bootstrap: true, Timing: raftnode.FastTiming()},
		GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TLS: p.Source(identity.Admin, "solo"), Version: testServerVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Stop(ctx)
	})
	return testAdmin{addr: n.GRPCAddr(), pki: p}
}

func prismctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := rootCommand("dev")
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCommandsAgainstAdmin(t *testing.T) {
	t.Parallel()
	// The first endpoint is dead: the client must move on to the next one,
	// and retry while the fresh node has no leader yet.
	a := startAdmin(t)
	g := append(a.as(identity.Operator, "ops"), "--admin", testproc.FreeAddr(t)+","+a.addr, "--attempt-timeout", "1s", "--timeout", "20s")
	run := func(args ...string) string {
		t.Helper()
		out, err := prismctl(t, append(g, args...)...)
		if err != nil {
			t.Fatalf("prismctl %v: %v\n%s", args, err, out)
		}
		return out
	}
	if out := run("namespace", "create", "audit-logs", "--topic", "audit.events", "--lease-ttl", "20s", "--validation", "warn"); !strings.Contains(out, "audit-logs") {
		t.Fatalf("create:\n%s", out)
	}
	if out := run("namespace", "create", "audit-logs", "--topic", "audit.events", "--lease-ttl", "20s", "--validation", "warn"); !strings.Contains(out, "already existed") {
		t.Fatalf("create again:\n%s", out)
	}
	var list struct {
		Namespaces []struct {
			Name   string `json:"name"`
			Config struct {
				Topics         []string `json:"topics"`
				ValidationMode string   `json:"validation_mode"`
				Lease          struct {
					TTL string `json:"ttl"`
				} `json:"lease"`
			} `json:"config"`
		} `json:"namespaces"`
	}
	if err := json.Unmarshal([]byte(run("namespace", "list", "--format", "json", "--consistent")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Namespaces) != 1 || list.Namespaces[0].Config.Lease.TTL != "20s" || list.Namespaces[0].Config.ValidationMode != "VALIDATION_MODE_WARN" {
		t.Fatalf("namespace list json: %+v", list)
	}
	if out := run("cluster", "status"); !strings.Contains(out, "solo (Leader)") || !strings.Contains(out, "namespaces/proxies/leases  1/0/0") {
		t.Fatalf("cluster status:\n%s", out)
	}
	for _, args := range [][]string{{"proxy", "list"}, {"lease", "list", "--namespace", "audit-logs"}, {"route", "list"}} {
		if out := run(args...); !strings.Contains(out, "ADDRESS") {
			t.Fatalf("%v:\n%s", args, out)
		}
	}
	if out := run("namespace", "delete", "audit-logs"); !strings.Contains(out, "deleted audit-logs") {
		t.Fatalf("delete:\n%s", out)
	}
	if out := run("namespace", "delete", "audit-logs"); !strings.Contains(out, "no namespace audit-logs") {
		t.Fatalf("delete again:\n%s", out)
	}
}

func TestErrorsAreClear(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := a.as(identity.Operator, "ops")
	reader := a.as(identity.Reader, "dash")
	other := pkitest.New(t).Files(identity.Operator, "ops")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"namespace", "get", "missing"}, `NotFound: namespace "missing" not found`},
		{[]string{"namespace", "create", "x"}, "InvalidArgument"},
		{[]string{"namespace", "create", "x", "--topic", "t", "--validation", "loose"}, "--validation"},
		{[]string{"--format", "xml", "cluster", "status"}, "--output"},
		{[]string{"-o", "xml", "cluster", "status"}, "--output"},
		{[]string{"member", "add", "n2", "nowhere", "127.0.0.1:1"}, "InvalidArgument"},
		{[]string{"member", "add", "n2", "127.0.0.1:1", "nowhere"}, "grpc_address"},
		{[]string{"--admin", " , ", "cluster", "status"}, "no admin endpoints"},
		{[]string{"--admin", testproc.FreeAddr(t), "--timeout", "1s", "--attempt-timeout", "200ms", "cluster", "status"}, "Unavailable: no admin node could answer"},
		{append(slices.Clone(reader), "namespace", "create", "x", "--topic", "t"), "PermissionDenied"},
		{append(slices.Clone(reader), "member", "remove", "solo"), "PermissionDenied"},
		{[]string{"--admin", a.addr, "--cacert", other.CA, "--cert", other.Cert, "--key", other.Key, "--timeout", "1s", "--attempt-timeout", "300ms", "cluster", "status"}, "Unavailable"},
		{[]string{"--admin", a.addr, "--insecure", "--timeout", "1s", "--attempt-timeout", "300ms", "cluster", "status"}, "Unavailable"},
		{append(slices.Clone(op), "--insecure", "cluster", "status"), "exclude each other"},
	}
	for _, tc := range cases {
		args := tc.args
		if !slices.Contains(args, "--cacert") && !slices.Contains(args, "--insecure") {
			args = append(slices.Clone(op), args...)
		}
		out, err := prismctl(t, args...)
		if err == nil {
			t.Fatalf("%v succeeded:\n%s", tc.args, out)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %q does not contain %q", tc.args, err, tc.want)
		}
	}
}

// A command line prismctl cannot run is a usage error, exit 2, whatever part
// of it is wrong; an unreachable cluster is exit 4 (more in
// TestExitCodesByAnswer); naming a group of commands alone shows its help
// and succeeds.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	dead := []string{"--admin", testproc.FreeAddr(t), "--insecure", "--timeout", "500ms", "--attempt-timeout", "200ms"}
	cases := []struct {
		args []string
		code int
		want string // in what prismctl prints
	}{
		{[]string{"lease", "get", "x"}, 2, `unknown command "get" for "prismctl lease"`},
		{[]string{"bogus"}, 2, `unknown command "bogus" for "prismctl"`},
		{[]string{"namespace", "get"}, 2, "accepts 1 arg(s), received 0"},
		{[]string{"member", "add", "n2"}, 2, "Run 'prismctl member add --help' for usage."},
		{[]string{"cluster", "status", "extra"}, 2, `unknown command "extra"`},
		{[]string{"lease", "list", "--no-such-flag"}, 2, "unknown flag: --no-such-flag"},
		{[]string{"--timeout", "soon", "lease", "list"}, 2, "--timeout"},
		{append(dead, "cluster", "status"), 4, "Unavailable"},
		{[]string{"lease"}, 0, "Mailbox leases"},
		{[]string{}, 0, "Administer a Prism"},
	}
	for _, tc := range cases {
		out, err := prismctl(t, tc.args...)
		var stderr bytes.Buffer
		code := exit(err, &stderr)
		if code != tc.code || !strings.Contains(out+stderr.String(), tc.want) {
			t.Errorf("prismctl %v: exit %d, printed\n%s%s\nwant exit %d and %q", tc.args, code, out, stderr.String(), tc.code, tc.want)
		}
	}
}

// TestIdentityDiscovery: without flags prismctl takes its identity and
// endpoints from the config file prism dev writes, and without any it
// refuses to talk plaintext.
func TestIdentityDiscovery(t *testing.T) {
	a := startAdmin(t)
	f := a.pki.Files(identity.Operator, "dev")
	path := filepath.Join(t.TempDir(), "prismctl.yaml")
	t.Setenv(client.EnvConfig, path)
	for _, env := range []string{"PRISM_ADMIN", envCACert, envCert, envKey, envInsecure} {
		t.Setenv(env, "")
	}
	if _, err := prismctl(t, "cluster", "status"); err == nil || !strings.Contains(err.Error(), "TLS is required") {
		t.Fatalf("no identity anywhere: %v; want a refusal to go plaintext", err)
	}
	if err := client.WriteConfig(path, client.FileConfig{Admin: a.addr, CACert: f.CA, Cert: f.Cert, Key: f.Key}); err != nil {
		t.Fatal(err)
	}
	out, err := prismctl(t, "--timeout", "20s", "cluster", "status")
	if err != nil || !strings.Contains(out, "node                       solo (") {
		t.Fatalf("with the config file: %v\n%s", err, out)
	}
}
