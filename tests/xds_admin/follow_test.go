// Package xdsadmin drives the xDS control plane from the real admin FSM, as
// an admin node does (log entries applied directly, without Raft): proxies
// registered, moved and gone stale through FSM commands route grpc-go's
// queries to their runners, while lease changes send nothing and the
// runners answer only for what they hold.
package xdsadmin

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/ir"
)

type log struct {
	t     *testing.T
	f     *fsm.FSM
	index uint64
	now   time.Time
}

func (l *log) apply(cmd *adminv1.Command) {
	l.t.Helper()
	l.index++
	l.now = l.now.Add(time.Second)
	cmd.Now = timestamppb.New(l.now)
	data, err := fsm.Encode(cmd)
	if err != nil {
		l.t.Fatal(err)
	}
	if res, ok := l.f.Apply(&raft.Log{Index: l.index, Term: 1, Type: raft.LogCommand, Data: data}).(error); ok {
		l.t.Fatalf("apply %v: %v", cmd, res)
	}
}

// register (re-)registers proxy with runner, whose query port is addr, as
// the runner its mailboxes may be granted to.
func register(proxy, runner, addr string) *adminv1.Command {
	return &adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
		Registration: &adminv1.ProxyRegistration{ProxyId: proxy, Address: addr, RunnerId: runner},
	}}}
}

func createNamespace(name string) *adminv1.Command {
	return &adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{
		Namespace: name, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}},
	}}}
}

func acquire(mailbox, runner, addr string) *adminv1.Command {
	return &adminv1.Command{Body: &adminv1.Command_AcquireLease{AcquireLease: &adminv1.AcquireLeaseRequest{
		MailboxId: mailbox, RunnerId: runner, RunnerAddress: addr,
	}}}
}

func release(mailbox, runner string) *adminv1.Command {
	return &adminv1.Command{Body: &adminv1.Command_ReleaseLease{ReleaseLease: &adminv1.ReleaseLeaseRequest{
		MailboxId: mailbox, RunnerId: runner,
	}}}
}

// TestFollowRoutesProxiesFromTheFSM: grpc-go reaches a mailbox on the runner
// its proxy's registration names; a lease granted, released or re-granted
// changes no version (the runner, told by its sidecar, starts or stops
// answering); a runner restarting at another address, or the proxy going
// stale, is a new version at the FSM's proxy routes index.
func TestFollowRoutesProxiesFromTheFSM(t *testing.T) {
	t.Parallel()
	cp, err := xdstest.StartControlPlane(slog.New(slog.NewTextHandler(io.Discard, nil)), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	a, err := xdstest.StartRunner("runner-a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := xdstest.StartRunner("runner-b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	l := &log{t: t, f: fsm.New(), now: time.Unix(1_700_000_000, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cp.Follow(ctx, l.f, xds.FollowConfig{Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, NotFound: []string{cp.Addr}, Lookup: "dns:///" + cp.Addr})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("follow: %v", err)
		}
	}()

	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(cp.Addr, "follow-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(mailbox string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		who, err := xdstest.WhoAnswers(ctx, conn, mailbox)
		if err != nil {
			return "code:" + status.Code(err).String() + " " + status.Convert(err).Message()
		}
		return who
	}
	// await waits for mailbox's answer to be want, or to start with it
	// when want ends in a space (a code whatever its message).
	await := func(what, mailbox, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		got := ""
		for time.Now().Before(deadline) {
			if got = ask(mailbox); got == want || strings.HasSuffix(want, " ") && strings.HasPrefix(got, want) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: %s answers %q, want %q", what, mailbox, got, want)
	}
	version := func(what string, want uint64) {
		t.Helper()
		if got := cp.Version(); got != strconv.FormatUint(want, 10) {
			t.Fatalf("%s: serving version %s, want the proxy routes index %d", what, got, want)
		}
	}
	notServed := func(id string) string { return `code:NotFound mailbox "` + id + `" is not served here` }

	// proxy-01's runner is runner-a. Its two mailboxes are granted and
	// opened (Hold stands in for the sidecar opening them).
	l.apply(register("proxy-01", "runner-a", a.Addr))
	registered := l.index
	l.apply(createNamespace("audit"))
	l.apply(createNamespace("$admin"))
	l.apply(acquire("audit@proxy-01", "runner-a", a.Addr))
	l.apply(acquire("$admin@proxy-01", "runner-a", a.Addr))
	a.Hold("audit@proxy-01", "$admin@proxy-01")
	await("granted lease", "audit@proxy-01", "runner-a")
	await("granted lease", "$admin@proxy-01", "runner-a")
	version("after two grants", registered)
	if got := l.f.ProxyRoutesIndex(); got != registered {
		t.Fatalf("proxy routes index %d after two grants, want the registration's %d", got, registered)
	}
	// A mailbox of the proxy nobody holds: its runner says so. A mailbox of
	// no registered proxy: the admin node's not-found service says so.
	if got := ask("ghost@proxy-01"); got != notServed("ghost@proxy-01") {
		t.Fatalf("unheld mailbox of proxy-01 answers %q, want the runner's NotFound naming it", got)
	}
	if got, want := ask("ghost@proxy-09"), `code:NotFound mailbox "ghost@proxy-09" not found: no live lease routes it`; got != want {
		t.Fatalf("mailbox of no proxy answers %q, want %q", got, want)
	}

	// Released (the runner closes the mailbox first, then the lease goes):
	// nothing is sent, the runner answers NotFound naming it.
	a.Release("audit@proxy-01")
	l.apply(release("audit@proxy-01", "runner-a"))
	await("released lease", "audit@proxy-01", notServed("audit@proxy-01"))
	version("after a release", registered)

	// The runner restarts as runner-b at another address and re-registers
	// the proxy: one new version, and the re-granted mailbox is served
	// there.
	a.Release("$admin@proxy-01")
	l.apply(register("proxy-01", "runner-b", b.Addr))
	moved, movedAt := l.index, l.now
	l.apply(acquire("audit@proxy-01", "runner-b", b.Addr))
	b.Hold("audit@proxy-01")
	await("lease re-granted to the proxy's new runner", "audit@proxy-01", "runner-b")
	await("mailbox not re-opened", "$admin@proxy-01", notServed("$admin@proxy-01"))
	version("after the runner moved", moved)

	// The proxy goes stale: its runner's endpoint is sent unhealthy, so
	// queries fail fast instead of waiting out the leases; the stale flip
	// moves the proxy routes index.
	l.apply(&adminv1.Command{Body: &adminv1.Command_MarkProxiesStale{MarkProxiesStale: &adminv1.MarkProxiesStaleCommand{
		Proxies: []*adminv1.ProxyRef{{ProxyId: "proxy-01", LastSeen: timestamppb.New(movedAt)}},
	}}})
	await("stale proxy", "audit@proxy-01", "code:"+codes.Unavailable.String()+" ")
	if stale := l.f.ProxyRoutesIndex(); stale != l.index {
		t.Fatalf("proxy routes index %d after the proxy went stale at %d", stale, l.index)
	}
	version("after the proxy went stale", l.index)
}
