// Package audit publishes the admin cluster's committed state changes to
// Kafka, one PrismEnvelope per Raft index, for the $admin namespace's mailbox
// (docs/architecture.md#the-admin-audit-trail).
package audit

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Namespace is the admin's own namespace. Its name starts with '$', which
// only the admin may create (admin/server refuses it from any caller).
const Namespace = "$admin"

// DefaultTopic is the Kafka topic the events go to unless configured.
const DefaultTopic = "admin.events"

// SystemPrincipal is the principal of a change the leader made by itself
// (an expiry, a stale proxy, a rebalance): no caller asked for it.
const SystemPrincipal = "prism-admin"

// Extension keys every event carries (the mailbox's custom headers).
const (
	HeaderAction   = "action"
	HeaderResource = "resource"
	HeaderIndex    = "raft_index"
	HeaderTerm     = "raft_term"
	HeaderEpochs   = "epochs"
)

// Event is one committed change, ready to publish.
type Event struct {
	Index    uint64
	Action   string
	Envelope *envelopev1.PrismEnvelope
}

// MessageID is the envelope's message_id for the change at index: the
// index itself, so the same change published twice (a new leader resuming,
// a retried produce) is one item in the mailbox, which deduplicates by
// message_id.
func MessageID(index uint64) string { return strconv.FormatUint(index, 10) }

// action names what c did ("namespace.created"), and the resources it did
// it to; "" for a command the trail leaves out (heartbeats, checkpoints:
// liveness, not decisions), unless it ended a move.
func action(c fsm.Commit) (string, []string) {
	cmd := c.Command
	switch b := cmd.GetBody().(type) {
	case *adminv1.Command_RegisterProxy:
		return "proxy.registered", []string{b.RegisterProxy.GetRegistration().GetProxyId()}
	case *adminv1.Command_MarkProxiesStale:
		if r, ok := c.Result.(*fsm.MarkStaleResult); ok {
			return "proxy.stale", r.Marked
		}
		var ids []string
		for _, p := range b.MarkProxiesStale.GetProxies() {
			ids = append(ids, p.GetProxyId())
		}
		return "proxy.stale", ids
	case *adminv1.Command_DrainProxy:
		return "proxy.drained", []string{b.DrainProxy.GetProxyId()}
	case *adminv1.Command_CordonProxy:
		return "proxy.cordoned", []string{b.CordonProxy.GetProxyId()}
	case *adminv1.Command_CreateNamespace:
		return "namespace.created", []string{b.CreateNamespace.GetNamespace()}
	case *adminv1.Command_DeleteNamespace:
		return "namespace.deleted", []string{b.DeleteNamespace.GetNamespace()}
	case *adminv1.Command_AcquireLease, *adminv1.Command_AcquireLeases:
		return "lease.granted", grantedIDs(c)
	case *adminv1.Command_ReleaseLease, *adminv1.Command_ReleaseLeases, *adminv1.Command_CloseSession:
		return "lease.released", removedIDs(c)
	case *adminv1.Command_ExpireLeases, *adminv1.Command_ExpireSessions:
		return "lease.expired", removedIDs(c)
	case *adminv1.Command_OpenSession:
		return "session.opened", []string{b.OpenSession.GetProxyId()}
	case *adminv1.Command_StartMove:
		return "move.started", []string{b.StartMove.GetNamespace()}
	case *adminv1.Command_Rebalance:
		return "move.started", movedNamespaces(c)
	case *adminv1.Command_SwitchMove:
		return "move.switched", []string{b.SwitchMove.GetNamespace()}
	case *adminv1.Command_EndHandoff:
		return "move.handoff_ended", []string{b.EndHandoff.GetNamespace()}
	case *adminv1.Command_AbandonMove:
		return "move.abandoned", []string{b.AbandonMove.GetNamespace()}
	case *adminv1.Command_PutMembers:
		var ids []string
		for _, m := range b.PutMembers.GetMembers() {
			ids = append(ids, m.GetId())
		}
		return "member.added", ids
	case *adminv1.Command_RemoveMember:
		return "member.removed", []string{b.RemoveMember.GetId()}
	}
	switch {
	case len(c.Moves) == 0:
		return "", nil
	case c.Moves[0].Switched:
		return "move.switched", movedNamespaces(c)
	default:
		return "move.abandoned", movedNamespaces(c)
	}
}

func grantedIDs(c fsm.Commit) []string {
	ids := make([]string, 0, len(c.Granted))
	for _, l := range c.Granted {
		ids = append(ids, l.GetMailboxId())
	}
	return ids
}

func removedIDs(c fsm.Commit) []string {
	ids := make([]string, 0, len(c.Removed))
	for _, l := range c.Removed {
		ids = append(ids, l.GetMailboxId())
	}
	return ids
}

func movedNamespaces(c fsm.Commit) []string {
	ids := make([]string, 0, len(c.Moves))
	for _, m := range c.Moves {
		ids = append(ids, m.Namespace)
	}
	return ids
}

// maxResourceHeader bounds the resource header of a bulk change (a
// session's thousand grants): the payload names every one.
const maxResourceHeader = 1024

// eventOf is c as an Event, false for a change the trail leaves out. Every
// replica derives the same envelope from the same entry: its time is the
// leader's stamp in the command, its principal the caller the command
// names.
func eventOf(c fsm.Commit, namespace string) (Event, bool, error) {
	act, resources := action(c)
	if act == "" {
		return Event{}, false, nil
	}
	payload, err := anypb.New(c.Command)
	if err != nil {
		return Event{}, false, fmt.Errorf("audit event at index %d: %w", c.Index, err)
	}
	principal := c.Command.GetPrincipal()
	if principal == "" {
		principal = SystemPrincipal
	}
	ext := map[string][]byte{
		HeaderAction:   []byte(act),
		HeaderResource: []byte(truncate(strings.Join(resources, ","), maxResourceHeader)),
		HeaderIndex:    []byte(MessageID(c.Index)),
		HeaderTerm:     []byte(strconv.FormatUint(c.Term, 10)),
	}
	if epochs := epochsOf(c); epochs != "" {
		ext[HeaderEpochs] = []byte(truncate(epochs, maxResourceHeader))
	}
	env := &envelopev1.PrismEnvelope{
		EnvelopeVersion: 1,
		Metadata: &envelopev1.PrismMetadata{
			MessageId:   MessageID(c.Index),
			Topic:       "admin." + act,
			Namespace:   namespace,
			PublishedAt: c.Command.GetNow(),
			ContentType: "application/protobuf; proto=" + string(proto.MessageName(c.Command)),
		},
		Payload:    payload,
		Security:   &envelopev1.SecurityContext{PublisherId: principal},
		Extensions: ext,
	}
	return Event{Index: c.Index, Action: act, Envelope: env}, true, nil
}

// epochsOf lists mailbox=epoch for the leases c granted or removed.
func epochsOf(c fsm.Commit) string {
	var b strings.Builder
	add := func(id string, epoch uint64) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(id)
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(epoch, 10))
	}
	for _, l := range c.Granted {
		add(l.GetMailboxId(), l.GetEpoch())
	}
	for _, l := range c.Removed {
		add(l.GetMailboxId(), l.GetEpoch())
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
