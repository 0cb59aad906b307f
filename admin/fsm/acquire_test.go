package fsm

import (
	"bytes"
	"strings"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// TestAcquirePreconditions: an acquire for a mailbox nobody may hold is
// refused with a reason naming why, and leaves every table as it was. Each
// case starts from base (ns on owner, runner-a holding its mailbox at epoch
// 4; other's runner is runner-b).
func TestAcquirePreconditions(t *testing.T) {
	t.Parallel()
	type env struct {
		h                     *harness
		owner, other, mailbox string
	}
	stale := func(e *env, proxy string) {
		p, _ := e.h.f.Proxy(proxy)
		e.h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: proxy, LastSeen: p.GetProxy().GetLastSeen()}}}))
	}
	cases := []struct {
		name string
		// setup runs before the state is recorded; it may be nil.
		setup   func(e *env)
		acquire func(e *env) *adminv1.AcquireLeaseRequest
		reason  adminv1.LeaseRefusalReason
		// says is a part of the refusal's message.
		says        func(e *env) string
		holderEpoch uint64 // the refusal's current lease; 0 = none
	}{
		{
			name:    "namespace does not exist",
			acquire: func(e *env) *adminv1.AcquireLeaseRequest { return acquire(mailboxID("nope", e.owner), "runner-a") },
			reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NAMESPACE_NOT_FOUND,
			says:    func(*env) string { return "namespace nope does not exist" },
		},
		{
			name:    "namespace placed on another proxy",
			acquire: func(e *env) *adminv1.AcquireLeaseRequest { return acquire(mailboxID(ns, e.other), "runner-b") },
			reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE,
			says:    func(e *env) string { return "placed on proxy " + e.owner + ", not " + e.other },
		},
		{
			name:    "mailbox of an unregistered proxy",
			acquire: func(*env) *adminv1.AcquireLeaseRequest { return acquire(mailboxID(ns, "proxy-99"), "proxy-99") },
			reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE,
			says:    func(e *env) string { return "not proxy-99" },
		},
		{
			name: "namespace placed on no proxy: every proxy is stale",
			setup: func(e *env) {
				stale(e, e.owner)
				stale(e, e.other)
			},
			acquire:     func(e *env) *adminv1.AcquireLeaseRequest { return acquire(e.mailbox, "runner-a") },
			reason:      adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE,
			says:        func(*env) string { return "placed on no live proxy" },
			holderEpoch: 4,
		},
		{
			name:        "namespace moved away: the holder's reconnect is refused, its lease kept",
			setup:       func(e *env) { stale(e, e.owner) },
			acquire:     func(e *env) *adminv1.AcquireLeaseRequest { return acquire(e.mailbox, "runner-a") },
			reason:      adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PLACED_HERE,
			says:        func(e *env) string { return "placed on proxy " + e.other },
			holderEpoch: 4,
		},
		{
			name:        "not the proxy's runner, mailbox held",
			acquire:     func(e *env) *adminv1.AcquireLeaseRequest { return acquire(e.mailbox, "runner-z") },
			reason:      adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER,
			says:        func(e *env) string { return "proxy " + e.owner + " registered runner runner-a, not runner-z" },
			holderEpoch: 4,
		},
		{
			name: "not the proxy's runner, mailbox free",
			setup: func(e *env) {
				e.h.must(c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: e.mailbox, RunnerId: "runner-a"}))
			},
			acquire: func(e *env) *adminv1.AcquireLeaseRequest { return acquire(e.mailbox, "runner-b") },
			reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER,
			says:    func(*env) string { return "not runner-b" },
		},
		{
			name:    "a registration without a runner id names the proxy itself",
			setup:   func(e *env) { e.h.must(c(time.Minute, register(e.owner))) },
			acquire: func(e *env) *adminv1.AcquireLeaseRequest { return acquire(e.mailbox, "runner-a") },
			reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER,
			says: func(e *env) string {
				return "proxy " + e.owner + " registered runner " + e.owner + ", not runner-a"
			},
			holderEpoch: 4,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, owner, other, mailbox := base(t)
			e := &env{h: h, owner: owner, other: other, mailbox: mailbox}
			if tc.setup != nil {
				tc.setup(e)
			}
			before := tables(t, h.f)
			req := tc.acquire(e)
			res, ok := h.apply(c(2*time.Minute, req)).(*adminv1.AcquireLeaseResponse)
			if !ok {
				t.Fatalf("acquire answered %v, want a refusal", res)
			}
			ref := res.GetRefusal()
			if res.GetGranted() || res.GetLease() != nil || ref.GetReason() != tc.reason || res.GetIndex() != h.index {
				t.Fatalf("acquire = %v, want refusal %v at index %d", res, tc.reason, h.index)
			}
			if want := tc.says(e); !strings.Contains(ref.GetMessage(), want) || !strings.Contains(ref.GetMessage(), req.GetMailboxId()) {
				t.Fatalf("refusal message %q does not name the mailbox and %q", ref.GetMessage(), want)
			}
			if got := ref.GetCurrent().GetEpoch(); got != tc.holderEpoch {
				t.Fatalf("refusal names holder epoch %d, want %d", got, tc.holderEpoch)
			}
			if cur, _ := h.f.Lease(req.GetMailboxId()); tc.holderEpoch != 0 && !proto.Equal(cur, ref.GetCurrent()) {
				t.Fatalf("refusal's current lease %v, table has %v", ref.GetCurrent(), cur)
			}
			if !bytes.Equal(before, tables(t, h.f)) {
				t.Fatal("a refused acquire changed the state")
			}
		})
	}
}

// TestAcquireAfterMove: once the namespace has moved, the new proxy's runner
// acquires the new mailbox while the old proxy's lease lives on until its
// holder releases it.
func TestAcquireAfterMove(t *testing.T) {
	t.Parallel()
	h, owner, other, mailbox := base(t)
	p, _ := h.f.Proxy(owner)
	h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
	res := h.must(c(time.Minute, acquire(mailboxID(ns, other), "runner-b"))).(*adminv1.AcquireLeaseResponse)
	if !res.GetGranted() {
		t.Fatalf("acquire on the new proxy = %v", res)
	}
	if old, _ := h.f.Lease(mailbox); old.GetRunnerId() != "runner-a" || old.GetEpoch() != 4 {
		t.Fatalf("the move touched the old proxy's lease: %v", old)
	}
	rel := h.must(c(time.Minute, &adminv1.ReleaseLeaseRequest{MailboxId: mailbox, RunnerId: "runner-a", Epoch: 4})).(*adminv1.ReleaseLeaseResponse)
	if !rel.GetReleased() {
		t.Fatalf("the old holder could not release after the move: %v", rel)
	}
}
