package fsm

import (
	"fmt"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Result types returned by Apply (as the raft.ApplyFuture's Response) for
// the leader-internal commands; the client-facing commands return their RPC
// response message.

// ExpireResult lists the leases an ExpireLeasesCommand removed.
type ExpireResult struct {
	Expired []*adminv1.Lease
}

// CheckpointResult counts the checkpoints that still matched a lease.
type CheckpointResult struct {
	Applied int
}

// MarkStaleResult lists the proxies a MarkProxiesStaleCommand marked stale.
type MarkStaleResult struct {
	Marked []string
}

func validateRegisterProxy(cmd *adminv1.Command) error {
	r := cmd.GetRegisterProxy().GetRegistration()
	if r == nil {
		return invalid("registration", "missing")
	}
	if err := mesh.ValidateProxyID(r.GetProxyId()); err != nil {
		return err
	}
	if err := ValidateAddress("registration.address", r.GetAddress()); err != nil {
		return err
	}
	if len(r.GetAdditionalAddresses()) > MaxListLen {
		return invalid("registration.additional_addresses", "at most %d", MaxListLen)
	}
	for i, a := range r.GetAdditionalAddresses() {
		if err := ValidateAddress(fmt.Sprintf("registration.additional_addresses[%d]", i), a); err != nil {
			return err
		}
	}
	if len(r.GetCapabilities()) > MaxListLen {
		return invalid("registration.capabilities", "at most %d", MaxListLen)
	}
	for i, c := range r.GetCapabilities() {
		if err := mesh.ValidateID(fmt.Sprintf("registration.capabilities[%d]", i), c); err != nil {
			return err
		}
	}
	for _, f := range []struct{ field, v string }{
		{"registration.version", r.GetVersion()},
		{"registration.region", r.GetRegion()},
		{"registration.zone", r.GetZone()},
		{"registration.runner_id", r.GetRunnerId()},
		{"registration.instance", r.GetInstance()},
	} {
		if f.v != "" {
			if err := mesh.ValidateID(f.field, f.v); err != nil {
				return err
			}
		}
	}
	return validateLabels("registration.labels", r.GetLabels())
}

// applyRegisterProxy upserts the proxy as live, its runner as the sidecar
// judges it. A new or returning proxy, one whose runner's readiness
// flipped, or a new sidecar process ending its predecessor's drain
// (keptDrain) changes the placeable set, so placement is recomputed.
func applyRegisterProxy(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetRegisterProxy()
	reg := req.GetRegistration()
	id := reg.GetProxyId()
	prev := tx.st.proxies[id]
	p := &adminv1.Proxy{
		Registration:   proto.CloneOf(reg),
		Status:         adminv1.ProxyStatus_PROXY_STATUS_LIVE,
		RegisteredAt:   cmd.GetNow(),
		LastSeen:       cmd.GetNow(),
		RunnerNotReady: req.GetRunnerNotReady(),
	}
	if prev != nil {
		p.RegisteredAt = prev.GetRegisteredAt()
		p.NamespaceHealth = prev.GetNamespaceHealth()
		p.Cordoned = prev.GetCordoned()
		p.DrainingInstance = keptDrain(prev, reg)
	}
	tx.putProxy(p)
	if placeable(prev) != placeable(p) {
		tx.replace()
	}
	return &adminv1.RegisterProxyResponse{
		Proxy:           proto.CloneOf(p),
		Assignments:     tx.st.assignments(id),
		PartitionRanges: tx.st.table.Ranges(id),
		Index:           tx.index,
	}, nil
}

func validateProxyHeartbeat(cmd *adminv1.Command) error {
	hb := cmd.GetProxyHeartbeat()
	if err := mesh.ValidateProxyID(hb.GetProxyId()); err != nil {
		return err
	}
	if r := hb.GetRunnerId(); r != "" {
		if err := mesh.ValidateID("runner_id", r); err != nil {
			return err
		}
	}
	if len(hb.GetNamespaceHealth()) > placement.Partitions*4 {
		return invalid("namespace_health", "%d entries is too many", len(hb.GetNamespaceHealth()))
	}
	seen := map[string]bool{}
	for i, h := range hb.GetNamespaceHealth() {
		if err := mesh.ValidateNamespaceName(h.GetNamespace()); err != nil {
			return fmt.Errorf("namespace_health[%d]: %w", i, err)
		}
		if seen[h.GetNamespace()] {
			return invalid("namespace_health", "%q listed twice", h.GetNamespace())
		}
		seen[h.GetNamespace()] = true
		if len(h.GetOpenFailure()) > maxOpenFailureLen {
			return invalid(fmt.Sprintf("namespace_health[%d].open_failure", i), "longer than %d bytes", maxOpenFailureLen)
		}
		if err := validateRecovery(h.GetRecovery()); err != nil {
			return fmt.Errorf("namespace_health[%d].recovery: %w", i, err)
		}
	}
	return nil
}

// validateRecovery checks a reported peer recovery (nil: none reported).
func validateRecovery(r *adminv1.RecoveryStatus) error {
	if r == nil {
		return nil
	}
	if _, ok := adminv1.RecoveryState_name[int32(r.GetState())]; !ok {
		return invalid("state", "unknown value %d", r.GetState())
	}
	if src := r.GetSourceMailboxId(); src != "" {
		if _, err := mesh.ParseMailboxID(src); err != nil {
			return fmt.Errorf("source_mailbox_id: %w", err)
		}
	}
	if len(r.GetError()) > maxOpenFailureLen {
		return invalid("error", "longer than %d bytes", maxOpenFailureLen)
	}
	if r.GetBytesCopied() < 0 || r.GetEventsCopied() < 0 {
		return invalid("bytes_copied, events_copied", "negative")
	}
	for name, ts := range map[string]*timestamppb.Timestamp{
		"started_at": r.GetStartedAt(), "finished_at": r.GetFinishedAt(), "history_starts_at": r.GetHistoryStartsAt(),
	} {
		if ts != nil && ts.CheckValid() != nil {
			return invalid(name, "malformed")
		}
	}
	return nil
}

// applyProxyHeartbeat refreshes last_seen and the runner's readiness; a
// stale proxy that heartbeats is live again and takes its partitions back,
// unless its runner is not ready: a proxy whose runner's readiness flipped
// gives its partitions up or takes them back the same way. A heartbeat
// without the field (an older sidecar) says ready; one from the sidecar of
// a runner other than the registered one (a standby) leaves it as it was.
// A namespace reported open_failed is excluded from the proxy for a while
// (exclude.go), which may move it at once.
func applyProxyHeartbeat(tx *txn, cmd *adminv1.Command) (any, error) {
	hb := cmd.GetProxyHeartbeat()
	prev, ok := tx.st.proxies[hb.GetProxyId()]
	if !ok {
		return nil, fmt.Errorf("heartbeat from %s: %w", hb.GetProxyId(), ErrProxyNotFound)
	}
	p := proto.CloneOf(prev)
	p.Status = adminv1.ProxyStatus_PROXY_STATUS_LIVE
	p.LastSeen = cmd.GetNow()
	if r := hb.GetRunnerId(); r == "" || r == registeredRunner(prev.GetRegistration()) {
		p.RunnerNotReady = hb.GetRunnerNotReady()
	}
	var exclusions bool
	p.NamespaceHealth, exclusions = tx.st.storedHealth(prev.GetNamespaceHealth(), hb.GetNamespaceHealth(), tx.now, openFailureExclusion(cmd))
	tx.putProxy(p)
	if placeable(prev) != placeable(p) || exclusions {
		tx.replace()
	}
	return &adminv1.ProxyHeartbeatResponse{Proxy: proto.CloneOf(p), Index: tx.index}, nil
}

func validateMarkProxiesStale(cmd *adminv1.Command) error {
	for i, r := range cmd.GetMarkProxiesStale().GetProxies() {
		if err := mesh.ValidateProxyID(r.GetProxyId()); err != nil {
			return fmt.Errorf("proxies[%d]: %w", i, err)
		}
		if r.GetLastSeen() == nil || r.GetLastSeen().CheckValid() != nil {
			return invalid(fmt.Sprintf("proxies[%d].last_seen", i), "missing or malformed")
		}
	}
	return nil
}

// applyMarkProxiesStale marks each named proxy stale only if it is live and
// its last_seen is still the one the leader judged: a heartbeat applied in
// between means the proxy is alive after all.
func applyMarkProxiesStale(tx *txn, cmd *adminv1.Command) (any, error) {
	res := &MarkStaleResult{}
	for _, r := range cmd.GetMarkProxiesStale().GetProxies() {
		prev, ok := tx.st.proxies[r.GetProxyId()]
		if !ok || prev.GetStatus() != adminv1.ProxyStatus_PROXY_STATUS_LIVE || !proto.Equal(prev.GetLastSeen(), r.GetLastSeen()) {
			continue
		}
		p := proto.CloneOf(prev)
		p.Status = adminv1.ProxyStatus_PROXY_STATUS_STALE
		tx.putProxy(p)
		res.Marked = append(res.Marked, r.GetProxyId())
	}
	if len(res.Marked) > 0 {
		tx.replace()
	}
	return res, nil
}

func validateCreateNamespace(cmd *adminv1.Command) error {
	c := cmd.GetCreateNamespace()
	if err := mesh.ValidateNamespaceName(c.GetNamespace()); err != nil {
		return err
	}
	if p := c.GetRequestingProxy(); p != "" {
		if err := mesh.ValidateProxyID(p); err != nil {
			return fmt.Errorf("requesting_proxy: %w", err)
		}
	}
	if p := c.GetPrincipal(); p != "" {
		if err := mesh.ValidateID("principal", p); err != nil {
			return err
		}
	}
	return ValidateNamespaceConfig(c.GetConfig())
}

// applyCreateNamespace creates and places a namespace. Creating it again
// with an identical config succeeds without change, so a forwarded create
// that is retried after its answer was lost is harmless.
func applyCreateNamespace(tx *txn, cmd *adminv1.Command) (any, error) {
	c := cmd.GetCreateNamespace()
	if prev, ok := tx.st.namespaces[c.GetNamespace()]; ok {
		if !proto.Equal(prev.GetConfig(), c.GetConfig()) {
			return nil, fmt.Errorf("create namespace %s: %w", c.GetNamespace(), ErrNamespaceExists)
		}
		return &adminv1.CreateNamespaceResponse{Namespace: proto.CloneOf(prev), Index: tx.index}, nil
	}
	n := &adminv1.Namespace{
		Name:            c.GetNamespace(),
		Config:          proto.CloneOf(c.GetConfig()),
		Partition:       placement.Partition(c.GetNamespace()),
		CreatedAt:       cmd.GetNow(),
		CreatedIndex:    tx.index,
		AssignmentIndex: tx.index,
	}
	n.AssignedProxyId = tx.st.ownerOf(n)
	tx.putNamespace(n)
	return &adminv1.CreateNamespaceResponse{Namespace: proto.CloneOf(n), Created: true, Index: tx.index}, nil
}

func validateDeleteNamespace(cmd *adminv1.Command) error {
	return mesh.ValidateNamespaceName(cmd.GetDeleteNamespace().GetNamespace())
}

// applyDeleteNamespace removes a namespace. Its leases stay until their
// runners, seeing the assignment revoked, release them (or they expire):
// the admin never pulls a lease from under a serving runner.
func applyDeleteNamespace(tx *txn, cmd *adminv1.Command) (any, error) {
	name := cmd.GetDeleteNamespace().GetNamespace()
	if _, ok := tx.st.namespaces[name]; !ok {
		return &adminv1.DeleteNamespaceResponse{Index: tx.index}, nil
	}
	tx.deleteNamespace(name)
	return &adminv1.DeleteNamespaceResponse{Deleted: true, Index: tx.index}, nil
}

func validateAcquireLease(cmd *adminv1.Command) error {
	a := cmd.GetAcquireLease()
	if _, err := mesh.ParseMailboxID(a.GetMailboxId()); err != nil {
		return err
	}
	return validateHolder(a.GetRunnerId(), a.GetRunnerAddress(), a.GetTtl())
}

// applyAcquireLease grants one mailbox to a holder with no session: a grant
// of one (grant.go), refused or granted as AcquireLeases would.
func applyAcquireLease(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetAcquireLease()
	h := holder{runnerID: req.GetRunnerId(), runnerAddress: req.GetRunnerAddress(), ttl: req.GetTtl().AsDuration()}
	results, err := tx.grant(cmd, h, []string{req.GetMailboxId()})
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w", req.GetMailboxId(), err)
	}
	r := results[0]
	return &adminv1.AcquireLeaseResponse{Granted: r.GetOk(), Lease: r.GetLease(), Refusal: r.GetRefusal(), Index: tx.index}, nil
}

func validateReleaseLease(cmd *adminv1.Command) error {
	r := cmd.GetReleaseLease()
	if _, err := mesh.ParseMailboxID(r.GetMailboxId()); err != nil {
		return err
	}
	return mesh.ValidateID("runner_id", r.GetRunnerId())
}

// HolderRefusal checks that runnerID (and epoch, if non-zero) hold lease
// cur; it returns nil if so. The lessor uses it too, so heartbeats and
// releases refuse identically.
func HolderRefusal(cur *adminv1.Lease, runnerID string, epoch uint64) *adminv1.LeaseRefusal {
	switch {
	case cur.GetRunnerId() != runnerID:
		return &adminv1.LeaseRefusal{
			Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_HOLDER,
			Message: fmt.Sprintf("mailbox %s is held by runner %s (epoch %d), not %s", cur.GetMailboxId(), cur.GetRunnerId(), cur.GetEpoch(), runnerID),
			Current: proto.CloneOf(cur),
		}
	case epoch != 0 && epoch != cur.GetEpoch():
		return &adminv1.LeaseRefusal{
			Reason:  adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_STALE_EPOCH,
			Message: fmt.Sprintf("mailbox %s was re-granted to runner %s at epoch %d; caller has epoch %d", cur.GetMailboxId(), cur.GetRunnerId(), cur.GetEpoch(), epoch),
			Current: proto.CloneOf(cur),
		}
	}
	return nil
}

// applyReleaseLease removes the lease if the caller holds it. A mailbox with
// no lease answers released=false without a refusal: the release already
// happened (a retry) or the lease expired, and either way the caller's goal
// holds.
func applyReleaseLease(tx *txn, cmd *adminv1.Command) (any, error) {
	req := cmd.GetReleaseLease()
	cur, ok := tx.st.leases[req.GetMailboxId()]
	if !ok {
		return &adminv1.ReleaseLeaseResponse{Index: tx.index}, nil
	}
	if ref := HolderRefusal(cur, req.GetRunnerId(), req.GetEpoch()); ref != nil {
		return &adminv1.ReleaseLeaseResponse{Refusal: ref, Index: tx.index}, nil
	}
	tx.removeLease(cur)
	return &adminv1.ReleaseLeaseResponse{Released: true, Index: tx.index}, nil
}

func validateRefs(field string, n int, ref func(i int) (string, uint64)) error {
	for i := range n {
		mid, epoch := ref(i)
		if _, err := mesh.ParseMailboxID(mid); err != nil {
			return fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		if epoch == 0 {
			return invalid(fmt.Sprintf("%s[%d].epoch", field, i), "zero")
		}
	}
	return nil
}

func validateExpireLeases(cmd *adminv1.Command) error {
	refs := cmd.GetExpireLeases().GetLeases()
	return validateRefs("leases", len(refs), func(i int) (string, uint64) { return refs[i].GetMailboxId(), refs[i].GetEpoch() })
}

// applyExpireLeases removes each named lease that still has the named
// epoch. The leader decided they were due; the FSM only guards against the
// decision being stale.
func applyExpireLeases(tx *txn, cmd *adminv1.Command) (any, error) {
	res := &ExpireResult{}
	for _, r := range cmd.GetExpireLeases().GetLeases() {
		cur, ok := tx.st.leases[r.GetMailboxId()]
		if !ok || cur.GetEpoch() != r.GetEpoch() {
			continue
		}
		tx.removeLease(cur)
		res.Expired = append(res.Expired, proto.CloneOf(cur))
	}
	return res, nil
}

func validateCheckpointLeases(cmd *adminv1.Command) error {
	cps := cmd.GetCheckpointLeases().GetCheckpoints()
	if err := validateRefs("checkpoints", len(cps), func(i int) (string, uint64) { return cps[i].GetMailboxId(), cps[i].GetEpoch() }); err != nil {
		return err
	}
	for i, c := range cps {
		if c.GetExpiresAt() == nil || c.GetExpiresAt().CheckValid() != nil {
			return invalid(fmt.Sprintf("checkpoints[%d].expires_at", i), "missing or malformed")
		}
		if c.GetLastHeartbeatAt() == nil || c.GetLastHeartbeatAt().CheckValid() != nil {
			return invalid(fmt.Sprintf("checkpoints[%d].last_heartbeat_at", i), "missing or malformed")
		}
	}
	return nil
}

// applyCheckpointLeases copies leader-local renewals into the table for
// leases whose epoch still matches.
func applyCheckpointLeases(tx *txn, cmd *adminv1.Command) (any, error) {
	res := &CheckpointResult{}
	for _, c := range cmd.GetCheckpointLeases().GetCheckpoints() {
		cur, ok := tx.st.leases[c.GetMailboxId()]
		if !ok || cur.GetEpoch() != c.GetEpoch() {
			continue
		}
		l := proto.CloneOf(cur)
		l.ExpiresAt = c.GetExpiresAt()
		l.LastHeartbeatAt = c.GetLastHeartbeatAt()
		if c.GetStats() != nil {
			l.Stats = c.GetStats()
		}
		tx.checkpointLease(l)
		res.Applied++
	}
	return res, nil
}
