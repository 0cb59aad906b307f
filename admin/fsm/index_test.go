package fsm

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fullReplace is replace's scope before the indexes: every namespace.
func fullReplace(s *state) []string { return sortedKeys(s.namespaces) }

// fullAssignments is assignments by a pass over every namespace, the
// reference for the indexed one.
func fullAssignments(s *state, proxyID string) []*adminv1.NamespaceAssignment {
	if proxyID == "" {
		return nil
	}
	return s.assignmentsAmong(sortedKeys(s.namespaces), proxyID)
}

// moveLog records the move events in order.
type moveLog struct{ events []string }

func (m *moveLog) MoveSwitched(ns string, r adminv1.MoveReason) {
	m.events = append(m.events, fmt.Sprintf("switch %s %v", ns, r))
}

func (m *moveLog) MoveAbandoned(ns string, r adminv1.MoveAbandonReason) {
	m.events = append(m.events, fmt.Sprintf("abandon %s %v", ns, r))
}

// randomCommand is one command of the placement churn the indexes must
// follow, chosen from what the indexed FSM holds.
func randomCommand(r *rand.Rand, f *FSM, now time.Duration) *adminv1.Command {
	proxy := fmt.Sprintf("p%d", r.IntN(5))
	ns := fmt.Sprintf("ns-%d", r.IntN(40))
	f.mu.RLock()
	defer f.mu.RUnlock()
	p := f.st.proxies[proxy]
	n := f.st.namespaces[ns]
	switch r.IntN(12) {
	case 0:
		req := registerRunner(proxy, "runner")
		req.Registration.Instance = fmt.Sprintf("i%d", r.IntN(2))
		req.RunnerNotReady = r.IntN(6) == 0
		return c(now, req)
	case 1, 2:
		hb := &adminv1.ProxyHeartbeatRequest{ProxyId: proxy, RunnerNotReady: r.IntN(8) == 0}
		for i := range r.IntN(3) {
			hb.NamespaceHealth = append(hb.NamespaceHealth, &adminv1.NamespaceHealth{
				Namespace: fmt.Sprintf("ns-%d", (r.IntN(40)+i)%40), OpenFailed: r.IntN(2) == 0,
			})
		}
		slices.SortFunc(hb.NamespaceHealth, func(a, b *adminv1.NamespaceHealth) int { return cmp.Compare(a.GetNamespace(), b.GetNamespace()) })
		hb.NamespaceHealth = slices.CompactFunc(hb.NamespaceHealth, func(a, b *adminv1.NamespaceHealth) bool { return a.GetNamespace() == b.GetNamespace() })
		cmd := c(now, hb)
		cmd.OpenFailureExclusion = durationpb.New(time.Duration(1+r.IntN(20)) * time.Second)
		return cmd
	case 3:
		return c(now, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: proxy, LastSeen: p.GetLastSeen()}}})
	case 4:
		return c(now, &adminv1.CordonProxyCommand{ProxyId: proxy, Cordoned: !p.GetCordoned()})
	case 5:
		instance := p.GetRegistration().GetInstance()
		if r.IntN(4) == 0 {
			instance = "other"
		}
		return c(now, &adminv1.DrainProxyRequest{ProxyId: proxy, Instance: instance})
	case 6:
		return c(now, createNS(ns, "t"))
	case 7:
		if r.IntN(3) == 0 {
			return c(now, &adminv1.DeleteNamespaceRequest{Namespace: ns})
		}
		return c(now, acquire(mailboxID(ns, proxy), "runner"))
	case 8:
		return c(now, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: proxy})
	case 9:
		if n.GetIncomingProxyId() != "" {
			return c(now, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: n.GetIncomingProxyId(), MoveIndex: n.GetMoveIndex(), HandoffUntil: at(now + time.Duration(r.IntN(5))*time.Second)})
		}
		return c(now, &adminv1.AbandonMoveCommand{Namespace: ns})
	case 10:
		if n.GetHandoffProxyId() != "" {
			return c(now, &adminv1.EndHandoffCommand{Namespace: ns, HandoffProxyId: n.GetHandoffProxyId(), HandoffUntil: n.GetHandoffUntil()})
		}
		return c(now, &adminv1.AbandonMoveCommand{Namespace: ns})
	default:
		return c(now, &adminv1.RebalanceCommand{MaxConcurrentMoves: uint32(1 + r.IntN(4))})
	}
}

// TestIndexedPlacementMatchesFullPass replays random placement churn
// through the indexed FSM and through one whose replace visits every
// namespace (the pass before the indexes), and compares after every entry
// the states, the results, the move events, and each proxy's assignments
// and namespaces with a pass over every namespace.
func TestIndexedPlacementMatchesFullPass(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 7))
			var gotMoves, wantMoves moveLog
			got := newHarness(t, WithMoveObserver(&gotMoves))
			want := newHarness(t, WithMoveObserver(&wantMoves))
			want.f.replaceScope = fullReplace
			for i := range 600 {
				cmd := randomCommand(r, got.f, time.Duration(i)*time.Second)
				gr, wr := got.apply(cmd), want.apply(cmd)
				if !sameResult(gr, wr) {
					t.Fatalf("entry %d (%s): result %v, want %v", i, CommandType(cmd), gr, wr)
				}
				if !bytes.Equal(dump(t, got.f), dump(t, want.f)) {
					t.Fatalf("entry %d (%s): states differ", i, CommandType(cmd))
				}
				if !slices.Equal(gotMoves.events, wantMoves.events) {
					t.Fatalf("entry %d (%s): move events %v, want %v", i, CommandType(cmd), gotMoves.events, wantMoves.events)
				}
				checkProxyViews(t, got.f, i)
			}
		})
	}
}

func sameResult(a, b any) bool {
	if am, ok := a.(proto.Message); ok {
		bm, ok := b.(proto.Message)
		return ok && proto.Equal(am, bm)
	}
	if ae, ok := a.(error); ok {
		be, ok := b.(error)
		return ok && ae.Error() == be.Error()
	}
	return reflect.DeepEqual(a, b)
}

// checkProxyViews compares each proxy's assignments and namespaces with a
// pass over every namespace.
func checkProxyViews(t *testing.T, f *FSM, entry int) {
	t.Helper()
	f.mu.RLock()
	defer f.mu.RUnlock()
	st := f.st
	byProxy := st.namespacesByProxy()
	for _, id := range []string{"p0", "p1", "p2", "p3", "p4", ""} {
		got, want := st.assignments(id), fullAssignments(st, id)
		if len(got) != len(want) || !slices.EqualFunc(got, want, func(a, b *adminv1.NamespaceAssignment) bool { return proto.Equal(a, b) }) {
			t.Fatalf("entry %d: assignments of %q %v, want %v", entry, id, got, want)
		}
		var names []string
		for _, name := range sortedKeys(st.namespaces) {
			if st.namespaces[name].GetAssignedProxyId() == id {
				names = append(names, name)
			}
		}
		if of := st.namespacesOf(id); !slices.Equal(of, names) || !slices.Equal(byProxy[id], names) {
			t.Fatalf("entry %d: namespaces of %q %v (by proxy %v), want %v", entry, id, of, byProxy[id], names)
		}
	}
}
