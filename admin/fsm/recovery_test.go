package fsm

import (
	"slices"
	"strings"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// ownerAddr is the registered address of src's proxy.
func ownerAddr(src *adminv1.RecoverySource) string {
	_, proxy, _ := strings.Cut(src.GetMailboxId(), "@")
	return register(proxy).GetRegistration().GetAddress()
}

// assignmentOf is ns's assignment in proxy's set, or nil.
func assignmentOf(f *FSM, proxy string) *adminv1.NamespaceAssignment {
	w, _ := f.Assignments(proxy)
	for _, a := range w.GetAssignments() {
		if a.GetNamespace() == ns {
			return a
		}
	}
	return nil
}

// A move's destination is told to seed its mailbox from the source's while
// the source serves it, and the source is told to let the destination copy
// from the move's start to its end; no other assignment carries either.
func TestRecoveryAssignmentsFollowTheMove(t *testing.T) {
	t.Parallel()
	type want struct {
		source *adminv1.RecoverySource // on the destination's CATCHING_UP
		peers  []string                // on the owner's SERVING
	}
	check := func(t *testing.T, h *harness, owner, other string, w want) {
		t.Helper()
		o, d := assignmentOf(h.f, owner), assignmentOf(h.f, other)
		if !slices.Equal(o.GetRecoveryPeers(), w.peers) || o.GetRecoverySource() != nil {
			t.Fatalf("owner's assignment %v, want peers %v and no source", o, w.peers)
		}
		if !proto.Equal(d.GetRecoverySource(), w.source) || len(d.GetRecoveryPeers()) != 0 {
			t.Fatalf("destination's assignment %v, want source %v and no peers", d, w.source)
		}
	}
	until := at(time.Hour)
	for _, tc := range []struct {
		name string
		// act runs after the move's start; want is what the assignments
		// say after it (src: the source mailbox with its runner address).
		act  func(h *harness, owner, other string, start uint64)
		want func(src *adminv1.RecoverySource, other string) want
	}{
		{"in progress", func(*harness, string, string, uint64) {}, func(src *adminv1.RecoverySource, other string) want {
			return want{src, []string{other}}
		}},
		{"destination holds its lease", func(h *harness, _, other string, _ uint64) {
			h.must(c(5*time.Second, acquire(mailboxID(ns, other), "runner-b")))
		}, func(src *adminv1.RecoverySource, other string) want { return want{src, []string{other}} }},
		{"source released its lease: still named, at its registered address", func(h *harness, owner, _ string, _ uint64) {
			h.must(c(5*time.Second, &adminv1.ReleaseLeaseRequest{MailboxId: mailboxID(ns, owner), RunnerId: "runner-a"}))
		}, func(src *adminv1.RecoverySource, other string) want {
			return want{&adminv1.RecoverySource{MailboxId: src.GetMailboxId(), Address: ownerAddr(src)}, []string{other}}
		}},
		{"source acquired again at another address", func(h *harness, owner, _ string, _ uint64) {
			h.must(c(5*time.Second, &adminv1.ReleaseLeaseRequest{MailboxId: mailboxID(ns, owner), RunnerId: "runner-a"}))
			h.must(c(6*time.Second, &adminv1.AcquireLeaseRequest{MailboxId: mailboxID(ns, owner), RunnerId: "runner-a", RunnerAddress: "elsewhere:9"}))
		}, func(src *adminv1.RecoverySource, other string) want {
			return want{&adminv1.RecoverySource{MailboxId: src.GetMailboxId(), Address: "elsewhere:9"}, []string{other}}
		}},
		{"cancelled", func(h *harness, _, _ string, _ uint64) {
			h.must(c(5*time.Second, &adminv1.AbandonMoveCommand{Namespace: ns}))
		}, func(*adminv1.RecoverySource, string) want { return want{} }},
		{"switched: the tail's source and the new owner carry neither", func(h *harness, _, other string, start uint64) {
			h.must(c(5*time.Second, acquire(mailboxID(ns, other), "runner-b")))
			h.must(c(6*time.Second, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: other, MoveIndex: start, HandoffUntil: until}))
		}, func(*adminv1.RecoverySource, string) want { return want{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, _ := base(t)
			check(t, h, owner, other, want{})
			h.must(c(4*time.Second, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: other}))
			start := h.index
			src := &adminv1.RecoverySource{MailboxId: mailboxID(ns, owner), Address: "runner-a.svc:9090"}
			tc.act(h, owner, other, start)
			w := tc.want(src, other)
			n, _, _ := h.f.Namespace(ns)
			if n.GetAssignedProxyId() == other {
				// After the switch the roles have swapped: the new owner
				// serves with no peers, the tail's source hands off.
				if a := assignmentOf(h.f, other); a.GetRecoverySource() != nil || len(a.GetRecoveryPeers()) != 0 {
					t.Fatalf("new owner's assignment %v", a)
				}
				if a := assignmentOf(h.f, owner); a.GetRole() != handingOff || a.GetRecoverySource() != nil || len(a.GetRecoveryPeers()) != 0 {
					t.Fatalf("tail's assignment %v", a)
				}
				return
			}
			check(t, h, owner, other, w)
			// A snapshot restores the same assignments: they are derived.
			r := roundTrip(t, h.f)
			for _, p := range []string{owner, other} {
				a, _ := h.f.Assignments(p)
				b, _ := r.Assignments(p)
				if !proto.Equal(a, b) {
					t.Fatalf("%s's assignments after a restore: %v, want %v", p, b, a)
				}
			}
		})
	}
}

// A source that stops serving during a move ends it (the unplanned path):
// the namespace is reassigned at once, so no assignment names a source the
// destination could copy a partial or stale store from.
func TestRecoverySourceGoneEndsTheMove(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(h *harness, owner string)
	}{
		{"source stale", func(h *harness, owner string) {
			p, _ := h.f.Proxy(owner)
			h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
		}},
		{"source runner not ready", func(h *harness, owner string) {
			h.must(c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: owner, RunnerNotReady: true}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, _ := moveBase(t)
			if assignmentOf(h.f, other).GetRecoverySource() == nil {
				t.Fatal("no recovery source while the source serves")
			}
			tc.lose(h, owner)
			a := assignmentOf(h.f, other)
			if a.GetRole() != roleServing || a.GetRecoverySource() != nil || len(a.GetRecoveryPeers()) != 0 {
				t.Fatalf("destination's assignment after the source was lost: %v, want SERVING at once, with no recovery", a)
			}
		})
	}
}

// A namespace's SERVING assignment names the mailbox it had on the proxy it
// was assigned before (prior_mailbox_id): none for its first proxy, the lost
// one's after an unplanned reassignment (stale or runner not ready), kept
// through a snapshot, and none once it is back on that proxy.
func TestPriorMailboxAfterAReassignment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(h *harness, owner string)
	}{
		{"owner stale", func(h *harness, owner string) {
			p, _ := h.f.Proxy(owner)
			h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
		}},
		{"owner runner not ready", func(h *harness, owner string) {
			h.must(c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: owner, RunnerNotReady: true}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, mailbox := base(t)
			if a := assignmentOf(h.f, owner); a.GetPriorMailboxId() != "" {
				t.Fatalf("first proxy's assignment %v names a prior mailbox", a)
			}
			tc.lose(h, owner)
			a := assignmentOf(h.f, other)
			if a.GetRole() != roleServing || a.GetPriorMailboxId() != mailbox {
				t.Fatalf("assignment after the owner was lost: %v, want SERVING with prior mailbox %s", a, mailbox)
			}
			r := roundTrip(t, h.f)
			if b := assignmentOf(r, other); !proto.Equal(a, b) {
				t.Fatalf("after a restore: %v, want %v", b, a)
			}
			// The lost proxy serving again takes the namespace back by a
			// planned move (rebalancing), whose destination is copied.
			h.must(c(2*time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: owner}))
			h.must(c(3*time.Minute, &adminv1.StartMoveCommand{Namespace: ns, ToProxyId: owner}))
			start := h.index
			if a := assignmentOf(h.f, owner); a.GetRole() != adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP || a.GetPriorMailboxId() != "" {
				t.Fatalf("destination's assignment %v, want CATCHING_UP with no prior mailbox (it is copied)", a)
			}
			h.must(c(4*time.Minute, acquire(mailbox, "runner-a")))
			h.must(c(5*time.Minute, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: owner, MoveIndex: start, HandoffUntil: at(time.Hour)}))
			if a := assignmentOf(h.f, owner); a.GetRole() != roleServing || a.GetPriorMailboxId() != mailboxID(ns, other) {
				t.Fatalf("after the switch: %v, want SERVING with prior mailbox %s", a, mailboxID(ns, other))
			}
		})
	}
}

// NamespaceReplicas lists each proxy's mailbox with its role, lease and
// last report, through a move and its tail.
func TestNamespaceReplicas(t *testing.T) {
	t.Parallel()
	h, owner, other, start := moveBase(t)
	rec := &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPYING, SourceMailboxId: mailboxID(ns, owner), BytesCopied: 42}
	h.must(c(5*time.Second, acquire(mailboxID(ns, other), "runner-b")))
	h.must(c(6*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: other, NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: ns, Recovery: rec}}}))
	epochOther := h.index - 1
	got := h.f.NamespaceReplicas(ns)
	byProxy := map[string]*adminv1.NamespaceReplica{}
	for _, r := range got {
		byProxy[r.GetProxyId()] = r
	}
	if len(got) != 2 || got[0].GetProxyId() > got[1].GetProxyId() {
		t.Fatalf("replicas %v, want two sorted by proxy", got)
	}
	if r := byProxy[owner]; r.GetRole() != roleServing || r.GetEpoch() != 4 || r.GetMailboxId() != mailboxID(ns, owner) || r.GetHealth() != nil {
		t.Fatalf("owner's replica %v", r)
	}
	if r := byProxy[other]; r.GetRole() != catchingUp || r.GetEpoch() != epochOther || !proto.Equal(r.GetHealth().GetRecovery(), rec) {
		t.Fatalf("destination's replica %v", r)
	}
	h.must(c(7*time.Second, &adminv1.SwitchMoveCommand{Namespace: ns, ToProxyId: other, MoveIndex: start, HandoffUntil: at(time.Hour)}))
	for _, r := range h.f.NamespaceReplicas(ns) {
		if want := map[string]adminv1.AssignmentRole{owner: handingOff, other: roleServing}[r.GetProxyId()]; r.GetRole() != want {
			t.Fatalf("after the switch %s is %v, want %v", r.GetProxyId(), r.GetRole(), want)
		}
	}
	if h.f.NamespaceReplicas("missing") != nil {
		t.Fatal("replicas of an unknown namespace")
	}
}
