package ctl

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Each replica's line says its state, lease, lag, positions, whether its
// history is complete (and from when when not) and the copy's progress.
func TestReplicasTable(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		r    *adminv1.NamespaceReplica
		want []string
	}{
		{"serving, history complete", &adminv1.NamespaceReplica{ProxyId: "p1", MailboxId: "a@p1", Epoch: 7, Health: &adminv1.NamespaceHealth{
			LagKnown: true, Lag: 3, StoredPositions: []*adminv1.StoredPosition{{Topic: "t", Partition: 0, NextOffset: 10}, {Topic: "t", Partition: 1, NextOffset: 4}},
			Recovery: &adminv1.RecoveryStatus{HistoryComplete: true},
		}}, []string{"p1", "a@p1", "serving", "7", "3", "t/0=10,t/1=4", "complete", "-"}},
		{"recovering", &adminv1.NamespaceReplica{ProxyId: "p2", MailboxId: "a@p2", Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP, Health: &adminv1.NamespaceHealth{
			Recovery: &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPYING, SourceMailboxId: "a@p1", BytesCopied: 2048, EventsCopied: 12, StartedAt: timestamppb.New(from)},
		}}, []string{"p2", "recovering", "-", "?", "copying from a@p1: 12 events, 2048 bytes, since 2026-01-02T03:04:05Z"}},
		{"copied, catching up", &adminv1.NamespaceReplica{ProxyId: "p2", MailboxId: "a@p2", Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP, Epoch: 9, Health: &adminv1.NamespaceHealth{
			Recovery: &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPIED, SourceMailboxId: "a@p1", EventsCopied: 280, BytesCopied: 1, FinishedAt: timestamppb.New(from), HistoryComplete: true},
		}}, []string{"catching up", "complete", "copied from a@p1: 280 events, 1 bytes, at 2026-01-02T03:04:05Z"}},
		{"fell back to Kafka", &adminv1.NamespaceReplica{ProxyId: "p2", MailboxId: "a@p2", Health: &adminv1.NamespaceHealth{
			Recovery: &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_INCOMPLETE, SourceMailboxId: "a@p1", HistoryStartsAt: timestamppb.New(from)},
		}}, []string{"serving", "incomplete, from 2026-01-02T03:04:05Z", "no copy of a@p1; read from Kafka"}},
		{"replica copying", &adminv1.NamespaceReplica{ProxyId: "p3", MailboxId: "a@p3", Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA, Health: &adminv1.NamespaceHealth{
			Recovery: &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPYING, SourceMailboxId: "a@p1"},
		}}, []string{"p3", "recovering", "copying from a@p1"}},
		{"replica behind", &adminv1.NamespaceReplica{ProxyId: "p3", MailboxId: "a@p3", Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA, Epoch: 11, Health: &adminv1.NamespaceHealth{
			LagKnown: true, Lag: 5000, StoredPositions: []*adminv1.StoredPosition{{Topic: "t", Partition: 0, NextOffset: 2}},
		}}, []string{"catching up", "11", "5000", "t/0=2"}},
		{"replica in sync", &adminv1.NamespaceReplica{ProxyId: "p3", MailboxId: "a@p3", Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA, Epoch: 11, InSync: true, Health: &adminv1.NamespaceHealth{
			LagKnown: true, Lag: 0, StoredPositions: []*adminv1.StoredPosition{{Topic: "t", Partition: 0, NextOffset: 10}},
		}}, []string{"in sync", "t/0=10"}},
		{"handing off, nothing reported", &adminv1.NamespaceReplica{ProxyId: "p1", MailboxId: "a@p1", Role: adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF},
			[]string{"handing off", "?", "-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
			replicasTable(tw, []*adminv1.NamespaceReplica{tc.r})
			if err := tw.Flush(); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "PROXY") {
				t.Fatalf("printed\n%s\nwant a header and one line", b.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(lines[1], w) {
					t.Errorf("line %q lacks %q", lines[1], w)
				}
			}
		})
	}
}

// namespace get shows every mailbox of a namespace being moved, as the
// proxies report them through the admin: the source serving with its
// history, the destination recovering from it; move list shows the copy.
func TestNamespaceGetShowsRecovery(t *testing.T) {
	t.Parallel()
	a := startMovingAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp := func(id string) adminv1.ControlPlaneClient {
		cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(
			a.pki.Source(identity.Proxy, id).ClientConfig(pki.RoleIs(identity.Admin)))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		c := adminv1.NewControlPlaneClient(cc)
		if _, err := c.RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: id, Address: "127.0.0.1:9000"}}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	p1, p2 := cp("p1"), cp("p2")
	if out, err := prismctl(t, append(slices.Clone(op), "namespace", "create", ns, "--topic", "t", "--skip-topic-check")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r, err := p1.AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: ns + "@p1", RunnerId: "p1", RunnerAddress: "127.0.0.1:9001"}); err != nil || !r.GetGranted() {
		t.Fatalf("acquire on p1: %v %v", r, err)
	}
	if _, err := p1.ProxyHeartbeat(ctx, &adminv1.ProxyHeartbeatRequest{ProxyId: "p1", NamespaceHealth: []*adminv1.NamespaceHealth{
		{Namespace: ns, LagKnown: true, Recovery: &adminv1.RecoveryStatus{HistoryComplete: true}},
	}}); err != nil {
		t.Fatal(err)
	}
	if out, err := prismctl(t, append(slices.Clone(op), "namespace", "move", ns, "--to", "p2")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r, err := p2.AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: ns + "@p2", RunnerId: "p2", RunnerAddress: "127.0.0.1:9002"}); err != nil || !r.GetGranted() {
		t.Fatalf("acquire on p2: %v %v", r, err)
	}
	// Still copying: the mover never switches to it.
	if _, err := p2.ProxyHeartbeat(ctx, &adminv1.ProxyHeartbeatRequest{ProxyId: "p2", NamespaceHealth: []*adminv1.NamespaceHealth{
		{Namespace: ns, Recovery: &adminv1.RecoveryStatus{State: adminv1.RecoveryState_RECOVERY_STATE_COPYING, SourceMailboxId: ns + "@p1", EventsCopied: 5, BytesCopied: 500}},
	}}); err != nil {
		t.Fatal(err)
	}
	out, err := prismctl(t, append(slices.Clone(op), "namespace", "get", ns, "--consistent")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"PROXY", ns + "@p1", "serving", "complete",
		ns + "@p2", "recovering", "copying from " + ns + "@p1: 5 events, 500 bytes",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("namespace get printed\n%s\nwant %q", out, want)
		}
	}
	out, err = prismctl(t, append(slices.Clone(op), "move", "list")...)
	if err != nil || !strings.Contains(out, "RECOVERY") || !strings.Contains(out, "copying from "+ns+"@p1: 5 events, 500 bytes") {
		t.Fatalf("move list: %v\n%s", err, out)
	}
}
