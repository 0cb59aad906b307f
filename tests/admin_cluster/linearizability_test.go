package admincluster

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The lease table as a porcupine model: per mailbox, at most one runner
// holds the lease, and only the runner its proxy registered may acquire it.
// Leases are long (no expiry during the test), so the model has no clock:
// register names the proxy's runner; acquire by that runner takes a free
// mailbox or reconnects its holder, by any other is refused NOT_PROXY_RUNNER;
// heartbeat and release succeed only for the holder, and every refusal must
// be the one the model's state implies (a denial must name the holder).

type opKind int

const (
	opAcquire opKind = iota
	opHeartbeat
	opRelease
	opRegister // the mailbox's proxy registers runner as its runner
)

func (k opKind) String() string { return [...]string{"acquire", "heartbeat", "release", "register"}[k] }

// linState is one mailbox: its holder and its proxy's registered runner.
type linState struct{ holder, registered string }

type linInput struct {
	kind    opKind
	mailbox string
	runner  string
}

type linOutput struct {
	unknown bool // the call failed: it may or may not have taken effect
	ok      bool // granted, renewed or released
	reason  adminv1.LeaseRefusalReason
	holder  string // the holder named by a refusal
}

// effect is the state after the operation if it took effect.
func effect(s linState, in linInput) linState {
	switch in.kind {
	case opAcquire:
		if s.registered == in.runner && (s.holder == "" || s.holder == in.runner) {
			s.holder = in.runner
		}
	case opRelease:
		if s.holder == in.runner {
			s.holder = ""
		}
	case opRegister:
		s.registered = in.runner
	}
	return s
}

func leaseStep(state, input, output any) []any {
	s, in, out := state.(linState), input.(linInput), output.(linOutput)
	if out.unknown {
		return []any{s, effect(s, in)}
	}
	holder := s.holder
	held := holder != ""
	mine := holder == in.runner
	switch in.kind {
	case opRegister:
		if out.ok {
			return []any{effect(s, in)}
		}
	case opAcquire:
		if s.registered != in.runner {
			if !out.ok && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER && out.holder == holder {
				return []any{s}
			}
			return nil
		}
		if out.ok && (!held || mine) {
			return []any{effect(s, in)}
		}
		if !out.ok && held && !mine && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER && out.holder == holder {
			return []any{s}
		}
	case opHeartbeat:
		switch {
		case out.ok && mine,
			!out.ok && held && !mine && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER,
			!out.ok && !held && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_LEASE:
			return []any{s}
		}
	case opRelease:
		switch {
		case out.ok && mine:
			return []any{effect(s, in)}
		case !out.ok && held && !mine && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER,
			!out.ok && !held && out.reason == adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNSPECIFIED:
			return []any{s}
		}
	}
	return nil
}

var leaseModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range h {
			mb := op.Input.(linInput).mailbox
			by[mb] = append(by[mb], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range by {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{linState{}} },
	Step: leaseStep,
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		res := fmt.Sprintf("ok=%v", out.ok)
		if out.unknown {
			res = "unknown"
		} else if !out.ok {
			res = fmt.Sprintf("%s %s", out.reason, out.holder)
		}
		return fmt.Sprintf("%s(%s, %s) -> %s", in.kind, in.mailbox, in.runner, res)
	},
	DescribeState: func(s any) string {
		return fmt.Sprintf("holder=%q registered=%q", s.(linState).holder, s.(linState).registered)
	},
}

func TestLeaseLinearizabilityUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	c.AwaitLeader()
	const (
		clients   = 8
		mailboxes = 4
		runFor    = 19 * time.Second
		maxOps    = 4000
		// Pace each client so the history spans every fault and stays small
		// enough to check.
		pace = 5 * time.Millisecond
	)
	start := time.Now()
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		unknown int
	)
	// One proxy per mailbox, registered by a client of its own before the
	// load (so the history starts from a known registration), and a
	// namespace placed on each.
	mbox := make([]string, mailboxes)
	for i := range mailboxes {
		in := linInput{kind: opRegister, mailbox: fmt.Sprintf("p%d", i), runner: fmt.Sprintf("r%d", i)}
		call := int64(time.Since(start))
		registerRunner(ctx, t, c, in.mailbox, in.runner)
		history = append(history, porcupine.Operation{ClientId: clients + i, Input: in, Call: call, Output: linOutput{ok: true}, Return: int64(time.Since(start))})
	}
	for i := range mailboxes {
		mbox[i] = placedMailbox(ctx, t, c, fmt.Sprintf("p%d", i), fmt.Sprintf("lin-p%d", i), &adminv1.NamespaceConfig{
			Topics: []string{"t"}, Lease: &adminv1.LeaseConfig{Ttl: durationpb.New(time.Hour)},
		})
	}
	// The model partitions by mailbox: the setup's registrations name the
	// mailbox of their proxy.
	for i := range history {
		in := history[i].Input.(linInput)
		in.mailbox = mbox[i]
		history[i].Input = in
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, runFor)
	defer stopLoad()
	record := func(client int, in linInput, call time.Time, out linOutput) {
		ret := int64(time.Since(start))
		if out.unknown {
			ret = math.MaxInt64
		}
		mu.Lock()
		defer mu.Unlock()
		if out.unknown {
			unknown++
		}
		history = append(history, porcupine.Operation{ClientId: client, Input: in, Call: int64(call.Sub(start)), Output: out, Return: ret})
	}
	var wg sync.WaitGroup
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(k), 42))
			runner := fmt.Sprintf("r%d", k)
			home := k % len(c.Nodes)
			for i := 0; i < maxOps && loadCtx.Err() == nil; i++ {
				in := linInput{mailbox: mbox[rng.IntN(mailboxes)], runner: runner}
				switch p := rng.IntN(20); {
				case p < 8:
					in.kind = opAcquire
				case p < 14:
					in.kind = opHeartbeat
				case p < 18:
					in.kind = opRelease
				default:
					in.kind = opRegister
				}
				n := c.Nodes[home]
				call := time.Now()
				actx, acancel := context.WithTimeout(loadCtx, time.Second)
				out, err := doLeaseOp(actx, n, in)
				acancel()
				if err != nil {
					// Heartbeats change no replicated state: a failed one is
					// simply not part of the history.
					if in.kind != opHeartbeat {
						record(k, in, call, linOutput{unknown: true})
					}
					home = (home + 1) % len(c.Nodes)
					continue
				}
				record(k, in, call, out)
				time.Sleep(pace)
			}
		}()
	}

	// Faults while the clients run: kill -9 the leader and restart it, then
	// cut the (new) leader off, then a follower, then pause the leader.
	type fault struct {
		at   time.Duration
		what string
		do   func()
	}
	var victim int
	faults := []fault{
		{2 * time.Second, "kill -9 leader", func() { victim = c.AwaitLeader(); c.Nodes[victim].Kill() }},
		{4 * time.Second, "restart it", func() { c.Nodes[victim].Restart() }},
		{6 * time.Second, "isolate leader", func() { victim = c.AwaitLeader(); c.Isolate(victim, true) }},
		{9 * time.Second, "heal", func() { c.Isolate(victim, false) }},
		{11 * time.Second, "isolate follower", func() { victim = c.Follower(c.AwaitLeader()); c.Isolate(victim, true) }},
		{13 * time.Second, "heal", func() { c.Isolate(victim, false) }},
		// A paused leader is replaced while it cannot notice; on SIGCONT the
		// calls queued on it (shorter than their 1 s timeout, so answered)
		// must not be answered from its old state.
		{14 * time.Second, "SIGSTOP leader", func() { victim = c.AwaitLeader(); c.Nodes[victim].Pause() }},
		{14800 * time.Millisecond, "SIGCONT", func() { c.Nodes[victim].Resume() }},
	}
	for _, f := range faults {
		if d := f.at - time.Since(start); d > 0 {
			time.Sleep(d)
		}
		f.do()
		t.Logf("%6s %s (%s)", time.Since(start).Round(time.Millisecond), f.what, c.Nodes[victim].ID)
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	var late int
	for _, op := range history {
		if time.Duration(op.Call) > 16*time.Second {
			late++
		}
	}
	t.Logf("history: %d operations, %d with unknown outcome, %d after the last fault", len(history), unknown, late)
	if late == 0 {
		t.Fatal("no operation ran after the faults: the history does not cover them")
	}
	if len(history) < 200 {
		t.Fatalf("only %d operations completed; the cluster was unavailable too long", len(history))
	}
	model := leaseModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, history, 120*time.Second)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Logf("porcupine timed out; history not proven linearizable")
	default:
		path := filepath.Join(os.TempDir(), fmt.Sprintf("prism-lease-linearizability-%d.html", time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("visualization: %s", path)
		}
		explain(t, model, history)
		t.Fatalf("lease history is not linearizable (%d operations)", len(history))
	}
}

// doLeaseOp runs one operation on one node; an error means the outcome is
// unknown (the node may have committed it before the error).
func doLeaseOp(ctx context.Context, n *e2e.AdminNode, in linInput) (linOutput, error) {
	proxy := in.mailbox[strings.LastIndex(in.mailbox, "@")+1:]
	cp := n.ControlAs(proxy)
	switch in.kind {
	case opRegister:
		_, err := cp.RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:9000", RunnerId: in.runner}})
		if err != nil {
			return linOutput{}, err
		}
		return linOutput{ok: true}, nil
	case opAcquire:
		r, err := cp.AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: in.mailbox, RunnerId: in.runner, RunnerAddress: "127.0.0.1:9000"})
		if err != nil {
			return linOutput{}, err
		}
		return linOutput{ok: r.GetGranted(), reason: r.GetRefusal().GetReason(), holder: r.GetRefusal().GetCurrent().GetRunnerId()}, nil
	case opHeartbeat:
		r, err := cp.MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: in.mailbox, RunnerId: in.runner})
		if err != nil {
			return linOutput{}, err
		}
		return linOutput{ok: r.GetRenewed(), reason: r.GetRefusal().GetReason(), holder: r.GetRefusal().GetCurrent().GetRunnerId()}, nil
	default:
		r, err := cp.ReleaseLease(ctx, &adminv1.ReleaseLeaseRequest{MailboxId: in.mailbox, RunnerId: in.runner})
		if err != nil {
			return linOutput{}, err
		}
		return linOutput{ok: r.GetReleased(), reason: r.GetRefusal().GetReason(), holder: r.GetRefusal().GetCurrent().GetRunnerId()}, nil
	}
}

// TestLeaseModelRejectsSplitBrain checks the checker: histories that break
// the one-holder rule must be rejected, or a passing run proves nothing.
func TestLeaseModelRejectsSplitBrain(t *testing.T) {
	t.Parallel()
	acq := func(r string) linInput { return linInput{kind: opAcquire, mailbox: "m@p", runner: r} }
	reg := func(r string) linInput { return linInput{kind: opRegister, mailbox: "m@p", runner: r} }
	granted := linOutput{ok: true}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"two holders", []porcupine.Operation{
			{Input: reg("a"), Call: -2, Output: granted, Return: -1},
			{Input: acq("a"), Call: 0, Output: granted, Return: 1},
			{Input: reg("b"), Call: 1, Output: granted, Return: 2},
			{Input: acq("b"), Call: 2, Output: granted, Return: 3},
		}, porcupine.Illegal},
		{"grant to a runner the proxy did not register", []porcupine.Operation{
			{Input: reg("a"), Call: -2, Output: granted, Return: -1},
			{Input: acq("b"), Call: 0, Output: granted, Return: 1},
		}, porcupine.Illegal},
		{"registration changed under a holder", []porcupine.Operation{
			{Input: reg("a"), Call: -2, Output: granted, Return: -1},
			{Input: acq("a"), Call: 0, Output: granted, Return: 1},
			{Input: reg("b"), Call: 1, Output: granted, Return: 2},
			{Input: acq("a"), Call: 3, Output: linOutput{reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER, holder: "a"}, Return: 4},
			{Input: acq("b"), Call: 5, Output: linOutput{reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER, holder: "a"}, Return: 6},
		}, porcupine.Ok},
		{"renew after release", []porcupine.Operation{
			{Input: reg("a"), Call: -2, Output: granted, Return: -1},
			{Input: acq("a"), Call: 0, Output: granted, Return: 1},
			{Input: linInput{kind: opRelease, mailbox: "m@p", runner: "a"}, Call: 2, Output: linOutput{ok: true}, Return: 3},
			{Input: linInput{kind: opHeartbeat, mailbox: "m@p", runner: "a"}, Call: 4, Output: linOutput{ok: true}, Return: 5},
		}, porcupine.Illegal},
		{"denial names the wrong holder", []porcupine.Operation{
			{Input: reg("a"), Call: -2, Output: granted, Return: -1},
			{Input: acq("a"), Call: 0, Output: granted, Return: 1},
			{Input: reg("b"), Call: 1, Output: granted, Return: 2},
			{Input: acq("b"), Call: 2, Output: linOutput{reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER, holder: "c"}, Return: 3},
		}, porcupine.Illegal},
		{"concurrent acquires, one wins", []porcupine.Operation{
			{Input: reg("a"), Call: -4, Output: granted, Return: -3},
			{Input: acq("a"), Call: 0, Output: granted, Return: 10},
			{Input: reg("b"), Call: 0, Output: granted, Return: 10},
			{Input: acq("b"), Call: 1, Output: linOutput{reason: adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER, holder: "a"}, Return: 9},
		}, porcupine.Ok},
		{"unknown release may have happened", []porcupine.Operation{
			{Input: reg("a"), Call: -2, Output: granted, Return: -1},
			{Input: acq("a"), Call: 0, Output: granted, Return: 1},
			{Input: linInput{kind: opRelease, mailbox: "m@p", runner: "a"}, Call: 2, Output: linOutput{unknown: true}, Return: math.MaxInt64},
			{Input: reg("b"), Call: 3, Output: granted, Return: 4},
			{Input: acq("b"), Call: 4, Output: granted, Return: 5},
		}, porcupine.Ok},
	}
	for _, tc := range cases {
		if got := porcupine.CheckOperationsTimeout(leaseModel.ToModel(), tc.ops, 10*time.Second); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// explain logs, for each mailbox whose history is illegal, the operations
// around the point where the longest linearization gets stuck.
func explain(t *testing.T, model porcupine.Model, history []porcupine.Operation) {
	for _, part := range model.Partition(history) {
		res, info := porcupine.CheckOperationsVerbose(model, part, 60*time.Second)
		if res != porcupine.Illegal {
			continue
		}
		var longest []int
		for _, lin := range info.PartialLinearizations()[0] {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
		done := map[int]bool{}
		for _, i := range longest {
			done[i] = true
		}
		if len(longest) == 0 {
			t.Logf("%s: no operation can come first (%d operations)", part[0].Input.(linInput).mailbox, len(part))
		} else {
			last := longest[len(longest)-1]
			t.Logf("%s: stuck after %d of %d operations; last linearized: %s", part[0].Input.(linInput).mailbox, len(longest), len(part), describe(part[last]))
		}
		for _, i := range longest[max(0, len(longest)-6):] {
			t.Logf("  linearized %s", describe(part[i]))
		}
		var pending []porcupine.Operation
		for i, op := range part {
			if !done[i] {
				pending = append(pending, op)
			}
		}
		sort.Slice(pending, func(a, b int) bool { return pending[a].Call < pending[b].Call })
		for _, op := range pending[:min(8, len(pending))] {
			t.Logf("  not placed %s", describe(op))
		}
	}
}

func describe(op porcupine.Operation) string {
	ret := "never"
	if op.Return != math.MaxInt64 {
		ret = time.Duration(op.Return).String()
	}
	return fmt.Sprintf("[client %d, %s..%s] %s", op.ClientId, time.Duration(op.Call), ret, leaseModel.DescribeOperation(op.Input, op.Output))
}
