package fsm

import (
	"bytes"
	"io"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// scanNamespaceRoutes is the alias rule read off every lease, in mailbox
// order: per namespace the mailbox on its assigned proxy, else the newest
// grant. NamespaceRoute must agree with it without the scan.
func scanNamespaceRoutes(s *state) map[string]*adminv1.NamespaceRoute {
	best := map[string]*adminv1.Lease{}
	for _, mid := range sortedKeys(s.leases) {
		l := s.leases[mid]
		ns := l.GetNamespace()
		assigned := s.namespaces[ns].GetAssignedProxyId()
		if in := s.namespaces[ns].GetIncomingProxyId(); in != "" && l.GetProxyId() == in {
			continue // catching up: never routed to before its switch
		}
		cur, ok := best[ns]
		switch {
		case !ok:
			best[ns] = l
		case cur.GetProxyId() == assigned && assigned != "":
		case l.GetProxyId() == assigned && assigned != "":
			best[ns] = l
		case l.GetEpoch() > cur.GetEpoch():
			best[ns] = l
		}
	}
	out := map[string]*adminv1.NamespaceRoute{}
	for ns, l := range best {
		out[ns] = &adminv1.NamespaceRoute{Namespace: ns, MailboxId: l.GetMailboxId(), Epoch: l.GetEpoch()}
	}
	return out
}

// The per-proxy lease count and the per-namespace mailboxes behind
// NamespaceRoute are kept incrementally by every command that grants or
// removes a lease and rebuilt on restore; whatever the order of acquires
// (new, re-grants, refused), releases (by the holder or not), expiries
// (current or stale epoch), namespace moves and deletions and snapshot
// restores, they equal a recount of the lease table after every entry, and
// NamespaceRoute answers what a scan of every lease picks.
func TestProxyLeaseCountMatchesARecount(t *testing.T) {
	t.Parallel()
	proxies := []string{"p1", "p2", "p3"}
	namespaces := []string{"ns-a", "ns-b", "ns-c", "ns-d", "ns-e", "ns-f", "ns-g", "ns-h"}
	peak, removed := 0, 0
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 11))
		h := newHarness(t)
		for _, p := range proxies {
			h.must(c(0, register(p)))
		}
		for _, ns := range namespaces {
			h.must(c(0, createNS(ns, "t")))
		}
		pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
		lease := func() *adminv1.Lease {
			ls, _ := h.f.Leases()
			if len(ls) == 0 {
				return nil
			}
			return ls[rng.IntN(len(ls))]
		}
		for step := range 400 {
			before := h.f.Counts().Leases
			d := time.Duration(step) * time.Second
			var op string
			switch r := rng.IntN(100); {
			case r < 40:
				op = "acquire"
				p := pick(proxies)
				runner := p
				if rng.IntN(10) == 0 {
					runner = "intruder"
				}
				h.must(c(d, acquire(pick(namespaces)+"@"+p, runner)))
			case r < 55:
				op = "release"
				if l := lease(); l != nil {
					runner := l.GetRunnerId()
					if rng.IntN(5) == 0 {
						runner = "intruder"
					}
					h.must(c(d, &adminv1.ReleaseLeaseRequest{MailboxId: l.GetMailboxId(), RunnerId: runner, Epoch: l.GetEpoch()}))
				}
			case r < 70:
				op = "expire"
				if l := lease(); l != nil {
					epoch := l.GetEpoch()
					if rng.IntN(4) == 0 {
						epoch++ // a stale decision: nothing is removed
					}
					h.must(c(d, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: l.GetMailboxId(), Epoch: epoch}}}))
				}
			case r < 75:
				op = "checkpoint"
				if l := lease(); l != nil {
					h.must(c(d, &adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{{
						MailboxId: l.GetMailboxId(), Epoch: l.GetEpoch(), ExpiresAt: at(d + time.Minute), LastHeartbeatAt: at(d),
					}}}))
				}
			case r < 80:
				op = "stale or back"
				p := pick(proxies)
				if info, _ := h.f.Proxy(p); info.GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_LIVE {
					h.must(c(d, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: p, LastSeen: info.GetProxy().GetLastSeen()}}}))
				} else {
					h.must(c(d, register(p)))
					h.must(c(d, &adminv1.RebalanceCommand{MaxConcurrentMoves: 8}))
				}
			case r < 85:
				op = "delete or create namespace"
				ns := pick(namespaces)
				if n, _, _ := h.f.Namespace(ns); n != nil {
					h.must(c(d, &adminv1.DeleteNamespaceRequest{Namespace: ns}))
				} else {
					h.must(c(d, createNS(ns, "t")))
				}
			case r < 92:
				op = "switch moves"
				moves, _ := h.f.Moves()
				for _, m := range moves {
					n := m.Namespace
					if m.Role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP {
						h.must(c(d, &adminv1.SwitchMoveCommand{Namespace: n.GetName(), ToProxyId: m.To, MoveIndex: n.GetMoveIndex(), HandoffUntil: at(d)}))
					} else {
						h.must(c(d, &adminv1.EndHandoffCommand{Namespace: n.GetName(), HandoffProxyId: m.From, HandoffUntil: n.GetHandoffUntil()}))
					}
				}
			default:
				op = "restore"
				g := New()
				if err := g.Restore(io.NopCloser(bytes.NewReader(dump(t, h.f)))); err != nil {
					t.Fatal(err)
				}
				h.f = g
			}
			if n := h.f.Counts().Leases; n < before {
				removed++
			} else {
				peak = max(peak, n)
			}
			h.f.mu.RLock()
			got, want := maps.Clone(h.f.st.proxyLeases), countLeases(h.f.st.leases)
			h.f.mu.RUnlock()
			if !maps.Equal(got, want) {
				t.Fatalf("seed %d step %d (%s): per-proxy counts %v, recount %v", seed, step, op, got, want)
			}
			for _, p := range proxies {
				if h.f.ProxyLeases(p) != want[p] {
					t.Fatalf("seed %d step %d (%s): ProxyLeases(%s) = %d, want %d", seed, step, op, p, h.f.ProxyLeases(p), want[p])
				}
			}
			h.f.mu.RLock()
			scanned := scanNamespaceRoutes(h.f.st)
			h.f.mu.RUnlock()
			for _, n := range namespaces {
				got, ok := h.f.NamespaceRoute(n)
				if want, wok := scanned[n]; ok != wok || !proto.Equal(got, want) {
					t.Fatalf("seed %d step %d (%s): NamespaceRoute(%s) = %v, %v; a scan of every lease picks %v", seed, step, op, n, got, ok, want)
				}
			}
		}
	}
	if peak < 5 || removed < 20 {
		t.Fatalf("the sequences held at most %d leases and removed %d times: too little exercised", peak, removed)
	}
}
