package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestRefusedCommandsChangeNothing(t *testing.T) {
	t.Parallel()
	withNow := func(b []byte) []byte {
		now, _ := proto.Marshal(at(time.Hour))
		out := protowire.AppendTag(nil, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, now)
		return append(out, b...)
	}
	// Field 99 is a body a newer version might add.
	unknownBody := protowire.AppendTag(nil, 99, protowire.BytesType)
	unknownBody = protowire.AppendBytes(unknownBody, []byte{0x0a, 0x01, 'x'})
	marshal := func(cmd *adminv1.Command) []byte { b, _ := proto.Marshal(cmd); return b }
	bad := acquire("audit-logs@proxy-01", "runner-z")
	bad.Ttl = durationpb.New(2 * time.Hour)
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"garbage bytes", []byte{0xff, 0xff, 0xff}, ErrInvalid},
		{"empty command", nil, ErrUnknownCommand},
		{"only a timestamp", withNow(nil), ErrUnknownCommand},
		{"body from a newer version", withNow(unknownBody), ErrUnknownCommand},
		{"missing leader time", marshal(&adminv1.Command{Body: &adminv1.Command_DeleteNamespace{DeleteNamespace: &adminv1.DeleteNamespaceRequest{Namespace: ns}}}), ErrInvalid},
		{"mailbox id without @", marshal(c(time.Hour, acquire("audit-logs", "runner-z"))), ErrInvalid},
		{"mailbox id with two @", marshal(c(time.Hour, acquire("a@b@c", "runner-z"))), ErrInvalid},
		{"runner address without port", marshal(c(time.Hour, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerId: "r", RunnerAddress: "host"})), ErrInvalid},
		{"ttl above the bound", marshal(c(time.Hour, bad)), ErrInvalid},
		{"namespace without topics", marshal(c(time.Hour, createNS("empty"))), ErrInvalid},
		{"proxy id with a space", marshal(c(time.Hour, register("proxy 01"))), ErrInvalid},
		{"expire with epoch zero", marshal(c(time.Hour, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: "a@p"}}})), ErrInvalid},
		{"checkpoint without times", marshal(c(time.Hour, &adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{{MailboxId: "a@p", Epoch: 1}}})), ErrInvalid},
		{"heartbeat of unknown proxy", marshal(c(time.Hour, &adminv1.ProxyHeartbeatRequest{ProxyId: "ghost"})), ErrProxyNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, _, _, _ := base(t)
			_, ch := h.f.Changed()
			before := tables(t, h.f)
			res := h.applyBytes(tc.data)
			err, ok := res.(error)
			if !ok || !errors.Is(err, tc.want) {
				t.Fatalf("result %v, want error %v", res, tc.want)
			}
			if !bytes.Equal(before, tables(t, h.f)) {
				t.Fatal("state changed")
			}
			select {
			case <-ch:
				t.Fatal("change notification fired for a refused command")
			default:
			}
		})
	}
}

// randomLog is a deterministic, adversarial mix of every command type over a
// small id space, so grants, refusals, reconnects and stale expires collide.
func randomLog(seed uint64, n int) []*adminv1.Command {
	r := rand.New(rand.NewPCG(seed, seed))
	proxies := []string{"proxy-01", "proxy-02", "proxy-03", "proxy-04"}
	namespaces := []string{"a", "b", "c", "$admin", "audit-logs"}
	runners := []string{"r1", "r2", "r3"}
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	mailbox := func() string { return mailboxID(pick(namespaces), pick(proxies)) }
	// Mostly the proxy's usual runner, so acquires can be granted; now and
	// then another, so registrations change under held leases.
	runnerOf := func(proxy string) string {
		if r.IntN(4) == 0 {
			return pick(runners)
		}
		return runners[slices.Index(proxies, proxy)%len(runners)]
	}
	var out []*adminv1.Command
	for i := range n {
		d := time.Duration(i) * time.Second
		var body any
		switch r.IntN(9) {
		case 0:
			p := pick(proxies)
			body = registerRunner(p, runnerOf(p))
		case 1:
			body = &adminv1.ProxyHeartbeatRequest{ProxyId: pick(proxies)}
		case 2:
			body = &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: pick(proxies), LastSeen: at(time.Duration(r.IntN(i+1)) * time.Second)}}}
		case 3:
			body = createNS(pick(namespaces), "t")
		case 4:
			body = &adminv1.DeleteNamespaceRequest{Namespace: pick(namespaces)}
		case 5, 6:
			p := pick(proxies)
			body = acquire(mailboxID(pick(namespaces), p), runnerOf(p))
		case 7:
			body = &adminv1.ReleaseLeaseRequest{MailboxId: mailbox(), RunnerId: pick(runners)}
		default:
			body = &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: mailbox(), Epoch: uint64(r.IntN(i+1) + 1)}}}
		}
		out = append(out, c(d, body))
	}
	return out
}

func TestReplayIsDeterministic(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			log := randomLog(seed, 400)
			run := func() (*FSM, []string) {
				h := newHarness(t)
				var results []string
				for _, cmd := range log {
					results = append(results, fmt.Sprint(h.apply(cmd)))
				}
				return h.f, results
			}
			a, ra := run()
			b, rb := run()
			if !bytes.Equal(dump(t, a), dump(t, b)) {
				t.Fatal("same log, different state")
			}
			for i := range ra {
				if ra[i] != rb[i] {
					t.Fatalf("entry %d answered %q then %q", i+1, ra[i], rb[i])
				}
			}
			// Raft may hand the same entries over in batches.
			batched := New()
			var logs []*raft.Log
			for i, cmd := range log {
				data, _ := proto.Marshal(cmd)
				logs = append(logs, &raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: data})
			}
			for len(logs) > 0 {
				n := min(len(logs), 64)
				batched.ApplyBatch(logs[:n])
				logs = logs[n:]
			}
			if !bytes.Equal(dump(t, a), dump(t, batched)) {
				t.Fatal("ApplyBatch and Apply disagree")
			}
			leases, _ := a.Leases()
			if len(leases) == 0 {
				t.Fatal("random log granted no leases; it exercises nothing")
			}
			roundTrip(t, a)
		})
	}
}

func TestEpochsOnlyGrow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.must(c(0, createNS("a", "t")))
	var last uint64
	grants := 0
	for i := range 30 {
		runner := []string{"r1", "r2"}[i/3%2]
		// Three acquires per runner: a grant and two reconnects; then a
		// release hands the mailbox to the other runner, which the proxy
		// registers as its own.
		if i%3 == 0 {
			h.must(c(0, registerRunner("p", runner)))
		}
		res := h.must(c(0, acquire("a@p", runner))).(*adminv1.AcquireLeaseResponse)
		if !res.GetGranted() {
			t.Fatalf("acquire %d by %s refused: %v", i, runner, res.GetRefusal())
		}
		if e := res.GetLease().GetEpoch(); e <= last {
			t.Fatalf("epoch %d after %d", e, last)
		}
		last = res.GetLease().GetEpoch()
		grants++
		if i%3 == 2 {
			h.must(c(0, &adminv1.ReleaseLeaseRequest{MailboxId: "a@p", RunnerId: runner}))
		}
	}
	if grants != 30 {
		t.Fatalf("%d grants", grants)
	}
}

// recorder is a LeaseObserver that logs events; raft calls it from its own
// goroutine, hence the lock.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) Events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *recorder) LeaseGranted(l *adminv1.Lease) {
	r.add("grant %s %s %d", l.GetMailboxId(), l.GetRunnerId(), l.GetEpoch())
}
func (r *recorder) LeaseRemoved(mid string, epoch uint64) { r.add("remove %s %d", mid, epoch) }
func (r *recorder) LeasesRestored(ls []*adminv1.Lease)    { r.add("restore %d", len(ls)) }

func TestObserverSeesLeaseChangesInLogOrder(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	h := newHarness(t, WithLeaseObserver(rec))
	h.must(c(0, registerRunner("p", "r1")))        // 1
	for _, name := range []string{"a", "b", "c"} { // 2-4
		h.must(c(0, createNS(name, "t")))
	}
	h.must(c(0, acquire("a@p", "r1")))                                                                                                                              // 5
	h.must(c(0, acquire("a@p", "r2")))                                                                                                                              // 6: refused
	h.must(c(0, acquire("a@p", "r1")))                                                                                                                              // 7: reconnect
	h.must(c(0, &adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{{MailboxId: "a@p", Epoch: 7, ExpiresAt: at(0), LastHeartbeatAt: at(0)}}})) // 8
	h.must(c(0, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: "a@p", Epoch: 5}}}))                                                           // 9: stale
	h.must(c(0, registerRunner("p", "r2")))                                                                                                                         // 10
	h.must(c(0, acquire("b@p", "r2")))                                                                                                                              // 11
	h.must(c(0, &adminv1.ReleaseLeaseRequest{MailboxId: "a@p", RunnerId: "r1"}))                                                                                    // 12
	h.must(c(0, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: "b@p", Epoch: 11}}}))                                                          // 13
	h.must(c(0, registerRunner("p", "r3")))                                                                                                                         // 14
	h.must(c(0, acquire("c@p", "r3")))                                                                                                                              // 15
	if err := h.f.Restore(io.NopCloser(bytes.NewReader(dump(t, h.f)))); err != nil {
		t.Fatal(err)
	}
	want := []string{"grant a@p r1 5", "grant a@p r1 7", "grant b@p r2 11", "remove a@p 7", "remove b@p 11", "grant c@p r3 15", "restore 1"}
	if got := rec.Events(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events\n%v\nwant\n%v", got, want)
	}
}

func TestChangedFiresOnChangeOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	idx, ch := h.f.Changed()
	if idx != 0 {
		t.Fatalf("fresh FSM at index %d", idx)
	}
	h.must(c(0, &adminv1.DeleteNamespaceRequest{Namespace: "nope"}))
	select {
	case <-ch:
		t.Fatal("a no-op fired the change channel")
	default:
	}
	h.must(c(0, createNS(ns, "t")))
	select {
	case <-ch:
	default:
		t.Fatal("a change did not fire the channel")
	}
	if idx, _ := h.f.Changed(); idx != 2 {
		t.Fatalf("applied index %d, want 2", idx)
	}
}

func TestNamespaceRoutes(t *testing.T) {
	t.Parallel()
	h, owner, other, mailbox := base(t)
	_, aliases, _ := h.f.Routes()
	if len(aliases) != 1 || aliases[0].GetMailboxId() != mailbox {
		t.Fatalf("alias %v, want %s", aliases, mailbox)
	}
	// The assigned proxy goes stale: the namespace moves to other, which
	// has no mailbox yet, so the alias stays on the old proxy's lease.
	p, _ := h.f.Proxy(owner)
	h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
	_, aliases, v := h.f.Routes()
	if aliases[0].GetMailboxId() != mailbox || v != h.index {
		t.Fatalf("alias %v at version %d, want fallback %s at %d", aliases, v, mailbox, h.index)
	}
	// A second mailbox of the namespace on the other proxy, newer epoch.
	h.must(c(time.Minute, acquire(mailboxID(ns, other), "runner-b")))
	_, aliases, v = h.f.Routes()
	if aliases[0].GetMailboxId() != mailboxID(ns, other) || v != h.index {
		t.Fatalf("alias %v at version %d, want %s at %d", aliases, v, mailboxID(ns, other), h.index)
	}
	// The owner returns and takes the namespace back by a move that
	// switches at once (its mailbox is still held): its mailbox is
	// preferred although the other's grant is newer.
	h.must(c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: owner}))
	h.must(c(time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 1}))
	if got := h.must(c(time.Minute, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: owner, MoveIndex: h.index, HandoffUntil: at(time.Minute)})).(*MoveResult); !got.Applied {
		t.Fatalf("switch back to %s: %v", owner, got)
	}
	_, aliases, _ = h.f.Routes()
	if len(aliases) != 1 || aliases[0].GetMailboxId() != mailbox {
		t.Fatalf("alias %v, want the assigned proxy's mailbox %s", aliases, mailbox)
	}
	// Without a mailbox on the assigned proxy, the newest grant wins.
	h.must(c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: mailbox, RunnerId: "runner-a"}))
	_, aliases, _ = h.f.Routes()
	if aliases[0].GetMailboxId() != mailboxID(ns, other) {
		t.Fatalf("alias %v, want fallback %s", aliases, mailboxID(ns, other))
	}
	n, route, _ := h.f.Namespace(ns)
	if n == nil || route.GetMailboxId() != mailboxID(ns, other) {
		t.Fatalf("Namespace() route = %v", route)
	}
	if r, ok := h.f.NamespaceRoute(ns); !ok || !proto.Equal(r, route) {
		t.Fatalf("NamespaceRoute() = %v, %v; Namespace() says %v", r, ok, route)
	}
	h.must(c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: mailboxID(ns, other), RunnerId: "runner-b"}))
	if r, ok := h.f.NamespaceRoute(ns); ok || r != nil {
		t.Fatalf("NamespaceRoute() with no lease left = %v, %v", r, ok)
	}
	if r, ok := h.f.NamespaceRoute("no-such-namespace"); ok || r != nil {
		t.Fatalf("NamespaceRoute() of an unknown namespace = %v, %v", r, ok)
	}
}

func TestStaleProxyReturns(t *testing.T) {
	t.Parallel()
	h, owner, other, _ := base(t)
	p, _ := h.f.Proxy(owner)
	h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != other {
		t.Fatalf("namespace stayed on stale %s", owner)
	}
	h.must(c(2*time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: owner}))
	h.must(c(2*time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 1}))
	if n, _, _ := h.f.Namespace(ns); n.GetAssignedProxyId() != other || n.GetIncomingProxyId() != owner || n.GetMoveIndex() != h.index {
		t.Fatalf("namespace %v is not moving back to %s", n, owner)
	}
	h.must(c(3*time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: "proxy-01", LastSeen: at(time.Minute)}, {ProxyId: "proxy-02", LastSeen: at(time.Second)}}}))
	n, _, _ := h.f.Namespace(ns)
	info, _ := h.f.Proxies()
	var live int
	for _, p := range info {
		if p.GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_LIVE {
			live++
		}
	}
	if live == 0 && n.GetAssignedProxyId() != "" {
		t.Fatalf("no live proxy but namespace assigned to %s", n.GetAssignedProxyId())
	}
	roundTrip(t, h.f)
}

func TestRestoreRejectsBadSnapshots(t *testing.T) {
	t.Parallel()
	h, _, _, _ := base(t)
	good := dump(t, h.f)
	cases := map[string][]byte{
		"empty":            nil,
		"truncated":        good[:len(good)-3],
		"missing a record": good[:len(good)-len(good)/4],
		"garbage":          []byte("not a snapshot at all"),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newHarness(t)
			f.must(c(0, createNS("keep-me", "t")))
			before := dump(t, f.f)
			if err := f.f.Restore(io.NopCloser(bytes.NewReader(data))); err == nil {
				t.Fatal("restore accepted a bad snapshot")
			}
			if !bytes.Equal(before, dump(t, f.f)) {
				t.Fatal("failed restore changed state")
			}
		})
	}
}

func TestEncodeRefusesInvalid(t *testing.T) {
	t.Parallel()
	if _, err := Encode(c(0, acquire("nope", "r"))); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Encode(bad) = %v", err)
	}
	b, err := Encode(c(0, acquire("a@p", "r")))
	if err != nil {
		t.Fatal(err)
	}
	if cmd, err := Decode(b); err != nil || CommandType(cmd) != "acquire_lease" {
		t.Fatalf("Decode = %v, %v", cmd, err)
	}
}

func FuzzApply(f *testing.F) {
	for _, cmd := range randomLog(7, 40) {
		b, _ := proto.Marshal(cmd)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00, 0xca, 0x06, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newHarness(t)
		for _, cmd := range randomLog(3, 30) {
			h.apply(cmd)
		}
		before := tables(t, h.f)
		res := h.applyBytes(data)
		if _, isErr := res.(error); isErr && !bytes.Equal(before, tables(t, h.f)) {
			t.Fatalf("refused entry changed state: %v", res)
		}
		roundTrip(t, h.f)
	})
}

func FuzzRestore(f *testing.F) {
	h := newHarness(f)
	for _, cmd := range randomLog(5, 60) {
		h.apply(cmd)
	}
	good := dump(f, h.f)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := newHarness(t)
		g.must(c(0, createNS("keep-me", "t")))
		before := dump(t, g.f)
		if err := g.f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			if !bytes.Equal(before, dump(t, g.f)) {
				t.Fatal("failed restore changed state")
			}
			return
		}
		roundTrip(t, g.f)
	})
}

// TestProxiesListMatchesEachProxy: the one-pass list of every proxy says
// what asking for each proxy says (its partitions and namespaces, sorted),
// and the records the stale-proxy loop reads are the same proxies.
func TestProxiesListMatchesEachProxy(t *testing.T) {
	t.Parallel()
	h, _, _, _ := base(t)
	h.must(c(4*time.Second, registerRunner("proxy-03", "runner-c")))
	for i := range 12 {
		h.must(c(5*time.Second, createNS(fmt.Sprintf("ns-%02d", i), "audit.events")))
	}
	infos, _ := h.f.Proxies()
	records := h.f.ProxyRecords()
	if len(infos) != 3 || len(records) != 3 {
		t.Fatalf("%d proxies listed, %d records; want 3", len(infos), len(records))
	}
	placed := 0
	for i, info := range infos {
		id := info.GetProxy().GetRegistration().GetProxyId()
		one, _ := h.f.Proxy(id)
		if !proto.Equal(info, one) {
			t.Errorf("%s listed as %v, alone as %v", id, info, one)
		}
		if !proto.Equal(records[i], info.GetProxy()) {
			t.Errorf("record %d is %v, want %v", i, records[i], info.GetProxy())
		}
		placed += len(info.GetNamespaces())
	}
	if placed != 13 {
		t.Errorf("%d namespaces across the proxies, want 13", placed)
	}
}
