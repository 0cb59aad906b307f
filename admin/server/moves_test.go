package server

import (
	"crypto/tls"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// The move RPCs refuse what the state does not allow with a code that
// says what is wrong and a message that says why, and change nothing.
func TestMoveRPCRefusals(t *testing.T) {
	t.Parallel()
	e := newMoverEnv(t)
	e.register("p3")
	cordon := func(p string, on bool) *adminv1.CordonProxyResponse {
		t.Helper()
		r, err := e.adm.CordonProxy(e.c, &adminv1.CordonProxyRequest{ProxyId: p, Cordoned: on})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := cordon("p3", true); !r.GetChanged() || !r.GetProxy().GetCordoned() {
		t.Fatalf("cordon p3: %v", r)
	}
	if r := cordon("p3", true); r.GetChanged() || !r.GetProxy().GetCordoned() {
		t.Fatalf("cordon p3 again: %v, want changed=false", r)
	}
	move := func(ns, to string) error {
		_, err := e.adm.MoveNamespace(e.c, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: to})
		return err
	}
	cancelMove := func(ns string) error {
		_, err := e.adm.CancelMove(e.c, &adminv1.CancelMoveRequest{Namespace: ns})
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		says string
	}{
		{"unknown namespace", move("nope", "p2"), codes.NotFound, `namespace "nope"`},
		{"unknown proxy", move(e.ns, "p9"), codes.NotFound, `proxy "p9"`},
		{"malformed namespace", move("Bad Name", "p2"), codes.InvalidArgument, ""},
		{"malformed proxy", move(e.ns, "a@b"), codes.InvalidArgument, ""},
		{"already there", move(e.ns, "p1"), codes.FailedPrecondition, "already on p1"},
		{"cordoned destination", move(e.ns, "p3"), codes.FailedPrecondition, "p3 cannot take namespaces"},
		{"cancel without a move", cancelMove(e.ns), codes.FailedPrecondition, "no move in progress"},
		{"cancel of an unknown namespace", cancelMove("nope"), codes.NotFound, `namespace "nope"`},
		{"cordon an unknown proxy", func() error {
			_, err := e.adm.CordonProxy(e.c, &adminv1.CordonProxyRequest{ProxyId: "p9", Cordoned: true})
			return err
		}(), codes.NotFound, "p9"},
	} {
		if status.Code(tc.err) != tc.code || !strings.Contains(status.Convert(tc.err).Message(), tc.says) {
			t.Errorf("%s: %v, want %s saying %q", tc.name, tc.err, tc.code, tc.says)
		}
	}
	if n := e.namespace(); n.GetIncomingProxyId() != "" || n.GetAssignedProxyId() != "p1" {
		t.Fatalf("refused calls moved %s: %v", e.ns, n)
	}

	e.start()
	if err := move(e.ns, "p2"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "move in progress") {
		t.Fatalf("a second move: %v, want FailedPrecondition naming the move in progress", err)
	}
	e.acquire("p2")
	e.heartbeat("p2", 7, true)
	moves, err := e.adm.ListMoves(e.c, &adminv1.ListMovesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &adminv1.NamespaceMove{Namespace: e.ns, FromProxyId: "p1", ToProxyId: "p2", State: adminv1.MoveState_MOVE_STATE_CATCHING_UP,
		Lag: 7, LagKnown: true, Reason: adminv1.MoveReason_MOVE_REASON_OPERATOR}
	if got := moves.GetMoves(); len(got) != 1 || !sameMove(got[0], want) || got[0].GetStartedAt() == nil || got[0].GetSwitchedAt() != nil {
		t.Fatalf("ListMoves while catching up: %v, want %v", got, want)
	}
	e.heartbeat("p1", 0, true) // the source's report the switch compares with
	e.heartbeat("p2", 0, true)
	e.tick(moveTick)
	moves, err = e.adm.ListMoves(e.c, &adminv1.ListMovesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want.State, want.Lag = adminv1.MoveState_MOVE_STATE_HANDING_OFF, 0
	if got := moves.GetMoves(); len(got) != 1 || !sameMove(got[0], want) || got[0].GetSwitchedAt() == nil || got[0].GetHandoffUntil() == nil {
		t.Fatalf("ListMoves in the tail: %v, want %v", got, want)
	}
	if err := cancelMove(e.ns); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "already switched to p2") {
		t.Fatalf("cancel after the switch: %v, want FailedPrecondition saying it switched", err)
	}
}

func sameMove(got, want *adminv1.NamespaceMove) bool {
	return got.GetNamespace() == want.GetNamespace() && got.GetFromProxyId() == want.GetFromProxyId() &&
		got.GetToProxyId() == want.GetToProxyId() && got.GetState() == want.GetState() && got.GetLag() == want.GetLag() &&
		got.GetLagKnown() == want.GetLagKnown() && got.GetReason() == want.GetReason()
}

// DrainProxy drains for the registered sidecar instance only; a retry is
// a success that changes nothing.
func TestDrainProxyRPC(t *testing.T) {
	t.Parallel()
	e := newMoverEnv(t)
	if _, err := e.cp.RegisterProxy(e.c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "p1", Address: "127.0.0.1:9000", Instance: "i1",
	}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *adminv1.DrainProxyRequest
		code codes.Code
	}{
		{"unknown proxy", &adminv1.DrainProxyRequest{ProxyId: "p9", Instance: "i1"}, codes.NotFound},
		{"another instance", &adminv1.DrainProxyRequest{ProxyId: "p1", Instance: "i0"}, codes.FailedPrecondition},
		{"no instance", &adminv1.DrainProxyRequest{ProxyId: "p1"}, codes.InvalidArgument},
	} {
		if _, err := e.cp.DrainProxy(e.c, tc.req); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	for i, drained := range []bool{true, false} {
		r, err := e.cp.DrainProxy(e.c, &adminv1.DrainProxyRequest{ProxyId: "p1", Instance: "i1"})
		if err != nil || r.GetDrained() != drained || r.GetProxy().GetDrainingInstance() != "i1" {
			t.Fatalf("drain %d: %v, %v; want drained=%t", i, r, err, drained)
		}
	}
	// p1 drains: its namespace becomes a planned move to p2 (DRAIN).
	e.tick(moveTick)
	if n := e.namespace(); n.GetIncomingProxyId() != "p2" || n.GetMoveReason() != adminv1.MoveReason_MOVE_REASON_DRAIN {
		t.Fatalf("after p1's drain: %v", n)
	}
}

// Only operators move namespaces and cordon proxies, readers may list
// moves, and a proxy drains only itself; a refused call changes nothing.
func TestMoveRPCsAuthz(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	logs := &records{}
	// The mover stays out of it: once pa registers, nb is a planned move, and
	// a Rebalance started by the mover's tick while the refused calls run
	// (they take over its 500 ms on a loaded machine) would be a change they
	// did not make.
	n := startTLSNode(t, p, NodeConfig{Raft: raftnode.Config{ID: "solo", Bootstrap: true}, Logger: slog.New(logs), Moves: MoveConfig{Interval: time.Hour}})
	addr := n.GRPCAddr()
	c := ctx(t)
	op := as(t, p, addr, identity.Operator, "alice")
	proxyA, proxyB := as(t, p, addr, identity.Proxy, "pa"), as(t, p, addr, identity.Proxy, "pb")
	gateway, reader := as(t, p, addr, identity.Gateway, "gw"), as(t, p, addr, identity.Reader, "ro")
	//nolint:gosec // the client skips verifying the server: the test is about the server's check of it
	nocert := dialAs(t, addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})

	// pb alone is live when nb is created, so nb is placed on pb.
	if _, err := adminv1.NewControlPlaneClient(proxyB).RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "pb", Address: "127.0.0.1:9000", Instance: "ib",
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminv1.NewControlPlaneClient(op).CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: "nb", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminv1.NewControlPlaneClient(proxyA).RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "pa", Address: "127.0.0.1:9100", Instance: "ia",
	}}); err != nil {
		t.Fatal(err)
	}
	moveNB := &adminv1.MoveNamespaceRequest{Namespace: "nb", ToProxyId: "pa"}
	before := snapshot(t, n)
	for _, d := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"no certificate moves nb", func() error { _, err := adminv1.NewAdminClient(nocert).MoveNamespace(c, moveNB); return err }, codes.Unavailable},
		{"no certificate lists moves", func() error {
			_, err := adminv1.NewAdminClient(nocert).ListMoves(c, &adminv1.ListMovesRequest{})
			return err
		}, codes.Unavailable},
		{"reader moves nb", func() error { _, err := adminv1.NewAdminClient(reader).MoveNamespace(c, moveNB); return err }, codes.PermissionDenied},
		{"reader cancels nb's move", func() error {
			_, err := adminv1.NewAdminClient(reader).CancelMove(c, &adminv1.CancelMoveRequest{Namespace: "nb"})
			return err
		}, codes.PermissionDenied},
		{"reader cordons pb", func() error {
			_, err := adminv1.NewAdminClient(reader).CordonProxy(c, &adminv1.CordonProxyRequest{ProxyId: "pb", Cordoned: true})
			return err
		}, codes.PermissionDenied},
		{"proxy A moves nb to itself", func() error { _, err := adminv1.NewAdminClient(proxyA).MoveNamespace(c, moveNB); return err }, codes.PermissionDenied},
		{"proxy A cordons pb", func() error {
			_, err := adminv1.NewAdminClient(proxyA).CordonProxy(c, &adminv1.CordonProxyRequest{ProxyId: "pb", Cordoned: true})
			return err
		}, codes.PermissionDenied},
		{"proxy A lists moves", func() error {
			_, err := adminv1.NewAdminClient(proxyA).ListMoves(c, &adminv1.ListMovesRequest{})
			return err
		}, codes.PermissionDenied},
		{"proxy A drains pb", func() error {
			_, err := adminv1.NewControlPlaneClient(proxyA).DrainProxy(c, &adminv1.DrainProxyRequest{ProxyId: "pb", Instance: "ib"})
			return err
		}, codes.PermissionDenied},
		{"operator drains pb as the proxy", func() error {
			_, err := adminv1.NewControlPlaneClient(op).DrainProxy(c, &adminv1.DrainProxyRequest{ProxyId: "pb", Instance: "ib"})
			return err
		}, codes.PermissionDenied},
		{"gateway lists moves", func() error {
			_, err := adminv1.NewAdminClient(gateway).ListMoves(c, &adminv1.ListMovesRequest{})
			return err
		}, codes.PermissionDenied},
	} {
		err := d.call()
		if status.Code(err) != d.code && (d.code != codes.Unavailable || err == nil) {
			t.Errorf("%s: %v, want %s", d.name, err, d.code)
		}
	}
	if after := snapshot(t, n); !slices.Equal(before, after) {
		t.Fatalf("refused calls changed the state:\nbefore %v\nafter  %v", before, after)
	}

	if _, err := adminv1.NewAdminClient(op).MoveNamespace(c, moveNB); err != nil {
		t.Fatalf("operator moves nb: %v", err)
	}
	if got, _ := logs.attr("namespace move started", "principal"); got != "spiffe://prism.local/operator/alice" {
		t.Errorf("audit principal of the move = %q, want the operator's identity", got)
	}
	if r, err := adminv1.NewAdminClient(reader).ListMoves(c, &adminv1.ListMovesRequest{}); err != nil || len(r.GetMoves()) != 1 {
		t.Fatalf("reader lists moves: %v, %v", r, err)
	}
	if _, err := adminv1.NewAdminClient(op).CancelMove(c, &adminv1.CancelMoveRequest{Namespace: "nb"}); err != nil {
		t.Fatalf("operator cancels: %v", err)
	}
	if _, err := adminv1.NewAdminClient(op).CordonProxy(c, &adminv1.CordonProxyRequest{ProxyId: "pa", Cordoned: true}); err != nil {
		t.Fatalf("operator cordons pa: %v", err)
	}
	if r, err := adminv1.NewControlPlaneClient(proxyB).DrainProxy(c, &adminv1.DrainProxyRequest{ProxyId: "pb", Instance: "ib"}); err != nil || !r.GetDrained() {
		t.Fatalf("pb drains itself: %v, %v", r, err)
	}
}
