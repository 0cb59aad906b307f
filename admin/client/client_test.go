package client

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/testproc"
)

// node is one admin node answering heartbeats by script.
type node struct {
	adminv1.UnimplementedControlPlaneServer
	addr   string
	calls  atomic.Int32
	answer func(context.Context) (*adminv1.MailboxHeartbeatResponse, error)
}

func (n *node) MailboxHeartbeat(ctx context.Context, _ *adminv1.MailboxHeartbeatRequest) (*adminv1.MailboxHeartbeatResponse, error) {
	n.calls.Add(1)
	return n.answer(ctx)
}

func startNode(t *testing.T, answer func(context.Context) (*adminv1.MailboxHeartbeatResponse, error)) *node {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{addr: lis.Addr().String(), answer: answer}
	s := grpc.NewServer()
	adminv1.RegisterControlPlaneServer(s, n)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return n
}

func ok(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
	return &adminv1.MailboxHeartbeatResponse{Renewed: true}, nil
}

func fails(code codes.Code) func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
	return func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
		return nil, status.Error(code, "scripted "+code.String())
	}
}

// hangs answers only when the caller gives up.
func hangs(ctx context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// exhausted answers RESOURCE_EXHAUSTED with detail, as the admin's leader
// sheds work (RetryInfo) and its quotas refuse (QuotaFailure).
func exhausted(detail protoadapt.MessageV1) func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
	return func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
		st, err := status.New(codes.ResourceExhausted, "scripted").WithDetails(detail)
		if err != nil {
			panic(err)
		}
		return nil, st.Err()
	}
}

func refuses(reason adminv1.LeaseRefusalReason, leader string) func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
	return func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
		return nil, mesh.RefusalError(&adminv1.LeaseRefusal{Reason: reason, LeaderAddress: leader})
	}
}

func heartbeat(ctx context.Context, cc *grpc.ClientConn) (*adminv1.MailboxHeartbeatResponse, error) {
	return adminv1.NewControlPlaneClient(cc).MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r"})
}

// connected makes a client whose connections are up, so an Attempt of a few
// milliseconds bounds the call itself and not the connecting.
func connected(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range cfg.Endpoints {
		cc, err := c.conns.Get(a)
		if err != nil {
			t.Fatal(err)
		}
		cc.Connect()
		for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
			if s == connectivity.TransientFailure || !cc.WaitForStateChange(ctx, s) {
				break // a dead endpoint: its calls fail before they are sent
			}
		}
	}
	return c
}

func TestDo(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		nodes  []func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) // nil: nothing listens
		r      Repeatable
		want   codes.Code
		calls  []int32 // calls each listening node saw
		reason adminv1.LeaseRefusalReason
		detail bool // the node's error details reach the caller
	}{
		{name: "unreachable node: any call moves on", nodes: nodes(nil, ok), r: Once, want: codes.OK, calls: []int32{-1, 1}},
		{name: "Unavailable: any call moves on", nodes: nodes(fails(codes.Unavailable), ok), r: Once, want: codes.OK, calls: []int32{1, 1}},
		{name: "timeout: an idempotent call moves on", nodes: nodes(hangs, ok), r: Idempotent, want: codes.OK, calls: []int32{1, 1}},
		{name: "timeout: a call that must not run twice comes back", nodes: nodes(hangs, ok), r: Once, want: codes.DeadlineExceeded, calls: []int32{1, 0}},
		{name: "Unknown: an idempotent call moves on", nodes: nodes(fails(codes.Unknown), ok), r: Idempotent, want: codes.OK, calls: []int32{1, 1}},
		{name: "Unknown: a call that must not run twice comes back", nodes: nodes(fails(codes.Unknown), ok), r: Once, want: codes.Unknown, calls: []int32{1, 0}},
		{name: "ResourceExhausted of one node: an idempotent call moves on", nodes: nodes(fails(codes.ResourceExhausted), ok), r: Idempotent, want: codes.OK, calls: []int32{1, 1}},
		{name: "ResourceExhausted of one node: a call that must not run twice comes back", nodes: nodes(fails(codes.ResourceExhausted), ok), r: Once, want: codes.ResourceExhausted, calls: []int32{1, 0}},
		{name: "the leader shedding (RetryInfo) is the cluster's answer, its delay kept", nodes: nodes(exhausted(&errdetails.RetryInfo{RetryDelay: durationpb.New(700 * time.Millisecond)}), ok), r: Idempotent, want: codes.ResourceExhausted, calls: []int32{1, 0}, detail: true},
		{name: "a quota (QuotaFailure) is the cluster's answer", nodes: nodes(exhausted(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "leases"}}}), ok), r: Idempotent, want: codes.ResourceExhausted, calls: []int32{1, 0}, detail: true},
		{name: "Aborted: a call that must not run twice comes back", nodes: nodes(fails(codes.Aborted), ok), r: Once, want: codes.Aborted, calls: []int32{1, 0}},
		{name: "Canceled by the node: an idempotent call moves on", nodes: nodes(fails(codes.Canceled), ok), r: Idempotent, want: codes.OK, calls: []int32{1, 1}},
		{name: "a lease refusal is the cluster's answer",
			nodes: nodes(refuses(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED, ""), ok), r: Idempotent,
			want: codes.FailedPrecondition, calls: []int32{1, 0}, reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_EXPIRED},
		{name: "UNKNOWN_LEASE is the cluster's answer",
			nodes: nodes(refuses(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE, ""), ok), r: Idempotent,
			want: codes.NotFound, calls: []int32{1, 0}, reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE},
		{name: "InvalidArgument comes back", nodes: nodes(fails(codes.InvalidArgument), ok), r: Idempotent, want: codes.InvalidArgument, calls: []int32{1, 0}},
		{name: "AlreadyExists comes back", nodes: nodes(fails(codes.AlreadyExists), ok), r: Idempotent, want: codes.AlreadyExists, calls: []int32{1, 0}},
		{name: "Internal comes back", nodes: nodes(fails(codes.Internal), ok), r: Idempotent, want: codes.Internal, calls: []int32{1, 0}},
		{name: "Unimplemented comes back", nodes: nodes(fails(codes.Unimplemented), ok), r: Idempotent, want: codes.Unimplemented, calls: []int32{1, 0}},
		{name: "every node down: Unavailable after one round", nodes: nodes(nil, fails(codes.Unavailable)), r: Idempotent, want: codes.Unavailable, calls: []int32{-1, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var addrs []string
			var started []*node
			for _, answer := range tc.nodes {
				if answer == nil {
					addrs = append(addrs, testproc.FreeAddr(t))
					started = append(started, nil)
					continue
				}
				n := startNode(t, answer)
				addrs = append(addrs, n.addr)
				started = append(started, n)
			}
			c := connected(t, Config{Endpoints: addrs, Attempt: 30 * time.Millisecond, Rounds: 1})
			resp, err := Do(context.Background(), c, tc.r, heartbeat)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if tc.want == codes.OK && !resp.GetRenewed() {
				t.Fatalf("response %v", resp)
			}
			for i, n := range started {
				if n != nil && n.calls.Load() != tc.calls[i] {
					t.Errorf("node %d saw %d calls, want %d", i, n.calls.Load(), tc.calls[i])
				}
			}
			if tc.detail && len(status.Convert(err).Details()) == 0 {
				t.Errorf("error %v lost its details", err)
			}
			if r, ok := mesh.RefusalFrom(err); tc.reason != 0 && (!ok || r.GetReason() != tc.reason) {
				t.Errorf("refusal %v, want %v kept in %v", r, tc.reason, err)
			}
			if err != nil && !strings.Contains(err.Error(), "MailboxHeartbeat") {
				t.Errorf("error %q does not name the call", err)
			}
		})
	}
}

func nodes(n ...func(context.Context) (*adminv1.MailboxHeartbeatResponse, error)) []func(context.Context) (*adminv1.MailboxHeartbeatResponse, error) {
	return n
}

// A NOT_LEADER refusal sends the call to the leader it names when that is
// an endpoint not yet tried, else on to the next endpoint.
func TestDoFollowsLeaderHint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name              string
		hintIsEndpoint    bool
		bystander, leader int32 // calls each saw
	}{
		{"leader among the endpoints: straight there", true, 0, 1},
		{"leader not an endpoint: the next node", false, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			leader := startNode(t, ok)
			hint := "10.9.9.9:1"
			if tc.hintIsEndpoint {
				hint = leader.addr
			}
			follower := startNode(t, refuses(adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_LEADER, hint))
			bystander := startNode(t, ok)
			c := connected(t, Config{Endpoints: []string{follower.addr, bystander.addr, leader.addr}, Rounds: 1})
			if _, err := Do(context.Background(), c, Once, heartbeat); err != nil {
				t.Fatal(err)
			}
			if follower.calls.Load() != 1 || bystander.calls.Load() != tc.bystander || leader.calls.Load() != tc.leader {
				t.Fatalf("calls: follower %d, bystander %d, leader %d", follower.calls.Load(), bystander.calls.Load(), leader.calls.Load())
			}
		})
	}
}

// The next call starts with the node that answered the last one.
func TestDoStartsWhereTheLastCallSucceeded(t *testing.T) {
	t.Parallel()
	down := startNode(t, fails(codes.Unavailable))
	up := startNode(t, ok)
	c := connected(t, Config{Endpoints: []string{down.addr, up.addr}, Rounds: 1})
	for range 3 {
		if _, err := Do(context.Background(), c, Once, heartbeat); err != nil {
			t.Fatal(err)
		}
	}
	if down.calls.Load() != 1 || up.calls.Load() != 3 {
		t.Fatalf("calls: down %d, up %d; want 1 and 3", down.calls.Load(), up.calls.Load())
	}
}

func TestDoGivesUpNamingEveryNode(t *testing.T) {
	t.Parallel()
	a, b := testproc.FreeAddr(t), testproc.FreeAddr(t)
	cases := []struct {
		name     string
		deadline time.Duration // 0: none
		cfg      Config
		ctxE     error
	}{
		{"rounds spent", 0, Config{Endpoints: []string{a, b}, Rounds: 2, Backoff: wait.Backoff{Duration: time.Millisecond}}, nil},
		{"caller's deadline", 50 * time.Millisecond, Config{Endpoints: []string{a, b}, Backoff: wait.Backoff{Duration: time.Millisecond}}, context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := connected(t, tc.cfg)
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			start := time.Now()
			_, err := Do(ctx, c, Idempotent, heartbeat)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("err %v, want Unavailable", err)
			}
			for _, want := range []string{"no admin node could answer MailboxHeartbeat", a, b} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if tc.ctxE != nil && !errors.Is(err, tc.ctxE) {
				t.Errorf("error %v does not wrap %v", err, tc.ctxE)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}

// recordingClock fires every timer at once and keeps the waits asked for.
type recordingClock struct {
	*testingclock.FakeClock
	mu    sync.Mutex
	waits []time.Duration
}

func (c *recordingClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	t := c.FakeClock.NewTimer(d)
	c.Step(d)
	return t
}

func TestDoBacksOffBetweenRounds(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	cases := []struct {
		name    string
		backoff wait.Backoff
		rounds  int
		want    []time.Duration
	}{
		{"doubles up to the cap", wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 100, Cap: 40 * time.Millisecond}, 6,
			[]time.Duration{10 * ms, 20 * ms, 40 * ms, 40 * ms, 40 * ms}},
		{"steps spent: the last wait repeats", wait.Backoff{Duration: 10 * time.Millisecond, Factor: 3, Steps: 2}, 5,
			[]time.Duration{10 * ms, 30 * ms, 90 * ms, 90 * ms}},
		{"one round: no wait", wait.Backoff{Duration: time.Hour}, 1, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := &recordingClock{FakeClock: testingclock.NewFakeClock(time.Now())}
			c := connected(t, Config{Endpoints: []string{testproc.FreeAddr(t)}, Rounds: tc.rounds, Backoff: tc.backoff, Clock: clk})
			if _, err := Do(context.Background(), c, Idempotent, heartbeat); status.Code(err) != codes.Unavailable {
				t.Fatalf("err %v, want Unavailable", err)
			}
			clk.mu.Lock()
			defer clk.mu.Unlock()
			if !slices.Equal(clk.waits, tc.want) {
				t.Fatalf("waits %v, want %v", clk.waits, tc.want)
			}
		})
	}
}

// An Attempt bounds each try; the caller's context bounds them all.
func TestDoRespectsDeadlines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		attempt       time.Duration
		deadline      time.Duration
		minTries, max int32
	}{
		{"attempts shorter than the caller's deadline: several tries", 10 * time.Millisecond, 50 * time.Millisecond, 2, 5},
		{"caller's deadline shorter than the attempt: one try", time.Minute, 30 * time.Millisecond, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, hangs)
			c := connected(t, Config{Endpoints: []string{n.addr}, Attempt: tc.attempt, Backoff: wait.Backoff{Duration: 5 * time.Millisecond}})
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			_, err := Do(ctx, c, Idempotent, heartbeat)
			if took := time.Since(start); took > tc.deadline+time.Second {
				t.Fatalf("took %v past a %v deadline", took, tc.deadline)
			}
			if !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.Unavailable {
				t.Fatalf("err %v, want Unavailable wrapping the caller's deadline", err)
			}
			if got := n.calls.Load(); got < tc.minTries || got > tc.max {
				t.Fatalf("%d tries, want %d..%d", got, tc.minTries, tc.max)
			}
		})
	}
}

func TestRotate(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Endpoints: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got []string
	for range 4 {
		addr, cc, err := c.Rotate()
		if err != nil || cc == nil {
			t.Fatal(err)
		}
		got = append(got, addr)
	}
	if strings.Join(got, ",") != "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:1" {
		t.Fatalf("rotation %v", got)
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, eps := range [][]string{nil, {"dns:///%zz"}} {
		if c, err := New(Config{Endpoints: eps}); err == nil {
			c.Close()
			t.Errorf("New(%q) succeeded", eps)
		}
	}
}

// With UnreachableAfter a call gives up once no endpoint has accepted a
// connection for that long, well before the caller's deadline; a node that
// answers, even with a failure that is retried, keeps the call going until
// the deadline.
func TestDoGivesUpOnUnreachableEndpoints(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		endpoints   func(t *testing.T) []string
		unreachable bool
		atLeast     time.Duration // the call lasted at least this long
		atMost      time.Duration // and returned within this
	}{
		{"every endpoint refuses", func(t *testing.T) []string { return []string{testproc.FreeAddr(t), testproc.FreeAddr(t)} },
			true, 300 * time.Millisecond, 2 * time.Second},
		{"a node answers Unavailable", func(t *testing.T) []string {
			return []string{testproc.FreeAddr(t), startNode(t, fails(codes.Unavailable)).addr}
		}, false, 3 * time.Second, 6 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eps := tc.endpoints(t)
			c := connected(t, Config{Endpoints: eps, UnreachableAfter: 300 * time.Millisecond,
				Backoff: wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 100, Cap: time.Second}})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			_, err := Do(ctx, c, Idempotent, heartbeat)
			took := time.Since(start)
			if status.Code(err) != codes.Unavailable || Unreachable(err) != tc.unreachable {
				t.Fatalf("err %v: Unreachable %v, want Unavailable and %v", err, Unreachable(err), tc.unreachable)
			}
			if took < tc.atLeast || took > tc.atMost {
				t.Fatalf("gave up after %v, want %v..%v", took, tc.atLeast, tc.atMost)
			}
			for _, a := range eps {
				if !strings.Contains(err.Error(), a) {
					t.Errorf("error %q does not name %s", err, a)
				}
			}
		})
	}
}
