// Package xdsgrpc proves the routes with grpc-go's own xDS client: queries
// for a mailbox land on its proxy's runner, follow the runner when it
// restarts elsewhere, and get NotFound once the lease is released (from the
// runner, the authority; routes are per proxy).
package xdsgrpc

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

// quiet logs only warnings, which go test shows when a test fails.
func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type world struct {
	t       *testing.T
	cp      *xdstest.ControlPlane
	runners map[string]*xdstest.Runner
	version uint64
}

func newWorld(t *testing.T, runnerIDs ...string) *world {
	t.Helper()
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	w := &world{t: t, cp: cp, runners: map[string]*xdstest.Runner{}}
	for _, id := range runnerIDs {
		r, err := xdstest.StartRunner(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		w.runners[id] = r
	}
	return w
}

// publish hands the control plane a new state with the given proxies
// (proxy id → the runner serving it) and returns its version.
func (w *world) publish(proxies map[string]string) uint64 {
	w.version++
	x := &ir.IR{Version: w.version, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{w.cp.Addr}, Lookup: "dns:///" + w.cp.Addr}
	for proxy, runner := range proxies {
		x.Proxies = append(x.Proxies, ir.Proxy{ID: proxy, RunnerID: runner, Address: w.runners[runner].Addr, Healthy: true})
	}
	w.cp.Update(x)
	return w.version
}

// await polls until ask returns want (a runner id, or a status code as
// "code:NotFound"), failing after a generous deadline.
func await(t *testing.T, what string, ask func(ctx context.Context) string, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got = ask(ctx)
		cancel()
		if got == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: last answer %q, want %q", what, got, want)
}

func outcome(runner string, err error) string {
	if err != nil {
		return "code:" + status.Code(err).String()
	}
	return runner
}

func TestQueriesFollowLeases(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "runner-a", "runner-a2", "runner-b")
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(w.cp.Addr, "test-"+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(mailbox string) func(ctx context.Context) string {
		return func(ctx context.Context) string { return outcome(xdstest.WhoAnswers(ctx, conn, mailbox)) }
	}

	w.runners["runner-a"].Hold("audit@proxy-a")
	w.runners["runner-b"].Hold("$admin@proxy-b")
	w.publish(map[string]string{"proxy-a": "runner-a", "proxy-b": "runner-b"})
	await(t, "audit on its owner", ask("audit@proxy-a"), "runner-a")
	await(t, "$admin on its owner", ask("$admin@proxy-b"), "runner-b")
	await(t, "unknown proxy", ask("nobody@proxy-z"), "code:NotFound")
	await(t, "mailbox its proxy's runner does not hold", ask("nobody@proxy-a"), "code:NotFound")

	// proxy-a's runner restarts on a new address and re-acquires: one
	// endpoint moves, and audit follows.
	w.runners["runner-a"].Release("audit@proxy-a")
	w.runners["runner-a2"].Hold("audit@proxy-a")
	w.publish(map[string]string{"proxy-a": "runner-a2", "proxy-b": "runner-b"})
	await(t, "audit after the restart", ask("audit@proxy-a"), "runner-a2")

	// The lease is released: nothing is published, the runner answers
	// NotFound; a re-grant is served again.
	w.runners["runner-b"].Release("$admin@proxy-b")
	await(t, "$admin after release", ask("$admin@proxy-b"), "code:NotFound")
	if got := outcome(xdstest.WhoAnswers(context.Background(), conn, "audit@proxy-a")); got != "runner-a2" {
		t.Fatalf("audit after releasing $admin: %s", got)
	}
	w.runners["runner-b"].Hold("$admin@proxy-b")
	await(t, "$admin re-granted", ask("$admin@proxy-b"), "runner-b")
}

func TestNotFoundNamesTheMailbox(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "runner-a")
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(w.cp.Addr, "test-"+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w.runners["runner-a"].Hold("audit@proxy-a")
	w.publish(map[string]string{"proxy-a": "runner-a"})
	await(t, "audit routed", func(ctx context.Context) string { return outcome(xdstest.WhoAnswers(ctx, conn, "audit@proxy-a")) }, "runner-a")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = xdstest.WhoAnswers(ctx, conn, "ghost@proxy-q")
	if st := status.Convert(err); st.Code() != codes.NotFound || !contains(st.Message(), "ghost@proxy-q") {
		t.Fatalf("mailbox of an unknown proxy: %v, want NotFound naming it", err)
	}
	_, err = xdstest.WhoAnswers(ctx, conn, "ghost@proxy-a")
	if st := status.Convert(err); st.Code() != codes.NotFound || !contains(st.Message(), "ghost@proxy-a") {
		t.Fatalf("mailbox its proxy's runner does not hold: %v, want NotFound naming it", err)
	}
	_, err = xdstest.WhoAnswers(ctx, conn, "")
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no mailbox id: %v, want InvalidArgument", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
