package audit

import (
	"testing"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestEventOf: each kind of change the trail records is named by its
// action with the resources and epochs it touched, under the caller's
// principal (the admin's own for a leader loop), and the liveness commands
// are left out.
func TestEventOf(t *testing.T) {
	t.Parallel()
	now := timestamppb.New(t0)
	cmd := func(principal string, body any) *adminv1.Command {
		c := &adminv1.Command{Now: now, Principal: principal}
		switch b := body.(type) {
		case *adminv1.AcquireLeaseRequest:
			c.Body = &adminv1.Command_AcquireLease{AcquireLease: b}
		case *adminv1.ExpireLeasesCommand:
			c.Body = &adminv1.Command_ExpireLeases{ExpireLeases: b}
		case *adminv1.DeleteNamespaceRequest:
			c.Body = &adminv1.Command_DeleteNamespace{DeleteNamespace: b}
		case *adminv1.RemoveMemberCommand:
			c.Body = &adminv1.Command_RemoveMember{RemoveMember: b}
		case *adminv1.CheckpointLeasesCommand:
			c.Body = &adminv1.Command_CheckpointLeases{CheckpointLeases: b}
		case *adminv1.ProxyHeartbeatRequest:
			c.Body = &adminv1.Command_ProxyHeartbeat{ProxyHeartbeat: b}
		}
		return c
	}
	const alice = "spiffe://prism.local/operator/alice"
	for _, tc := range []struct {
		name                     string
		commit                   fsm.Commit
		action, resource, epochs string
		principal                string
		recorded                 bool
	}{
		{"grant", fsm.Commit{Index: 7, Command: cmd("spiffe://prism.local/proxy/p1", &adminv1.AcquireLeaseRequest{MailboxId: "a@p1"}),
			Granted: []*adminv1.Lease{{MailboxId: "a@p1", Epoch: 7}}}, "lease.granted", "a@p1", "a@p1=7", "spiffe://prism.local/proxy/p1", true},
		{"expiry", fsm.Commit{Index: 8, Command: cmd("", &adminv1.ExpireLeasesCommand{}),
			Removed: []*adminv1.LeaseRef{{MailboxId: "a@p1", Epoch: 7}}}, "lease.expired", "a@p1", "a@p1=7", SystemPrincipal, true},
		{"delete", fsm.Commit{Index: 9, Command: cmd(alice, &adminv1.DeleteNamespaceRequest{Namespace: "orders"})},
			"namespace.deleted", "orders", "", alice, true},
		{"member removed", fsm.Commit{Index: 10, Command: cmd(alice, &adminv1.RemoveMemberCommand{Id: "admin-3"})},
			"member.removed", "admin-3", "", alice, true},
		{"heartbeat ending a move", fsm.Commit{Index: 11, Command: cmd("", &adminv1.ProxyHeartbeatRequest{ProxyId: "p2"}),
			Moves: []fsm.MoveEnd{{Namespace: "orders", Switched: true}}}, "move.switched", "orders", "", SystemPrincipal, true},
		{"checkpoint", fsm.Commit{Index: 12, Command: cmd("", &adminv1.CheckpointLeasesCommand{})}, "", "", "", "", false},
		{"heartbeat", fsm.Commit{Index: 13, Command: cmd("", &adminv1.ProxyHeartbeatRequest{ProxyId: "p2"})}, "", "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev, ok, err := eventOf(tc.commit, Namespace)
			if err != nil || ok != tc.recorded {
				t.Fatalf("eventOf: recorded %v, %v; want %v", ok, err, tc.recorded)
			}
			if !ok {
				return
			}
			env := ev.Envelope
			ext := env.GetExtensions()
			if got := env.GetMetadata().GetMessageId(); got != MessageID(tc.commit.Index) {
				t.Errorf("message_id %q, want the index %d", got, tc.commit.Index)
			}
			if string(ext[HeaderAction]) != tc.action || string(ext[HeaderResource]) != tc.resource || string(ext[HeaderEpochs]) != tc.epochs {
				t.Errorf("action %q resource %q epochs %q, want %q %q %q", ext[HeaderAction], ext[HeaderResource], ext[HeaderEpochs], tc.action, tc.resource, tc.epochs)
			}
			if got := env.GetSecurity().GetPublisherId(); got != tc.principal {
				t.Errorf("principal %q, want %q", got, tc.principal)
			}
			if env.GetMetadata().GetNamespace() != Namespace || !env.GetMetadata().GetPublishedAt().AsTime().Equal(t0) {
				t.Errorf("namespace %q at %v, want %s at the leader's stamp %v", env.GetMetadata().GetNamespace(), env.GetMetadata().GetPublishedAt().AsTime(), Namespace, t0)
			}
		})
	}
}
