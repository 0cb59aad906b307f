package fsm

import (
	"bytes"
	"io"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/encoding/protodelim"
)

// ProxyRoutesIndex moves with what the per-proxy routes are built from (a
// proxy's address, runner_id, existence and staleness) and with nothing a
// lease or a heartbeat does, which is what keeps lease churn off the wire.
func TestProxyRoutesIndex(t *testing.T) {
	t.Parallel()
	h, owner, other, mailbox := base(t)
	if got := h.f.ProxyRoutesIndex(); got != 2 {
		t.Fatalf("after registering two proxies at 1 and 2: ProxyRoutesIndex %d", got)
	}
	moved := func(req *adminv1.RegisterProxyRequest, f func(*adminv1.ProxyRegistration)) *adminv1.RegisterProxyRequest {
		f(req.GetRegistration())
		return req
	}
	lastSeen := func(id string) *adminv1.ProxyRef {
		p, _ := h.f.Proxy(id)
		return &adminv1.ProxyRef{ProxyId: id, LastSeen: p.GetProxy().GetLastSeen()}
	}
	for _, step := range []struct {
		name  string
		cmd   func() *adminv1.Command
		moves bool
	}{
		{"lease checkpoint", func() *adminv1.Command {
			l, _ := h.f.Lease(mailbox)
			return c(4*time.Second, &adminv1.CheckpointLeasesCommand{Checkpoints: []*adminv1.LeaseCheckpoint{{
				MailboxId: mailbox, Epoch: l.GetEpoch(), ExpiresAt: at(time.Minute), LastHeartbeatAt: at(4 * time.Second),
			}}})
		}, false},
		{"heartbeat", func() *adminv1.Command { return c(5*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: owner}) }, false},
		{"release", func() *adminv1.Command {
			return c(6*time.Second, &adminv1.ReleaseLeaseRequest{MailboxId: mailbox, RunnerId: "runner-a"})
		}, false},
		{"acquire", func() *adminv1.Command { return c(7*time.Second, acquire(mailbox, "runner-a")) }, false},
		{"expire", func() *adminv1.Command {
			l, _ := h.f.Lease(mailbox)
			return c(8*time.Second, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: mailbox, Epoch: l.GetEpoch()}}})
		}, false},
		{"create namespace", func() *adminv1.Command { return c(9*time.Second, createNS("other-ns", "t")) }, false},
		{"re-register unchanged", func() *adminv1.Command { return c(10*time.Second, registerRunner(owner, "runner-a")) }, false},
		{"re-register with other labels", func() *adminv1.Command {
			return c(11*time.Second, moved(registerRunner(owner, "runner-a"), func(r *adminv1.ProxyRegistration) { r.Labels = map[string]string{"tier": "b"} }))
		}, false},
		{"re-register at a new address", func() *adminv1.Command {
			return c(12*time.Second, moved(registerRunner(owner, "runner-a"), func(r *adminv1.ProxyRegistration) { r.Address = "10.0.0.9:8980" }))
		}, true},
		{"re-register with another runner", func() *adminv1.Command {
			return c(13*time.Second, moved(registerRunner(owner, "runner-c"), func(r *adminv1.ProxyRegistration) { r.Address = "10.0.0.9:8980" }))
		}, true},
		{"new proxy", func() *adminv1.Command { return c(14*time.Second, register("proxy-03")) }, true},
		{"marked stale", func() *adminv1.Command {
			return c(15*time.Second, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{lastSeen(other)}})
		}, true},
		{"stale proxy heartbeats", func() *adminv1.Command { return c(16*time.Second, &adminv1.ProxyHeartbeatRequest{ProxyId: other}) }, true},
		{"stale mark already outdated", func() *adminv1.Command {
			return c(17*time.Second, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: other, LastSeen: at(0)}}})
		}, false},
	} {
		before := h.f.ProxyRoutesIndex()
		h.must(step.cmd())
		got := h.f.ProxyRoutesIndex()
		switch {
		case step.moves && got != h.index:
			t.Fatalf("%s at %d: ProxyRoutesIndex %d, want %d", step.name, h.index, got, h.index)
		case !step.moves && got != before:
			t.Fatalf("%s at %d moved ProxyRoutesIndex %d -> %d", step.name, h.index, before, got)
		}
	}
	g := roundTrip(t, h.f)
	if got, want := g.ProxyRoutesIndex(), h.f.ProxyRoutesIndex(); got != want {
		t.Fatalf("restored ProxyRoutesIndex %d, want %d", got, want)
	}
}

// A snapshot written before the field holds no ProxyRoutesIndex: the
// restored FSM claims the snapshot's index, so a watcher rebuilds once
// instead of keeping proxies it never saw.
func TestProxyRoutesIndexFromOlderSnapshot(t *testing.T) {
	t.Parallel()
	h, _, _, _ := base(t)
	h.must(c(time.Minute, &adminv1.ProxyHeartbeatRequest{ProxyId: "proxy-01"}))
	snap := dump(t, h.f)
	r := bytes.NewReader(snap)
	hdr := &adminv1.SnapshotHeader{}
	if err := protodelim.UnmarshalFrom(r, hdr); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	hdr.ProxyRoutesIndex = 0
	var buf bytes.Buffer
	if _, err := protodelim.MarshalTo(&buf, hdr); err != nil {
		t.Fatal(err)
	}
	buf.Write(rest)
	g := New()
	if err := g.Restore(io.NopCloser(&buf)); err != nil {
		t.Fatal(err)
	}
	if got := g.ProxyRoutesIndex(); got != h.index || got == h.f.ProxyRoutesIndex() {
		t.Fatalf("ProxyRoutesIndex from a snapshot without it: %d, want the snapshot's index %d (the FSM had %d)", got, h.index, h.f.ProxyRoutesIndex())
	}
}
