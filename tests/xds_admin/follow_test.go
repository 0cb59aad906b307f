// Package xdsadmin drives the xDS control plane from the real admin FSM, as
// an admin node does (log entries applied directly, without Raft): leases
// granted and released through FSM commands route and unroute grpc-go's
// queries.
package xdsadmin

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/xdstest"
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

// register (re-)registers proxy with runner as the runner its mailboxes may
// be granted to.
func register(proxy, runner string) *adminv1.Command {
	return &adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
		Registration: &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:7000", RunnerId: runner},
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

// indexed gives the FSM the optional RoutesIndex read Follow uses to skip
// unchanged routes.
type indexed struct{ *fsm.FSM }

func (i indexed) RoutesIndex() uint64 { _, _, idx := i.Routes(); return idx }

func TestFollowRoutesLeasesFromTheFSM(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		source func(*fsm.FSM) xds.Source
	}{
		{"fsm", func(f *fsm.FSM) xds.Source { return f }},
		{"fsm with routes index", func(f *fsm.FSM) xds.Source { return indexed{f} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			follow(t, tt.source)
		})
	}
}

func follow(t *testing.T, source func(*fsm.FSM) xds.Source) {
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
		done <- cp.Follow(ctx, source(l.f), xds.FollowConfig{Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, NotFound: []string{cp.Addr}})
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
			return "code:" + status.Code(err).String()
		}
		return who
	}
	await := func(what, mailbox, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		got := ""
		for time.Now().Before(deadline) {
			if got = ask(mailbox); got == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: %s answers %q, want %q", what, mailbox, got, want)
	}

	// proxy-01 is the only proxy, so both namespaces are placed on it. Its
	// runner is replaced between the two grants (runner-a keeps audit).
	l.apply(register("proxy-01", "runner-a"))
	l.apply(createNamespace("audit"))
	l.apply(createNamespace("$admin"))
	l.apply(acquire("audit@proxy-01", "runner-a", a.Addr))
	l.apply(register("proxy-01", "runner-b"))
	registeredAt := l.now
	l.apply(acquire("$admin@proxy-01", "runner-b", b.Addr))
	await("granted lease", "audit@proxy-01", "runner-a")
	await("granted lease", "$admin@proxy-01", "runner-b")
	if got := ask("ghost@proxy-01"); got != "code:"+codes.NotFound.String() {
		t.Fatalf("unknown mailbox answers %q, want NotFound", got)
	}

	_, _, before := l.f.Routes()
	l.apply(&adminv1.Command{Body: &adminv1.Command_ReleaseLease{ReleaseLease: &adminv1.ReleaseLeaseRequest{
		MailboxId: "audit@proxy-01", RunnerId: "runner-a",
	}}})
	await("released lease", "audit@proxy-01", "code:"+codes.NotFound.String())
	l.apply(acquire("audit@proxy-01", "runner-b", b.Addr))
	await("lease re-granted to another runner", "audit@proxy-01", "runner-b")
	_, _, after := l.f.Routes()
	if cp.Version() != strconv.FormatUint(after, 10) || after <= before {
		t.Fatalf("serving version %s, want the FSM's routes index %d (was %d)", cp.Version(), after, before)
	}

	// The proxy goes stale: its runners' endpoints are sent unhealthy, so
	// queries fail fast instead of waiting out the leases. Its namespaces
	// lose their placement (no proxy is live), which moves the routes index;
	// the mailbox routes stay.
	l.apply(&adminv1.Command{Body: &adminv1.Command_MarkProxiesStale{MarkProxiesStale: &adminv1.MarkProxiesStaleCommand{
		Proxies: []*adminv1.ProxyRef{{ProxyId: "proxy-01", LastSeen: timestamppb.New(registeredAt)}},
	}}})
	await("stale proxy", "audit@proxy-01", "code:"+codes.Unavailable.String())
	if _, _, stale := l.f.Routes(); cp.Version() != strconv.FormatUint(stale, 10) || stale != l.index {
		t.Fatalf("serving version %s after the proxy went stale, want the routes index %d of the move at %d", cp.Version(), stale, l.index)
	}
}
