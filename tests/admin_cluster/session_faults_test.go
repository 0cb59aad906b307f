package admincluster

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// The lease table with sessions (docs/architecture.md#sessions) as a porcupine model, per
// mailbox: a proxy registers its runner; a runner opens sessions of the
// proxy only while it is the registered one; AcquireLeases in an open
// session grants a mailbox that is free or held by the session's runner
// (in any of its sessions: a restarted sidecar takes its mailboxes over)
// with an epoch above every earlier grant, and refuses it while another
// runner holds it or the session's runner is no longer registered;
// ReleaseLeases drops it only from the session that holds it; CloseSession
// ends the session with its leases; KeepAliveSession renews only an open
// session. A call naming a session that is not open is refused as a whole
// (UNKNOWN_SESSION). Sessions are long and kept alive, so the model has no
// expiry, and a bulk call's answer is split into one operation per mailbox,
// each judged in its own partition.

type sesKind int

const (
	sesRegister sesKind = iota
	sesOpen
	sesAcquire
	sesRelease
	sesKeepAlive
	sesClose
)

func (k sesKind) String() string {
	return [...]string{"register", "open", "acquire", "release", "keepalive", "close"}[k]
}

// sesState is one mailbox and what it needs of its proxy.
type sesState struct {
	registered string
	holder     string // runner holding the lease, "" when free
	session    uint64 // the holder's session
	epoch      uint64 // the highest epoch known to have been granted
	open       string // the proxy's open sessions the history knows of: ",id=runner" sorted by id
}

type sesInput struct {
	kind    sesKind
	mailbox string
	runner  string
	session uint64 // all but register and open
}

type sesOutput struct {
	unknown bool // failed: it may or may not have taken effect
	ok      bool // registered, opened, granted, released, renewed, closed
	whole   bool // the request as a whole was refused (UNKNOWN_SESSION)
	reason  adminv1.LeaseRefusalReason
	// The lease a per-mailbox refusal names.
	holder        string
	holderSession uint64
	epoch         uint64 // of a grant
	session       uint64 // of an open
}

func openRunner(open string, id uint64) (string, bool) {
	key := "," + strconv.FormatUint(id, 10) + "="
	i := strings.Index(open+",", key)
	if i < 0 {
		return "", false
	}
	rest := open[i+len(key):]
	if j := strings.IndexByte(rest, ','); j >= 0 {
		rest = rest[:j]
	}
	return rest, true
}

func withSession(open string, id uint64, runner string, add bool) string {
	var parts []string
	for _, p := range strings.Split(open, ",") {
		if p != "" && !strings.HasPrefix(p, strconv.FormatUint(id, 10)+"=") {
			parts = append(parts, p)
		}
	}
	if add {
		parts = append(parts, strconv.FormatUint(id, 10)+"="+runner)
	}
	slices.SortFunc(parts, func(a, b string) int {
		x, _ := strconv.ParseUint(a[:strings.IndexByte(a, '=')], 10, 64)
		y, _ := strconv.ParseUint(b[:strings.IndexByte(b, '=')], 10, 64)
		return int(x) - int(y)
	})
	if len(parts) == 0 {
		return ""
	}
	return "," + strings.Join(parts, ",")
}

// sesEffect is the state after in if it took effect with an unknown answer.
func sesEffect(s sesState, in sesInput) sesState {
	runner, open := openRunner(s.open, in.session)
	switch in.kind {
	case sesRegister:
		s.registered = in.runner
	case sesAcquire:
		if open && runner == s.registered && (s.holder == "" || s.holder == runner) {
			s.holder, s.session = runner, in.session
		}
	case sesRelease:
		if open && s.holder != "" && s.session == in.session {
			s.holder, s.session = "", 0
		}
	case sesClose:
		if open {
			s.open = withSession(s.open, in.session, "", false)
			if s.session == in.session {
				s.holder, s.session = "", 0
			}
		}
	}
	return s
}

const (
	reasonUnknownSession = adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION
	reasonNotRunner      = adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER
	reasonHeld           = adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER
)

func sesStep(state, input, output any) []any {
	s, in, out := state.(sesState), input.(sesInput), output.(sesOutput)
	if out.unknown {
		return []any{s, sesEffect(s, in)}
	}
	runner, open := openRunner(s.open, in.session)
	refusedWhole := !out.ok && out.whole && out.reason == reasonUnknownSession
	switch in.kind {
	case sesRegister:
		if out.ok {
			return []any{sesEffect(s, in)}
		}
	case sesOpen:
		if _, taken := openRunner(s.open, out.session); out.ok && out.session != 0 && !taken && s.registered == in.runner {
			s.open = withSession(s.open, out.session, in.runner, true)
			return []any{s}
		}
		if !out.ok && out.reason == reasonNotRunner && s.registered != in.runner {
			return []any{s}
		}
	case sesAcquire:
		switch {
		case !open:
			if refusedWhole {
				return []any{s}
			}
		case runner != s.registered:
			if !out.ok && !out.whole && out.reason == reasonNotRunner && out.holder == s.holder {
				return []any{s}
			}
		case s.holder != "" && s.holder != runner:
			if !out.ok && !out.whole && out.reason == reasonHeld && out.holder == s.holder && out.holderSession == s.session {
				return []any{s}
			}
		default:
			if out.ok && out.epoch > s.epoch {
				s.holder, s.session, s.epoch = runner, in.session, out.epoch
				return []any{s}
			}
		}
	case sesRelease:
		switch {
		case !open:
			if refusedWhole {
				return []any{s}
			}
		case s.holder == "":
			if !out.ok && !out.whole && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNSPECIFIED {
				return []any{s}
			}
		case s.session != in.session:
			if !out.ok && !out.whole && out.reason == reasonUnknownSession && out.holderSession == s.session {
				return []any{s}
			}
		default:
			if out.ok {
				return []any{sesEffect(s, in)}
			}
		}
	case sesKeepAlive:
		if (open && out.ok) || (!open && !out.ok && out.reason == reasonUnknownSession) {
			return []any{s}
		}
	case sesClose:
		if out.ok == open {
			return []any{sesEffect(s, in)}
		}
	}
	return nil
}

var sessionModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			mb := op.Input.(sesInput).mailbox
			if by[mb] == nil {
				keys = append(keys, mb)
			}
			by[mb] = append(by[mb], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []any { return []any{sesState{}} },
	Step: sesStep,
	DescribeOperation: func(input, output any) string {
		in, out := input.(sesInput), output.(sesOutput)
		res := fmt.Sprintf("ok=%v", out.ok)
		switch {
		case out.unknown:
			res = "unknown"
		case !out.ok:
			res = fmt.Sprintf("%s whole=%v holder=%s/%d", out.reason, out.whole, out.holder, out.holderSession)
		case out.epoch != 0:
			res += fmt.Sprintf(" epoch=%d", out.epoch)
		case out.session != 0:
			res += fmt.Sprintf(" session=%d", out.session)
		}
		return fmt.Sprintf("%s(%s, %s, s%d) -> %s", in.kind, in.mailbox, in.runner, in.session, res)
	},
	DescribeState: func(st any) string {
		s := st.(sesState)
		return fmt.Sprintf("registered=%s holder=%s/%d epoch=%d open=%s", s.registered, s.holder, s.session, s.epoch, s.open)
	},
}

// TestSessionModelRejectsSplitBrain checks the checker: histories that break
// a property must be rejected, or a passing run proves nothing.
func TestSessionModelRejectsSplitBrain(t *testing.T) {
	t.Parallel()
	const mb = "m@p"
	op := func(kind sesKind, runner string, session uint64, call, ret int64, out sesOutput) porcupine.Operation {
		return porcupine.Operation{Input: sesInput{kind: kind, mailbox: mb, runner: runner, session: session}, Call: call, Output: out, Return: ret}
	}
	ok := sesOutput{ok: true}
	opened := func(id uint64) sesOutput { return sesOutput{ok: true, session: id} }
	granted := func(epoch uint64) sesOutput { return sesOutput{ok: true, epoch: epoch} }
	setup := []porcupine.Operation{
		op(sesRegister, "a", 0, -10, -9, ok),
		op(sesOpen, "a", 0, -8, -7, opened(1)),
		op(sesAcquire, "a", 1, -6, -5, granted(2)),
	}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"two runners hold", []porcupine.Operation{
			op(sesRegister, "b", 0, 0, 1, ok),
			op(sesOpen, "b", 0, 2, 3, opened(3)),
			op(sesAcquire, "b", 3, 4, 5, granted(4)),
		}, porcupine.Illegal},
		{"the other runner is refused, naming the holder", []porcupine.Operation{
			op(sesRegister, "b", 0, 0, 1, ok),
			op(sesOpen, "b", 0, 2, 3, opened(3)),
			op(sesAcquire, "b", 3, 4, 5, sesOutput{reason: reasonHeld, holder: "a", holderSession: 1}),
		}, porcupine.Ok},
		{"epoch goes back on a reconnect", []porcupine.Operation{
			op(sesOpen, "a", 0, 0, 1, opened(3)),
			op(sesAcquire, "a", 3, 2, 3, granted(2)),
		}, porcupine.Illegal},
		{"a new session of the holder's runner takes it over", []porcupine.Operation{
			op(sesOpen, "a", 0, 0, 1, opened(3)),
			op(sesAcquire, "a", 3, 2, 3, granted(4)),
			op(sesRelease, "a", 1, 4, 5, sesOutput{reason: reasonUnknownSession, holder: "a", holderSession: 3}),
		}, porcupine.Ok},
		{"keepalive renewed after the close", []porcupine.Operation{
			op(sesClose, "a", 1, 0, 1, ok),
			op(sesKeepAlive, "a", 1, 2, 3, ok),
		}, porcupine.Illegal},
		{"grant in a closed session", []porcupine.Operation{
			op(sesClose, "a", 1, 0, 1, ok),
			op(sesAcquire, "a", 1, 2, 3, granted(5)),
		}, porcupine.Illegal},
		{"the close freed the mailbox", []porcupine.Operation{
			op(sesClose, "a", 1, 0, 1, ok),
			op(sesRegister, "b", 0, 2, 3, ok),
			op(sesOpen, "b", 0, 4, 5, opened(3)),
			op(sesAcquire, "b", 3, 6, 7, granted(4)),
		}, porcupine.Ok},
		{"an unknown close may have happened", []porcupine.Operation{
			op(sesClose, "a", 1, 0, math.MaxInt64, sesOutput{unknown: true}),
			op(sesKeepAlive, "a", 1, 2, 3, sesOutput{reason: reasonUnknownSession, whole: true}),
		}, porcupine.Ok},
		{"open by a runner not registered", []porcupine.Operation{
			op(sesOpen, "b", 0, 0, 1, opened(3)),
		}, porcupine.Illegal},
	}
	for _, tc := range cases {
		ops := append(slices.Clone(setup), tc.ops...)
		if got := porcupine.CheckOperationsTimeout(sessionModel.ToModel(), ops, 10*time.Second); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// sessionCluster is three voters that keep idle proxies placed for the
// whole test (the clients heartbeat no proxy).
func sessionCluster(t *testing.T) *e2e.AdminCluster {
	t.Helper()
	return e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, RaftFaults: true, Args: []string{
		"--snapshot-threshold", "512", "--trailing-logs", "256", "--stale-proxy-after", "10m",
	}})
}

// TestSessionLeasesUnderFaults: the lease safety properties with sessions,
// under pauses and kills of the leader, through every node of three real admin
// processes. While clients open, keep alive, acquire, release and close
// sessions through every node, the leader is paused with SIGSTOP for longer
// than the election timeout (with keepalives queued on it) and killed with
// kill -9, three times each. Checked:
//   - the clients' history is linearizable under sessionModel (one holder
//     per mailbox, epochs only rise, nothing renewed or granted in a closed
//     session);
//   - in each pause, a holder whose keepalives all go to the paused leader
//     and a contender granted the mailbox through the others never overlap,
//     with the holder's validity counted from its keepalives' send times;
//     a session closed while its keepalive was queued on the paused leader
//     is not renewed after the close; the contender's epoch is higher;
//   - a short-ttl session kept alive through any node loses nothing across
//     every fault.
func TestSessionLeasesUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	c := sessionCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	c.AwaitLeader()
	const (
		pauses, kills = 3, 3
		// The pause cycles' timing, as in TestPausedNodeRenewsNothingStale.
		ttl   = 2 * time.Second
		grace = 500 * time.Millisecond
		pause = 1800 * time.Millisecond
		every = 100 * time.Millisecond
	)
	short := &adminv1.NamespaceConfig{Topics: []string{"t"}, Lease: e2e.Lease{TTL: ttl, Grace: grace, Heartbeat: every}.Config()}
	long := &adminv1.NamespaceConfig{Topics: []string{"t"}, Lease: &adminv1.LeaseConfig{Ttl: durationpb.New(time.Hour)}}

	// Every proxy is registered before any namespace is placed, so no
	// later registration moves a namespace: two proxies for the model's
	// clients (two mailboxes each), one for the steady holder, two per
	// pause cycle.
	modelProxies := []string{"sp0", "sp1"}
	for _, p := range modelProxies {
		registerRunner(ctx, t, c, p, "init-"+p)
	}
	registerRunner(ctx, t, c, "steady", "steady")
	for i := range pauses {
		registerRunner(ctx, t, c, fmt.Sprintf("m-%d", i), "a")
		registerRunner(ctx, t, c, fmt.Sprintf("k-%d", i), "c")
	}
	mailboxesOf := map[string][]string{}
	for _, p := range modelProxies {
		for j := range 2 {
			mailboxesOf[p] = append(mailboxesOf[p], placedMailbox(ctx, t, c, p, fmt.Sprintf("ses-%s-%d", p, j), long))
		}
	}
	steadyMailbox := placedMailbox(ctx, t, c, "steady", "ses-steady", short)
	cycleMailboxes := make([][2]string, pauses)
	for i := range pauses {
		cycleMailboxes[i] = [2]string{
			placedMailbox(ctx, t, c, fmt.Sprintf("m-%d", i), fmt.Sprintf("ses-m-%d", i), short),
			placedMailbox(ctx, t, c, fmt.Sprintf("k-%d", i), fmt.Sprintf("ses-k-%d", i), short),
		}
	}

	start := time.Now()
	h := &sesHistory{start: start}
	// The registrations of the model's proxies start its history.
	for _, p := range modelProxies {
		call := time.Now()
		registerRunner(ctx, t, c, p, "r-"+p+"-0")
		h.add(0, sesInput{kind: sesRegister, runner: "r-" + p + "-0"}, mailboxesOf[p], call, []sesOutput{{ok: true}, {ok: true}})
	}

	steady := startSteady(ctx, t, c, "steady", steadyMailbox, ttl)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	const clientsPerProxy = 2
	for k := range clientsPerProxy * len(modelProxies) {
		p := modelProxies[k%len(modelProxies)]
		cl := &sesClient{id: k + 1, proxy: p, runner: fmt.Sprintf("r-%s-%d", p, k/len(modelProxies)), mailboxes: mailboxesOf[p],
			c: c, h: h, rng: rand.New(rand.NewPCG(uint64(k), 7)), home: k % len(c.Nodes)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl.run(loadCtx, 1500)
		}()
	}

	var handoffs, queued int
	for i := range max(pauses, kills) {
		if i < pauses {
			lead := c.AwaitLeader()
			r := sessionPauseCycle(t, c, lead, fmt.Sprint(i), cycleMailboxes[i], ttl, pause, every)
			t.Logf("%6s pause cycle %d on %s: %d keepalives queued, handoff %v", time.Since(start).Round(time.Millisecond), i, c.Nodes[lead].ID, r.queued, r.handoff)
			queued += r.queued
			if r.handoff {
				handoffs++
			}
		}
		if i < kills {
			lead := c.AwaitLeader()
			c.Nodes[lead].Kill()
			next := c.AwaitLeader(lead)
			t.Logf("%6s kill -9 %s; %s leads", time.Since(start).Round(time.Millisecond), c.Nodes[lead].ID, c.Nodes[next].ID)
			time.Sleep(time.Second)
			c.Nodes[lead].Restart()
			awaitRejoined(t, c, lead)
		}
	}
	// Some load after the last fault, then the steady holder's verdict.
	time.Sleep(2 * time.Second)
	stopLoad()
	wg.Wait()
	steady.stopAndCheck(t, c)

	if queued < pauses*int(pause/every)/2 {
		t.Errorf("only %d keepalives were sent to the paused leaders: the cycles did not exercise the fault", queued)
	}
	if handoffs == 0 {
		t.Errorf("the contender was granted the mailbox in none of %d pause cycles: the overlap check never bit", pauses)
	}
	h.check(t)
}

// sesHistory is the clients' history for sessionModel.
type sesHistory struct {
	start   time.Time
	mu      sync.Mutex
	ops     []porcupine.Operation
	unknown int
}

// add records one call answered for each of mailboxes (outs[i] is
// mailboxes[i]'s answer), or unknown when outs is nil.
func (h *sesHistory) add(client int, in sesInput, mailboxes []string, call time.Time, outs []sesOutput) {
	ret := int64(time.Since(h.start))
	h.mu.Lock()
	defer h.mu.Unlock()
	if outs == nil {
		h.unknown++
		ret = math.MaxInt64
	}
	for i, mb := range mailboxes {
		out := sesOutput{unknown: true}
		if outs != nil {
			out = outs[i]
		}
		in.mailbox = mb
		h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: int64(call.Sub(h.start)), Output: out, Return: ret})
	}
}

func (h *sesHistory) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	kinds := map[string]int{}
	for _, op := range h.ops {
		out := op.Output.(sesOutput)
		if !out.unknown && out.ok {
			kinds[op.Input.(sesInput).kind.String()]++
		}
	}
	t.Logf("session history: %d per-mailbox operations, %d calls with unknown outcome; succeeded: %v", len(h.ops), h.unknown, kinds)
	if kinds["acquire"] < 20 || kinds["keepalive"] < 20 || kinds["close"] < 5 || kinds["release"] < 5 {
		t.Fatalf("too few successful operations to judge: %v", kinds)
	}
	model := sessionModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, 120*time.Second)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Logf("porcupine timed out; the session history is not proven linearizable")
	default:
		path := filepath.Join(os.TempDir(), fmt.Sprintf("prism-session-linearizability-%d.html", time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("visualization: %s", path)
		}
		t.Fatalf("session history is not linearizable (%d operations)", len(h.ops))
	}
}

// sesClient is one sidecar-like client of a proxy: at most one session of
// its own at a time, kept alive at least every second (so it never
// expires), with acquires, releases, closes and registrations of its
// runner at random, through one node until that node fails it.
type sesClient struct {
	id        int
	proxy     string
	runner    string
	mailboxes []string
	c         *e2e.AdminCluster
	h         *sesHistory
	rng       *rand.Rand
	home      int

	session   uint64
	closing   bool // the session's close has an unknown outcome: close again
	keptAlive time.Time
}

// run issues up to maxOps calls until ctx ends.
func (cl *sesClient) run(ctx context.Context, maxOps int) {
	for i := 0; i < maxOps && ctx.Err() == nil; i++ {
		in := sesInput{runner: cl.runner, session: cl.session}
		mbs := cl.mailboxes
		switch p := cl.rng.IntN(20); {
		case cl.session == 0 && p < 5:
			in.kind = sesRegister
		case cl.session == 0:
			in.kind = sesOpen
		case cl.closing || (p < 1):
			in.kind = sesClose
		case time.Since(cl.keptAlive) > time.Second || p < 5:
			in.kind = sesKeepAlive
		case p < 12:
			in.kind = sesAcquire
			if cl.rng.IntN(2) == 0 {
				mbs = mbs[cl.rng.IntN(len(mbs)):][:1]
			}
		case p < 17:
			in.kind = sesRelease
			if cl.rng.IntN(2) == 0 {
				mbs = mbs[cl.rng.IntN(len(mbs)):][:1]
			}
		default:
			in.kind = sesRegister
		}
		n := cl.c.Nodes[cl.home]
		call := time.Now()
		// Longer than a pause, so calls queued on a paused leader are
		// answered after it resumes, not abandoned.
		actx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
		outs, err := cl.do(actx, n, in, mbs)
		cancel()
		switch {
		case status.Code(err) == codes.ResourceExhausted:
			// Refused before anything was proposed (quota or shedding).
			time.Sleep(100 * time.Millisecond)
			continue
		case err != nil:
			cl.home = (cl.home + 1) % len(cl.c.Nodes)
			// An open with an unknown outcome made at most a session
			// nobody holds; a keepalive changes nothing replicated.
			if in.kind != sesOpen && in.kind != sesKeepAlive {
				cl.h.add(cl.id, in, mbs, call, nil)
			}
			if in.kind == sesClose {
				cl.closing = true
			}
			continue
		}
		cl.h.add(cl.id, in, mbs, call, outs)
		switch o := outs[0]; {
		case in.kind == sesOpen && o.ok:
			cl.session, cl.keptAlive = o.session, call
		case in.kind == sesClose, o.whole, in.kind == sesKeepAlive && !o.ok:
			cl.session, cl.closing = 0, false
		case in.kind == sesKeepAlive && o.ok:
			cl.keptAlive = call
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// do runs one call on n and returns one answer per mailbox of mbs.
func (cl *sesClient) do(ctx context.Context, n *e2e.AdminNode, in sesInput, mbs []string) ([]sesOutput, error) {
	same := func(o sesOutput) []sesOutput {
		out := make([]sesOutput, len(mbs))
		for i := range out {
			out[i] = o
		}
		return out
	}
	perMailbox := func(results []*adminv1.MailboxLeaseResult, refusal *adminv1.LeaseRefusal) ([]sesOutput, error) {
		if refusal != nil {
			return same(sesOutput{whole: true, reason: refusal.GetReason()}), nil
		}
		if len(results) != len(mbs) {
			return nil, fmt.Errorf("%d results for %d mailboxes", len(results), len(mbs))
		}
		out := make([]sesOutput, len(mbs))
		for i, r := range results {
			out[i] = sesOutput{ok: r.GetOk(), reason: r.GetRefusal().GetReason(), epoch: r.GetLease().GetEpoch(),
				holder: r.GetRefusal().GetCurrent().GetRunnerId(), holderSession: r.GetRefusal().GetCurrent().GetSessionId()}
		}
		return out, nil
	}
	ss := n.SessionsAs(cl.proxy)
	switch in.kind {
	case sesRegister:
		_, err := n.ControlAs(cl.proxy).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: cl.proxy, Address: "127.0.0.1:9000", RunnerId: cl.runner}})
		if err != nil {
			return nil, err
		}
		return same(sesOutput{ok: true}), nil
	case sesOpen:
		r, err := ss.OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: cl.proxy, RunnerId: cl.runner, RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(10 * time.Second)})
		if err != nil {
			return nil, err
		}
		return same(sesOutput{ok: r.GetSession() != nil, session: r.GetSession().GetId(), reason: r.GetRefusal().GetReason()}), nil
	case sesAcquire:
		r, err := ss.AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: cl.proxy, SessionId: in.session, MailboxIds: mbs})
		if err != nil {
			return nil, err
		}
		return perMailbox(r.GetResults(), r.GetRefusal())
	case sesRelease:
		r, err := ss.ReleaseLeases(ctx, &adminv1.ReleaseLeasesRequest{ProxyId: cl.proxy, SessionId: in.session, MailboxIds: mbs})
		if err != nil {
			return nil, err
		}
		return perMailbox(r.GetResults(), r.GetRefusal())
	case sesKeepAlive:
		r, err := ss.KeepAliveSession(ctx, &adminv1.KeepAliveSessionRequest{ProxyId: cl.proxy, SessionId: in.session})
		if err != nil {
			return nil, err
		}
		return same(sesOutput{ok: r.GetRenewed(), reason: r.GetRefusal().GetReason()}), nil
	default:
		r, err := ss.CloseSession(ctx, &adminv1.CloseSessionRequest{ProxyId: cl.proxy, SessionId: in.session})
		if err != nil {
			return nil, err
		}
		return same(sesOutput{ok: r.GetClosed()}), nil
	}
}

// steadyHolder is a session with a short ttl holding one mailbox, kept
// alive every ttl/8 through whichever node answers (each attempt bounded
// well under ttl, as a sidecar's), for the whole test.
type steadyHolder struct {
	proxy, mailbox string
	session, epoch uint64
	stop           context.CancelFunc
	done           chan struct{}
	mu             sync.Mutex
	refusals       []string
	renewed        int
}

func startSteady(ctx context.Context, t *testing.T, c *e2e.AdminCluster, proxy, mailbox string, ttl time.Duration) *steadyHolder {
	t.Helper()
	s := &steadyHolder{proxy: proxy, mailbox: mailbox, done: make(chan struct{})}
	open, err := anyNode(ctx, c, 0, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.OpenSessionResponse, error) {
		return n.SessionsAs(proxy).OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: proxy, RunnerId: proxy, RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(ttl)})
	})
	if err != nil || open.GetSession() == nil {
		t.Fatalf("open the steady session: %v %v", err, open.GetRefusal())
	}
	s.session = open.GetSession().GetId()
	acq, err := anyNode(ctx, c, 0, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.AcquireLeasesResponse, error) {
		return n.SessionsAs(proxy).AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: proxy, SessionId: s.session, MailboxIds: []string{mailbox}})
	})
	if err != nil || len(acq.GetResults()) != 1 || !acq.GetResults()[0].GetOk() {
		t.Fatalf("acquire %s in the steady session: %v %v", mailbox, err, acq)
	}
	s.epoch = acq.GetResults()[0].GetLease().GetEpoch()
	kctx, stop := context.WithCancel(ctx)
	s.stop = stop
	go func() {
		defer close(s.done)
		node := 0
		for i := 0; kctx.Err() == nil && i < 100_000; i++ {
			actx, cancel := context.WithTimeout(kctx, ttl/6)
			r, err := c.Nodes[node%len(c.Nodes)].SessionsAs(proxy).KeepAliveSession(actx, &adminv1.KeepAliveSessionRequest{ProxyId: proxy, SessionId: s.session})
			cancel()
			switch {
			case kctx.Err() != nil:
				return
			case err != nil:
				node++
				continue
			}
			s.mu.Lock()
			if r.GetRenewed() {
				s.renewed++
			} else {
				s.refusals = append(s.refusals, fmt.Sprintf("%s: %v", time.Now().Format(time.StampMilli), r.GetRefusal()))
			}
			s.mu.Unlock()
			select {
			case <-kctx.Done():
			case <-time.After(ttl / 8):
			}
		}
	}()
	return s
}

// stopAndCheck stops the keepalives and checks the session kept its lease
// with its epoch and was never refused.
func (s *steadyHolder) stopAndCheck(t *testing.T, c *e2e.AdminCluster) {
	t.Helper()
	s.stop()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("steady session %d: %d keepalives renewed, %d refused", s.session, s.renewed, len(s.refusals))
	if len(s.refusals) > 0 {
		t.Errorf("the steady session's keepalives were refused: %v", s.refusals)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := anyNode(ctx, c, 0, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.GetLeaseResponse, error) {
		return n.Admin().GetLease(ctx, &adminv1.GetLeaseRequest{MailboxId: s.mailbox, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	})
	if err != nil || l.GetLease().GetSessionId() != s.session || l.GetLease().GetEpoch() != s.epoch {
		t.Errorf("steady lease %s after the faults: %v (err %v), want session %d epoch %d", s.mailbox, l.GetLease(), err, s.session, s.epoch)
	}
}

type kaBeat struct {
	sent, answered time.Time
	resp           *adminv1.KeepAliveSessionResponse
	err            error
}

// sessionPauseCycle pauses the leader victim for longer than the election
// timeout, with sessions instead of per-mailbox leases:
// TestPausedNodeRenewsNothingStale's cycle. Session A (runner a, proxy
// m-<tag>) holds mailboxes[0] and keeps alive only through the victim;
// runner b (registered for m-<tag> once A holds it) acquires it through the
// others in a session of its own until granted. Session C1 (runner c)
// holds mailboxes[1]; during the pause c opens C2 through the others, takes
// the mailbox over (a newer epoch) and closes C1, with a keepalive of C1
// queued on the victim. Checked: no overlap of A and b, counted from the
// send times of A's renewed keepalives and of its acquire; no keepalive of
// C1 renewed after its close; every new grant's epoch above the old one.
func sessionPauseCycle(t *testing.T, c *e2e.AdminCluster, victim int, tag string, mailboxes [2]string, ttl, pause, every time.Duration) cycleResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	paused := c.Nodes[victim]
	m, k := mailboxes[0], mailboxes[1]
	pm, pk := proxyOf(m), proxyOf(k)
	others := func(attempt int) *e2e.AdminNode {
		return c.Nodes[(victim+1+attempt%(len(c.Nodes)-1))%len(c.Nodes)]
	}
	// Short attempts, so one stuck forwarding to the paused leader gives
	// way to the next within the pause.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }
	open := func(proxy, runner string) uint64 {
		for attempt := 0; ; attempt++ {
			actx, acancel := short()
			r, err := others(attempt).SessionsAs(proxy).OpenSession(actx, &adminv1.OpenSessionRequest{ProxyId: proxy, RunnerId: runner, RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(ttl)})
			acancel()
			if err == nil && r.GetSession() != nil {
				return r.GetSession().GetId()
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: open a session of %s as %s: %v %v", tag, proxy, runner, err, r.GetRefusal())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	acquire := func(attempt int, proxy string, session uint64, mailbox string) (*adminv1.Lease, time.Time) {
		actx, acancel := short()
		defer acancel()
		sent := time.Now()
		r, err := others(attempt).SessionsAs(proxy).AcquireLeases(actx, &adminv1.AcquireLeasesRequest{ProxyId: proxy, SessionId: session, MailboxIds: []string{mailbox}})
		if err != nil || len(r.GetResults()) != 1 || !r.GetResults()[0].GetOk() {
			return nil, sent
		}
		return r.GetResults()[0].GetLease(), sent
	}
	mustAcquire := func(proxy string, session uint64, mailbox string) (*adminv1.Lease, time.Time) {
		for attempt := 0; ; attempt++ {
			if l, sent := acquire(attempt, proxy, session, mailbox); l != nil {
				return l, sent
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: acquire %s in session %d: not granted", tag, mailbox, session)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	keepAlive := func(n *e2e.AdminNode, proxy string, session uint64, d time.Duration) kaBeat {
		kctx, kcancel := context.WithTimeout(ctx, d)
		defer kcancel()
		b := kaBeat{sent: time.Now()}
		b.resp, b.err = n.SessionsAs(proxy).KeepAliveSession(kctx, &adminv1.KeepAliveSessionRequest{ProxyId: proxy, SessionId: session})
		b.answered = time.Now()
		return b
	}

	registerRunner(ctx, t, c, pm, "a")
	sa := open(pm, "a")
	aLease, aSent := mustAcquire(pm, sa, m)
	sc1 := open(pk, "c")
	c1Lease, _ := mustAcquire(pk, sc1, k)
	registerRunner(ctx, t, c, pm, "b")
	sb := open(pm, "b")

	var (
		mu     sync.Mutex
		aBeats []kaBeat
		c1Old  []kaBeat
		wg     sync.WaitGroup
	)
	send := func(proxy string, session uint64, into *[]kaBeat) {
		defer wg.Done()
		b := keepAlive(paused, proxy, session, pause+5*time.Second)
		mu.Lock()
		*into = append(*into, b)
		mu.Unlock()
	}
	stopBeats := make(chan struct{})
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			wg.Add(1)
			go send(pm, sa, &aBeats)
			select {
			case <-stopBeats:
				return
			case <-tick.C:
			}
		}
	}()
	time.Sleep(3 * every)
	if st, err := paused.Status(ctx); err != nil || st.GetState() != "Leader" {
		close(stopBeats)
		<-beatsDone
		wg.Wait()
		t.Logf("%s: %s is %v (%v) before the pause: cycle skipped", tag, paused.ID, st.GetState(), err)
		return cycleResult{skipped: true}
	}
	paused.Pause()
	pausedAt := time.Now()
	wg.Add(1)
	go send(pk, sc1, &c1Old)

	// c moves k to a new session through the others and closes the old one.
	sc2 := open(pk, "c")
	c2Lease, _ := mustAcquire(pk, sc2, k)
	for attempt := 0; ; attempt++ {
		actx, acancel := short()
		r, err := others(attempt).SessionsAs(pk).CloseSession(actx, &adminv1.CloseSessionRequest{ProxyId: pk, SessionId: sc1})
		acancel()
		if err == nil {
			if !r.GetClosed() {
				t.Errorf("%s: close of session %d: already gone", tag, sc1)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: close session %d: %v", tag, sc1, err)
		}
	}
	c1ClosedAt := time.Now()

	// b tries m through the others until granted, keeping its own session
	// alive; a stops sending when the victim resumes.
	var bLease *adminv1.Lease
	resumed := false
	for attempt := 0; time.Since(pausedAt) < pause+3*ttl && (bLease == nil || !resumed); attempt++ {
		if !resumed && time.Since(pausedAt) >= pause {
			close(stopBeats)
			<-beatsDone
			paused.Resume()
			resumed = true
		}
		if bLease == nil {
			bLease, _ = acquire(attempt, pm, sb, m)
			keepAlive(others(attempt), pm, sb, 300*time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !resumed {
		close(stopBeats)
		<-beatsDone
		paused.Resume()
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	res := cycleResult{handoff: bLease != nil}
	aEnd := aSent.Add(ttl)
	for _, b := range aBeats {
		if b.sent.After(pausedAt) && b.sent.Before(pausedAt.Add(pause)) {
			res.queued++
		}
		if b.err == nil && b.resp.GetRenewed() && b.sent.Add(ttl).After(aEnd) {
			aEnd = b.sent.Add(ttl)
		}
	}
	if bLease != nil {
		if bStart := bLease.GetGrantedAt().AsTime(); bStart.Before(aEnd) {
			t.Errorf("%s: two holders of %s: session %d holds until %s (ttl after its last renewed keepalive was sent), b granted at %s (%s earlier); paused at %s",
				tag, m, sa, aEnd.Format(time.StampMicro), bStart.Format(time.StampMicro), aEnd.Sub(bStart), pausedAt.Format(time.StampMicro))
		}
		if bLease.GetEpoch() <= aLease.GetEpoch() {
			t.Errorf("%s: %s granted to b with epoch %d, not above a's %d", tag, m, bLease.GetEpoch(), aLease.GetEpoch())
		}
	}
	if c2Lease.GetEpoch() <= c1Lease.GetEpoch() {
		t.Errorf("%s: %s taken over with epoch %d, not above %d", tag, k, c2Lease.GetEpoch(), c1Lease.GetEpoch())
	}
	for _, b := range c1Old {
		if b.err == nil && b.resp.GetRenewed() && b.answered.After(c1ClosedAt) {
			t.Errorf("%s: closed session %d renewed at %s, after its close at %s", tag, sc1, b.answered.Format(time.StampMicro), c1ClosedAt.Format(time.StampMicro))
		}
	}
	var renewedLate int
	for _, b := range append(slices.Clone(aBeats), c1Old...) {
		if b.err == nil && b.resp.GetRenewed() && b.answered.After(pausedAt.Add(pause)) {
			renewedLate++
		}
	}
	t.Logf("%s: %s paused %s; %d keepalives to it, %d renewed after it resumed; b granted: %v", tag, paused.ID, pause, len(aBeats)+len(c1Old), renewedLate, bLease != nil)
	return res
}

// awaitRejoined waits until restarted node i follows a leader and has
// applied what that leader had committed when the wait began: a node that
// cannot start again on its own data dir after kill -9 fails the test here.
func awaitRejoined(t *testing.T, c *e2e.AdminCluster, i int) {
	t.Helper()
	lead := c.Nodes[c.AwaitLeader(i)]
	target := mustStatus(t, lead).GetCommitIndex()
	testwait.For(t, 30*time.Second, c.Nodes[i].ID+" to rejoin after its restart", func() (bool, string) {
		if !c.Nodes[i].Alive() {
			return false, "exited: " + c.Nodes[i].Tail(3)
		}
		st, err := c.Nodes[i].Status(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return st.GetLeaderId() != "" && st.GetAppliedIndex() >= target, fmt.Sprintf("applied %d of %d", st.GetAppliedIndex(), target)
	})
}
