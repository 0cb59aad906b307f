package fsm

import (
	"fmt"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// # One lease model
//
// Every lease is granted the same way, whichever wire API asked: a grant
// gives one or more mailboxes to one holder in one Raft entry
// (docs/architecture.md#acquire, docs/architecture.md#sessions).
// AcquireLease is a grant of one mailbox to a holder with no session, whose
// lease is then renewed by its own heartbeats; AcquireLeases is a grant of
// many to a session's runner, whose leases are renewed by the session's
// keepalives. Both go through grantRefusal (who may be granted a mailbox)
// and txn.grant (the leases, their epochs and timing), so a rule of either
// holds for both.

// holder is who a grant's leases are for: a runner at an address, alone or
// in a session.
type holder struct {
	runnerID      string
	runnerAddress string
	// session is the session the leases join; nil for leases renewed one
	// by one (MailboxHeartbeat).
	session *adminv1.Session
	// ttl is the ttl a holder with no session asked for; zero means the
	// namespace's, else the default.
	ttl time.Duration
}

// timing is the ttl, grace and heartbeat interval of h's lease on a mailbox
// of namespace ns (docs/architecture.md#lease-timing). A lease's grace is its
// namespace's (config.lease.grace) when that sets one, else the holder's
// default. A lease in a session lives as long as the session, so it has the
// session's ttl, the session's grace as the default (the lessor expires a
// session after the largest grace of its leases), and the keepalive's
// interval, a third of the ttl. A lease of its own takes its ttl from the
// request, then the namespace, then DefaultLeaseTTL, and its heartbeat
// interval from the namespace, else DefaultHeartbeatInterval, cut to a third
// of the ttl when that does not fit: a namespace's interval may not fit a
// shorter ttl the runner asked for, and a third leaves room for two misses.
func (h holder) timing(ns *adminv1.Namespace) (ttl, grace, hb time.Duration) {
	cfg := ns.GetConfig().GetLease()
	if h.session != nil {
		ttl = h.session.GetTtl().AsDuration()
		grace = h.session.GetGrace().AsDuration()
		if g := cfg.GetGrace().AsDuration(); g > 0 {
			grace = g
		}
		return ttl, grace, ttl / 3
	}
	ttl = h.ttl
	if ttl == 0 {
		ttl = orDefault(cfg.GetTtl().AsDuration(), DefaultLeaseTTL)
	}
	grace = orDefault(cfg.GetGrace().AsDuration(), DefaultLeaseGrace)
	hb = orDefault(cfg.GetHeartbeatInterval().AsDuration(), DefaultHeartbeatInterval)
	if hb >= ttl {
		hb = ttl / 3
	}
	return ttl, grace, hb
}

// validateHolder checks the holder fields of a grant's or session's
// request.
func validateHolder(runnerID, runnerAddress string, ttl *durationpb.Duration) error {
	if err := mesh.ValidateID("runner_id", runnerID); err != nil {
		return err
	}
	if err := ValidateAddress("runner_address", runnerAddress); err != nil {
		return err
	}
	return ValidateTTL("ttl", ttl)
}

// grantRefusal is the rule for granting mailbox mid to runnerID; it returns
// nil if the grant may go ahead. It is refused when the caller may not hold
// the mailbox at all (placementRefusal: no such namespace, placed elsewhere,
// not the proxy's runner), or when another runner holds it (HELD_BY_OTHER,
// naming the holder). It may go ahead when the mailbox has no lease or
// runnerID holds it already, on its own or in any session: a reconnect,
// whose new lease replaces the old one. Every refusal names the current
// lease, if any.
//
// A namespace's move does not touch a lease already granted on the old
// proxy: that lease is renewed, released or expired like any other (its
// sidecar sees the assignment revoked, drains and releases), but the old
// mailbox can no longer be granted again, not even as a reconnect. The new
// proxy's mailbox is another mailbox id, granted on its own.
func grantRefusal(st *state, mid, runnerID string) *adminv1.LeaseRefusal {
	cur := st.leases[mid]
	if ref := placementRefusal(st, &adminv1.AcquireLeaseRequest{MailboxId: mid, RunnerId: runnerID}); ref != nil {
		ref.Current = proto.CloneOf(cur)
		return ref
	}
	if cur != nil && cur.GetRunnerId() != runnerID {
		return &adminv1.LeaseRefusal{
			Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_HELD_BY_OTHER,
			Message: fmt.Sprintf("mailbox %s is held by runner %s (epoch %d)", mid, cur.GetRunnerId(), cur.GetEpoch()),
			Current: proto.CloneOf(cur),
		}
	}
	return nil
}

// grant gives h every mailbox of mids that grantRefusal allows, and answers
// for each in mids' order: its refusal, or its new lease. Every grant,
// reconnects included, gets a new epoch (epoch.go): the holder may be a
// restarted incarnation whose predecessor is still draining, and a fresh
// fencing token is what tells the two apart. The grants of one entry take
// consecutive epochs in mids' order, allocated once every check has passed.
// A reconnect's runner address may have changed, so its lease takes the new
// one.
func (tx *txn) grant(cmd *adminv1.Command, h holder, mids []string) ([]*adminv1.MailboxLeaseResult, error) {
	results := make([]*adminv1.MailboxLeaseResult, len(mids))
	grants := 0
	for i, mid := range mids {
		results[i] = &adminv1.MailboxLeaseResult{MailboxId: mid, Refusal: grantRefusal(tx.st, mid, h.runnerID)}
		if results[i].Refusal == nil {
			grants++
		}
	}
	if grants == 0 {
		return results, nil
	}
	epoch, err := tx.allocEpochs(grants)
	if err != nil {
		return nil, err
	}
	for _, r := range results {
		if r.GetRefusal() != nil {
			continue
		}
		l := tx.newLease(cmd, h, r.GetMailboxId(), epoch)
		epoch++
		tx.grantLease(l)
		r.Ok = true
		r.Lease = proto.CloneOf(l)
	}
	return results, nil
}

// newLease is h's lease of mailbox mid at epoch, granted by cmd: it expires
// a ttl after the entry's time unless renewed.
func (tx *txn) newLease(cmd *adminv1.Command, h holder, mid string, epoch uint64) *adminv1.Lease {
	id, _ := mesh.ParseMailboxID(mid) // validated before apply
	ttl, grace, hb := h.timing(tx.st.namespaces[id.Namespace])
	return &adminv1.Lease{
		MailboxId:         mid,
		Namespace:         id.Namespace,
		ProxyId:           id.Proxy,
		RunnerId:          h.runnerID,
		RunnerAddress:     h.runnerAddress,
		Partition:         placement.Partition(id.Namespace),
		Epoch:             epoch,
		GrantedAt:         cmd.GetNow(),
		ExpiresAt:         timestamppb.New(tx.now.Add(ttl)),
		Ttl:               durationpb.New(ttl),
		Grace:             durationpb.New(grace),
		HeartbeatInterval: durationpb.New(hb),
		LastHeartbeatAt:   cmd.GetNow(),
		SessionId:         h.session.GetId(),
	}
}
