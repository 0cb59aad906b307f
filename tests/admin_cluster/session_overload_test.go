package admincluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
)

type loadResult struct {
	Sent     int64            `json:"sent"`
	Renewed  int64            `json:"renewed"`
	Refused  int64            `json:"refused"`
	Errors   map[string]int64 `json:"errors"`
	Seconds  float64          `json:"seconds"`
	Refusals []string         `json:"refusals"`
	MaxGapMs float64          `json:"max_gap_ms"`
}

// buildRenewLoad builds ./internal/renewload without the race detector.
func buildRenewLoad(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	out := filepath.Join(t.TempDir(), "renewload")
	cmd := exec.Command("go", "build", "-o", out, "./internal/renewload")
	cmd.Dir = filepath.Dir(file)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build renewload: %v\n%s", err, b)
	}
	return out
}

func runRenewLoad(ctx context.Context, t *testing.T, bin string, args ...string) loadResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("renewload %v: %v\n%s", args, err, stderr.String())
	}
	var r loadResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("renewload output %q: %v", stdout.String(), err)
	}
	return r
}

// TestSessionOverload: renewals at 3x what the leader answers, for 30 s
// (docs/architecture.md#sessions). A ramp (closed-loop, 256 callers, 3 s) measures the
// keepalives the leader answers a second, C; then renewload, built without
// the race detector, sends 3C a second open-loop for 30 s, spread over 50
// sessions holding 20 leases each and the probe's session (every session
// gets far more than one keepalive per ttl: every holder keeps sending on
// time), while each session's holder also keeps alive every ttl/4 from this
// process, as its sidecar would. Checked: the load really was 3C; no
// keepalive is refused, and every session had a renewed keepalive sent
// within ttl of the last (its holder never had to stop serving; logged, not
// failed, if a stall of the machine changed the leader); no session
// or lease expires (a linearizable GetSession and ListSessions after, and
// the leader's expirations); new work (an AcquireLeases of a free mailbox)
// is refused RESOURCE_EXHAUSTED with a RetryInfo hint during the load and
// counted in prism_admin_shed_total; once the load stops the same acquire
// is granted within 10 s, without operator action.
//
// The ceiling is lowered on purpose: the admins run with
// --max-renewals-per-second 600. The machine's own ceiling (15-25k
// keepalives/s on 2 cores, the three admins and the generator sharing
// them) cannot be driven at 3x from the same cores, and a leader driven at
// it loses the CPU race to its own Raft heartbeats and is deposed, again
// and again (the first runs of this test: renewals answered fell from
// 14.5k/s to 1.7k/s, acquires timed out instead of being shed). The bound
// is the production knob for exactly that, and what the test checks is
// the leader's behaviour past its ceiling, whatever sets it. For the same
// reason the nodes run the WAN timing (a 1 s heartbeat timeout), not the
// 150 ms default: on a CI machine
// shared with the race-built test process a 150 ms scheduling stall is an
// election, and elections are not what this test is about.
func TestSessionOverload(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process overload test")
	}
	const (
		nSessions    = 50
		perSess      = 20
		ttl          = 3 * time.Second
		loadFor      = 30 * time.Second
		renewalBound = 600
	)
	bin := buildRenewLoad(t)
	c := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, Insecure: true, Args: []string{"--stale-proxy-after", "10m",
		"--max-renewals-per-second", strconv.Itoa(renewalBound), "--shed-after-renewal-wait", "250ms", "--raft-timing", "wan"}})
	ctx, cancel := context.WithTimeout(context.Background(), 85*time.Second)
	defer cancel()
	lead := c.AwaitLeader()
	leader := c.Nodes[lead]
	var proxies []string
	for i := range nSessions + 1 {
		p := fmt.Sprintf("ov-p%d", i)
		proxies = append(proxies, p)
		registerRunner(ctx, t, c, p, "")
	}
	names := make([]string, 0, (nSessions+1)*perSess*2)
	for i := range cap(names) {
		names = append(names, fmt.Sprintf("ov-%d", i))
	}
	placed := createNamespaces(ctx, t, leader, names)
	// The last proxy's session is the probe: its mailboxes stay free until
	// it acquires one.
	probeProxy := proxies[nSessions]
	if len(placed[probeProxy]) < 2 {
		t.Fatalf("the probe proxy has %d mailboxes", len(placed[probeProxy]))
	}
	type held struct {
		proxy string
		id    uint64
		n     int
	}
	var hs []held
	open := func(p string) uint64 {
		r, err := leader.SessionsAs(p).OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: p, RunnerId: p, RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(ttl)})
		if err != nil || r.GetSession() == nil {
			t.Fatalf("open a session of %s: %v %v", p, err, r.GetRefusal())
		}
		return r.GetSession().GetId()
	}
	for _, p := range proxies[:nSessions] {
		mbs := placed[p]
		if len(mbs) == 0 {
			continue
		}
		mbs = mbs[:min(perSess, len(mbs))]
		id := open(p)
		r, err := leader.SessionsAs(p).AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: p, SessionId: id, MailboxIds: mbs})
		if err != nil || r.GetRefusal() != nil {
			t.Fatalf("acquire in session %d: %v %v", id, err, r.GetRefusal())
		}
		hs = append(hs, held{p, id, len(mbs)})
	}
	probeID := open(probeProxy)
	all := append(slices.Clone(hs), held{probeProxy, probeID, 0})
	var list []string
	for _, h := range all {
		list = append(list, h.proxy+":"+strconv.FormatUint(h.id, 10))
	}
	sessionsArg := strings.Join(list, ",")
	// Every holder keeps its session alive every ttl/4, as its sidecar
	// would, besides the load's keepalives; a refusal is counted.
	var keepRefused atomic.Int64
	kctx, stopKeep := context.WithCancel(ctx)
	var keepers sync.WaitGroup
	defer keepers.Wait()
	defer stopKeep()
	for _, h := range all {
		keepers.Add(1)
		go func() {
			defer keepers.Done()
			tick := time.NewTicker(ttl / 4)
			defer tick.Stop()
			for {
				cctx, ccancel := context.WithTimeout(kctx, ttl/2)
				r, err := leader.SessionsAs(h.proxy).KeepAliveSession(cctx, &adminv1.KeepAliveSessionRequest{ProxyId: h.proxy, SessionId: h.id})
				ccancel()
				if err == nil && !r.GetRenewed() {
					keepRefused.Add(1)
					t.Errorf("keepalive of session %d refused: %v", h.id, r.GetRefusal())
				}
				select {
				case <-kctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}

	ramp := runRenewLoad(ctx, t, bin, "-addr", leader.GRPCAddr, "-sessions", sessionsArg, "-rate", "0", "-workers", "256", "-for", "3s", "-timeout", "2s")
	ceiling := float64(ramp.Renewed) / ramp.Seconds
	t.Logf("ramp: %d keepalives renewed in %.1fs: C = %.0f/s (errors %v, refused %d)", ramp.Renewed, ramp.Seconds, ceiling, ramp.Errors, ramp.Refused)
	if ramp.Refused > 0 || ceiling < 100 {
		t.Fatalf("the ramp: %d refused, %.0f/s renewed; refusals: %v", ramp.Refused, ceiling, ramp.Refusals)
	}
	termBefore := metricValue(t, leader, "prism_admin_raft_term")

	// The probe: an acquire of a free mailbox every 250 ms through the
	// leader, during the load and after it until granted.
	probeMailbox := placed[probeProxy][0]
	type probe struct {
		at   time.Duration
		code codes.Code
		hint time.Duration
	}
	var probes []probe
	loadStart := time.Now()
	loadDone := make(chan loadResult, 1)
	go func() {
		loadDone <- runRenewLoad(ctx, t, bin, "-addr", leader.GRPCAddr, "-sessions", sessionsArg, "-rate", strconv.Itoa(int(3*ceiling)),
			"-for", loadFor.String(), "-timeout", "2s")
	}()
	var (
		granted   time.Duration
		load      loadResult
		loadEnded time.Duration
	)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for granted == 0 && (loadEnded == 0 || time.Since(loadStart) < loadEnded+10*time.Second) {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		at := time.Since(loadStart)
		r, err := leader.SessionsAs(probeProxy).AcquireLeases(actx, &adminv1.AcquireLeasesRequest{ProxyId: probeProxy, SessionId: probeID, MailboxIds: []string{probeMailbox}})
		acancel()
		p := probe{at: at, code: status.Code(err)}
		if st, ok := status.FromError(err); ok {
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					p.hint = ri.GetRetryDelay().AsDuration()
				}
			}
		}
		probes = append(probes, p)
		if err == nil && len(r.GetResults()) == 1 && r.GetResults()[0].GetOk() {
			if loadEnded == 0 {
				// Granted under load: release it so the next probe is new work again.
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = leader.SessionsAs(probeProxy).ReleaseLeases(rctx, &adminv1.ReleaseLeasesRequest{ProxyId: probeProxy, SessionId: probeID, MailboxIds: []string{probeMailbox}})
				rcancel()
			} else {
				granted = at
			}
		}
		select {
		case load = <-loadDone:
			loadEnded = time.Since(loadStart)
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the probe: %v", ctx.Err())
		}
	}
	if loadEnded == 0 {
		load = <-loadDone
		loadEnded = time.Since(loadStart)
	}
	sentRate := float64(load.Sent) / load.Seconds
	t.Logf("load: %.0f/s sent for %.1fs (%.2fx C), %d renewed (%.0f/s), %d refused, errors %v; longest a session went between renewed sends %.0f ms",
		sentRate, load.Seconds, sentRate/ceiling, load.Renewed, float64(load.Renewed)/load.Seconds, load.Refused, load.Errors, load.MaxGapMs)
	shed, hinted := 0, 0
	for _, p := range probes {
		if p.at < loadEnded && p.code == codes.ResourceExhausted {
			shed++
			if p.hint > 0 {
				hinted++
			}
		}
	}
	t.Logf("probe acquires: %d, %d refused RESOURCE_EXHAUSTED during the load (%d with a retry hint); granted %s after the load began (it ended at %s)",
		len(probes), shed, hinted, granted.Round(time.Millisecond), loadEnded.Round(time.Millisecond))
	stopKeep()
	keepers.Wait()

	if sentRate < 2.7*ceiling {
		t.Errorf("the load reached only %.2fx the ceiling: the generator, not the leader, was the limit", sentRate/ceiling)
	}
	if load.Refused > 0 || keepRefused.Load() > 0 {
		t.Errorf("keepalives of live sessions refused under load: %d of the load's (%v), %d of the holders'", load.Refused, load.Refusals, keepRefused.Load())
	}
	// The holder's own view: it never went a ttl without a renewal it
	// could count from. A leader change (a stall of the shared machine
	// longer than raft's leader lease) makes that a failover figure, where
	// the holder may rightly pause; its leases must still survive, as
	// checked below.
	termMoved := metricValue(t, leader, "prism_admin_raft_term") != termBefore
	if gap := time.Duration(load.MaxGapMs * float64(time.Millisecond)); gap >= ttl {
		if termMoved {
			t.Logf("a session went %s between renewed sends, across a leader change", gap)
		} else {
			t.Errorf("a session went %s between the sends of renewed keepalives, past its ttl %s: its holder stopped serving", gap, ttl)
		}
	}
	if shed == 0 || hinted != shed {
		t.Errorf("%d new acquires refused RESOURCE_EXHAUSTED under load, %d with a retry hint: want some, all hinted", shed, hinted)
	}
	shedCounted := 0.0
	for _, n := range c.Nodes {
		shedCounted += metricValue(t, n, `prism_admin_shed_total{method="AcquireLeases"}`)
	}
	if shedCounted < float64(shed) {
		t.Errorf("prism_admin_shed_total{method=\"AcquireLeases\"} = %v over the nodes, want >= %d", shedCounted, shed)
	}
	if granted == 0 {
		t.Errorf("no acquire granted within 10 s after the load ended")
	}
	if termMoved {
		t.Logf("the raft term moved from %v under load", termBefore)
	}
	for _, h := range hs {
		r, err := leader.Admin().GetSession(ctx, &adminv1.GetSessionRequest{SessionId: h.id, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
		if err != nil || int(r.GetSession().GetLeaseCount()) != h.n {
			t.Errorf("session %d of %s after the load: %d leases (err %v), want %d", h.id, h.proxy, r.GetSession().GetLeaseCount(), err, h.n)
		}
	}
	ls, err := leader.Admin().ListSessions(ctx, &adminv1.ListSessionsRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		t.Fatalf("list sessions: %v", err)
	}
	if got := len(ls.GetSessions()); got != len(all) {
		t.Errorf("%d sessions after the load, want %d", got, len(all))
	}
	for _, n := range c.Nodes {
		if v := metricValue(t, n, "prism_admin_lease_expirations_total"); v != 0 {
			t.Errorf("%s expired %v leases under load", n.ID, v)
		}
	}
}
