package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/admin/server"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// startMovingAdmin is startAdmin with a quick mover and a short handoff
// tail, so moves finish within a test.
func startMovingAdmin(t *testing.T) testAdmin {
	t.Helper()
	p := pkitest.New(t)
	n, err := server.Start(server.NodeConfig{
		Raft:     raftnode.Config{ID: "solo", Bootstrap: true, Timing: raftnode.FastTiming()},
		GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TLS:   p.Source(identity.Admin, "solo"),
		Moves: server.MoveConfig{Interval: 50 * time.Millisecond, HandoffTail: 200 * time.Millisecond},
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

// fakeSidecar plays proxy id's sidecar for namespace ns as far as the
// admin can tell: registered, acquiring its mailbox whenever the admin
// lets it, and reporting it caught up.
func fakeSidecar(t *testing.T, ctx context.Context, a testAdmin, id, ns string) {
	t.Helper()
	cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		a.pki.Source(identity.Proxy, id).ClientConfig(pki.RoleIs(identity.Admin)))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cp := adminv1.NewControlPlaneClient(cc)
	if _, err := cp.RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: id, Address: "127.0.0.1:9000"}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for ctx.Err() == nil {
			_, _ = cp.AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: ns + "@" + id, RunnerId: id, RunnerAddress: "127.0.0.1:9001"})
			_, _ = cp.ProxyHeartbeat(ctx, &adminv1.ProxyHeartbeatRequest{ProxyId: id, NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: ns, LagKnown: true}}})
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
}

// ns is a namespace hashing places on p1 when p1 and p2 are live.
var ns = func() string {
	table := placement.Compute([]string{"p1", "p2"})
	for i := 0; ; i++ {
		if name := fmt.Sprintf("ns-%d", i); table.Owner(placement.Partition(name)) == "p1" {
			return name
		}
	}
}()

// A namespace moved by hand with --wait reports its catch-up and its
// switch; a drain with --wait moves it off and returns once the proxy
// serves nothing; move list shows the moves and refusals say why.
func TestMoveCommands(t *testing.T) {
	t.Parallel()
	a := startMovingAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	reader := a.as(identity.Reader, "dash")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		out, err := prismctl(t, append(slices.Clone(op), args...)...)
		if err != nil {
			t.Fatalf("prismctl %v: %v\n%s", args, err, out)
		}
		return out
	}
	// Hashing places ns on p1 with p2 live too, so only the test moves it.
	fakeSidecar(t, ctx, a, "p1", ns)
	run("namespace", "create", ns, "--topic", "audit.events")
	fakeSidecar(t, ctx, a, "p2", ns)

	var stderr bytes.Buffer
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{append(slices.Clone(op), "namespace", "move", ns), 2, "--to PROXY (or --cancel) is required"},
		{append(slices.Clone(op), "namespace", "move", ns, "--to", "p2", "--cancel"), 2, "--cancel takes neither"},
		{append(slices.Clone(op), "namespace", "move", "nope", "--to", "p2"), exitNotFound, `NotFound: namespace "nope" not found`},
		{append(slices.Clone(op), "namespace", "move", ns, "--to", "p9"), exitNotFound, `NotFound: proxy "p9" not found`},
		{append(slices.Clone(op), "namespace", "move", ns, "--to", "p1"), exitRefused, "FailedPrecondition: cannot move " + ns + ": namespace " + ns + " is already on p1"},
		{append(slices.Clone(op), "namespace", "move", ns, "--cancel"), exitRefused, "FailedPrecondition: cannot cancel the move of " + ns + ": namespace " + ns + " has no move in progress"},
		{append(slices.Clone(op), "proxy", "drain", "p9"), exitNotFound, "NotFound"},
		{append(slices.Clone(reader), "namespace", "move", ns, "--to", "p2"), exitDenied, "PermissionDenied"},
		{append(slices.Clone(reader), "proxy", "drain", "p1"), exitDenied, "PermissionDenied"},
	} {
		out, err := prismctl(t, tc.args...)
		stderr.Reset()
		if code := exit(err, &stderr); code != tc.code || !strings.Contains(out+stderr.String(), tc.want) {
			t.Errorf("prismctl %v: exit %d, printed\n%s%s\nwant exit %d and %q", tc.args, code, out, stderr.String(), tc.code, tc.want)
		}
	}

	out := run("namespace", "move", ns, "--to", "p2", "--wait", "--interval", "50ms")
	for _, want := range []string{"moving " + ns + " from p1 to p2", ns + " catching up on p2", ns + " switched to p2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("namespace move --wait printed\n%s\nwant %q", out, want)
		}
	}
	var moves struct {
		Moves []struct {
			Namespace, FromProxyID, ToProxyID, State, Reason string
		} `json:"moves"`
	}
	if err := json.Unmarshal([]byte(run("move", "list", "--format", "json")), &moves); err != nil {
		t.Fatal(err)
	}
	// The tail is 200ms; the move may already be over.
	if len(moves.Moves) > 1 || len(moves.Moves) == 1 && (moves.Moves[0].State != "MOVE_STATE_HANDING_OFF" || moves.Moves[0].Reason != "MOVE_REASON_OPERATOR") {
		t.Fatalf("move list after the switch: %+v", moves)
	}
	if out, err := prismctl(t, append(slices.Clone(reader), "move", "list")...); err != nil || !strings.Contains(out, "NAMESPACE") {
		t.Fatalf("a reader lists moves: %v\n%s", err, out)
	}

	out = run("proxy", "drain", "p2", "--wait", "--interval", "50ms")
	for _, want := range []string{"cordoned p2", "p2 drained: it serves no namespace"} {
		if !strings.Contains(out, want) {
			t.Fatalf("proxy drain --wait printed\n%s\nwant %q", out, want)
		}
	}
	if out := run("proxy", "list"); !strings.Contains(out, "LIVE,cordoned") {
		t.Fatalf("proxy list after the drain:\n%s", out)
	}
	if out := run("namespace", "get", ns); !strings.Contains(out, "p1") {
		t.Fatalf("%s after p2's drain:\n%s", ns, out)
	}
	if out := run("proxy", "drain", "p2"); !strings.Contains(out, "p2 was already cordoned") {
		t.Fatalf("drain again:\n%s", out)
	}
	if out := run("proxy", "uncordon", "p2"); !strings.Contains(out, "uncordoned p2") {
		t.Fatalf("uncordon:\n%s", out)
	}
	out = run("move", "list", "-w", "--interval", "50ms", "--timeout", "500ms")
	if !strings.Contains(out, "NAMESPACE") {
		t.Fatalf("move list -w printed\n%s", out)
	}
}

// A move the destination never catches up on can be cancelled; --wait on
// it then says the move ended without a switch.
func TestMoveWaitSeesACancel(t *testing.T) {
	t.Parallel()
	a := startMovingAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fakeSidecar(t, ctx, a, "p1", ns)
	if out, err := prismctl(t, append(slices.Clone(op), "namespace", "create", ns, "--topic", "t")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// p2 registers but never acquires nor reports: the move cannot switch.
	cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		a.pki.Source(identity.Proxy, "p2").ClientConfig(pki.RoleIs(identity.Admin)))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := adminv1.NewControlPlaneClient(cc).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p2", Address: "127.0.0.1:9000"}}); err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		out    string
		waitEr error
	)
	wg.Go(func() {
		out, waitEr = prismctl(t, append(slices.Clone(op), "namespace", "move", ns, "--to", "p2", "--wait", "--interval", "50ms")...)
	})
	cancelled := false
	for deadline := time.Now().Add(10 * time.Second); !cancelled && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, err := prismctl(t, append(slices.Clone(op), "namespace", "move", ns, "--cancel")...)
		cancelled = err == nil
	}
	wg.Wait()
	if !cancelled {
		t.Fatal("the move was never there to cancel")
	}
	if waitEr == nil || !strings.Contains(waitEr.Error(), "ended without a switch") || !strings.Contains(waitEr.Error(), "serves it on p1") {
		t.Fatalf("--wait after a cancel: %v\n%s", waitEr, out)
	}
}
