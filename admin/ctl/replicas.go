package ctl

import (
	"fmt"
	"io"
	"strings"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// replicasTable lists each proxy's mailbox of a namespace (prismctl
// namespace get): its role and lease, the lag and stored positions its
// proxy last reported, whether its history is complete and, for a mailbox
// seeded from a peer, the copy's progress (docs/architecture.md#peer-recovery).
func replicasTable(w io.Writer, rs []*adminv1.NamespaceReplica) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nPROXY\tMAILBOX\tSTATE\tEPOCH\tLAG\tPOSITIONS\tHISTORY\tRECOVERY")
	for _, r := range rs {
		h := r.GetHealth()
		lag := "?"
		if h.GetLagKnown() {
			lag = fmt.Sprint(h.GetLag())
		}
		epoch := "-"
		if r.GetEpoch() != 0 {
			epoch = fmt.Sprint(r.GetEpoch())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GetProxyId(), r.GetMailboxId(), replicaState(r), epoch, lag,
			positions(h.GetStoredPositions()), history(h.GetRecovery()), recovery(h.GetRecovery()))
	}
}

// replicaState is the mailbox's part in the namespace: recovering (a
// move's destination or a replica copying its source), catching up (a
// move's destination, or a replica not in sync), in sync (a replica the
// lookup names after the serving mailbox), serving, or handing off.
func replicaState(r *adminv1.NamespaceReplica) string {
	switch r.GetRole() {
	case adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA:
		switch {
		case r.GetHealth().GetRecovery().GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPYING:
			return "recovering"
		case r.GetInSync():
			return "in sync"
		}
		return "catching up"
	case adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP:
		if r.GetHealth().GetRecovery().GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPYING {
			return "recovering"
		}
		return "catching up"
	case adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF:
		return "handing off"
	}
	return "serving"
}

// positions is topic/partition=next offset, comma separated.
func positions(ps []*adminv1.StoredPosition) string {
	if len(ps) == 0 {
		return "-"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("%s/%d=%d", p.GetTopic(), p.GetPartition(), p.GetNextOffset())
	}
	return strings.Join(out, ",")
}

// history says whether the mailbox holds its namespace's whole history, or
// only what Kafka still held, from its oldest event; "-" when its proxy
// does not report it.
func history(r *adminv1.RecoveryStatus) string {
	switch {
	case r == nil:
		return "-"
	case r.GetHistoryComplete():
		return "complete"
	case r.GetHistoryStartsAt() != nil:
		return "incomplete, from " + ts(r.GetHistoryStartsAt())
	}
	return "incomplete"
}

// recovery is the peer copy's state, source and size so far.
func recovery(r *adminv1.RecoveryStatus) string {
	var what string
	switch r.GetState() {
	case adminv1.RecoveryState_RECOVERY_STATE_COPYING:
		what = "copying from " + r.GetSourceMailboxId()
	case adminv1.RecoveryState_RECOVERY_STATE_COPIED:
		what = "copied from " + r.GetSourceMailboxId()
	case adminv1.RecoveryState_RECOVERY_STATE_INCOMPLETE:
		what = "no copy; read from Kafka"
		if src := r.GetSourceMailboxId(); src != "" {
			what = "no copy of " + src + "; read from Kafka"
		}
		if e := r.GetError(); e != "" {
			what += " (" + e + ")"
		}
		return what
	default:
		return "-"
	}
	what += fmt.Sprintf(": %d events, %d bytes", r.GetEventsCopied(), r.GetBytesCopied())
	if e := r.GetError(); e != "" {
		what += ", last error: " + e
	}
	if r.GetFinishedAt() != nil {
		what += ", at " + ts(r.GetFinishedAt())
	} else if r.GetStartedAt() != nil {
		what += ", since " + ts(r.GetStartedAt())
	}
	return what
}
