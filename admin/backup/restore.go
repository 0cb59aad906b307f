package backup

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// TermGap is how far above the snapshot's term a restored cluster starts.
//
// # Leases on restore
//
// A restored cluster grants nothing an old holder could act on:
//
//   - Every lease and session in the snapshot is revoked (expired through
//     the FSM's own ExpireSessions and ExpireLeases commands) before the
//     new cluster starts, so it starts with none. A sidecar's renewals and
//     keep-alives are refused (unknown session), and it opens a new session
//     and re-acquires, at a new epoch.
//   - The new cluster's first term is the snapshot's term (the saving node's
//     term after the copy: every epoch and session id in the snapshot is
//     below (term+1) << 40) plus TermGap, or above --min-term when that is
//     higher. Epochs are term << 40 | index (admin/fsm/epoch.go), so every
//     grant of the new cluster is above every epoch granted before the
//     snapshot, and above every epoch the old cluster granted after it
//     while its term stayed below the new cluster's first term: 65,536
//     elections after the snapshot. An operator who knows the old
//     cluster's last term (prismctl status, prism_admin_raft_term) passes
//     it as --min-term. The runners fence writes by epoch, so an old
//     holder's writes stop being accepted once the new holder writes.
//   - The FSM's epoch high-water mark comes from the snapshot, so tokens of
//     one grant entry stay above it too.
//
// The gap costs term space only: 2^24 terms allow 256 restores.
const TermGap = 1 << 16

// Options is one node's restore.
type Options struct {
	// DataDir is the new node's --data-dir; it must be empty or absent.
	DataDir string
	// NodeID is the new node's --node-id, one of Peers.
	NodeID string
	// Peers are the new cluster's voters (the --peers of every node), and
	// GRPCAddrs their admin gRPC addresses by id.
	Peers     []raftnode.Peer
	GRPCAddrs map[string]string
	// MinTerm, when above the snapshot's term + TermGap, is the last term
	// the old cluster is known to have reached; the new one starts above it.
	MinTerm uint64
	Logger  *slog.Logger
}

// Result says what a restore wrote.
type Result struct {
	Info *adminv1.SnapshotInfo
	// Index and Term of the raft snapshot the node starts from.
	Index, Term uint64
	// RevokedLeases and RevokedSessions are the snapshot's leases and
	// sessions, none of which the new cluster holds.
	RevokedLeases, RevokedSessions int
}

// RestoreFile verifies the snapshot file at path and writes a new node's
// data dir from it.
func RestoreFile(path string, o Options) (Result, error) {
	info, data, err := ReadFile(path)
	if err != nil {
		return Result{}, err
	}
	return Restore(info, data, o)
}

// Restore writes a new node's data dir from a verified snapshot. Every node
// restored from the same snapshot with the same peers gets the same raft
// snapshot, byte for byte.
func Restore(info *adminv1.SnapshotInfo, data []byte, o Options) (Result, error) {
	term := max(info.GetTerm()+TermGap, o.MinTerm+1)
	f, res, err := revoke(info, data, term, o.GRPCAddrs)
	if err != nil {
		return Result{}, err
	}
	snap, err := f.Snapshot()
	if err != nil {
		return Result{}, fmt.Errorf("snapshot restored fsm: %w", err)
	}
	defer snap.Release()
	sink := &bufferSink{}
	if err := snap.Persist(sink); err != nil {
		return Result{}, err
	}
	res.Info, res.Index, res.Term = info, f.AppliedIndex(), term
	seed := raftnode.Seed{Index: res.Index, Term: term, Peers: o.Peers, FSM: &sink.Buffer}
	if err := raftnode.Restore(o.DataDir, o.NodeID, seed); err != nil {
		return Result{}, err
	}
	if o.Logger != nil {
		o.Logger.Info("restored admin node data from snapshot", "node", o.NodeID, "dir", o.DataDir,
			"snapshot_index", info.GetIndex(), "snapshot_term", info.GetTerm(), "index", res.Index, "term", term,
			"namespaces", info.GetNamespaceCount(), "proxies", info.GetProxyCount(),
			"revoked_leases", res.RevokedLeases, "revoked_sessions", res.RevokedSessions)
	}
	return res, nil
}

// revoke loads the snapshot into an FSM and expires every session and lease
// in it by applying the FSM's own commands after the snapshot's index, in
// the new term, stamped with the save time so every node computes the same
// state. It also replaces the old members' gRPC addresses (which followers
// would forward to) with grpcAddrs, the new cluster's.
func revoke(info *adminv1.SnapshotInfo, data []byte, term uint64, grpcAddrs map[string]string) (*fsm.FSM, Result, error) {
	f := fsm.New(fsm.WithLogger(slog.New(slog.DiscardHandler)))
	if err := f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		return nil, Result{}, err
	}
	if got := f.AppliedIndex(); got != info.GetIndex() {
		return nil, Result{}, fmt.Errorf("%w: the header says index %d, the FSM snapshot holds index %d", ErrCorrupt, info.GetIndex(), got)
	}
	var res Result
	index := f.AppliedIndex()
	apply := func(cmd *adminv1.Command) error {
		cmd.Now = info.GetSavedAt()
		b, err := fsm.Encode(cmd)
		if err != nil {
			return err
		}
		index++
		if err, ok := f.Apply(&raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: b}).(error); ok {
			return err
		}
		return nil
	}
	sessions, _ := f.Sessions()
	for batch := range slices.Chunk(sessions, fsm.MaxBulkLeases) {
		ids := make([]uint64, len(batch))
		for i, s := range batch {
			ids[i] = s.GetId()
		}
		if err := apply(&adminv1.Command{Body: &adminv1.Command_ExpireSessions{ExpireSessions: &adminv1.ExpireSessionsCommand{SessionIds: ids}}}); err != nil {
			return nil, Result{}, fmt.Errorf("revoke sessions: %w", err)
		}
		res.RevokedSessions += len(ids)
	}
	// Leases of no session (ControlPlane.AcquireLease's) are left.
	leases, _ := f.Leases()
	res.RevokedLeases = int(info.GetLeaseCount())
	for batch := range slices.Chunk(leases, fsm.MaxBulkLeases) {
		refs := make([]*adminv1.LeaseRef, len(batch))
		for i, l := range batch {
			refs[i] = &adminv1.LeaseRef{MailboxId: l.GetMailboxId(), Epoch: l.GetEpoch()}
		}
		if err := apply(&adminv1.Command{Body: &adminv1.Command_ExpireLeases{ExpireLeases: &adminv1.ExpireLeasesCommand{Leases: refs}}}); err != nil {
			return nil, Result{}, fmt.Errorf("revoke leases: %w", err)
		}
	}
	old, _ := f.MemberAddresses()
	for _, id := range slices.Sorted(maps.Keys(old)) {
		if err := apply(&adminv1.Command{Body: &adminv1.Command_RemoveMember{RemoveMember: &adminv1.RemoveMemberCommand{Id: id}}}); err != nil {
			return nil, Result{}, fmt.Errorf("remove old member %s: %w", id, err)
		}
	}
	if len(grpcAddrs) > 0 {
		put := &adminv1.PutMembersCommand{}
		for _, id := range slices.Sorted(maps.Keys(grpcAddrs)) {
			put.Members = append(put.Members, &adminv1.MemberAddress{Id: id, GrpcAddress: grpcAddrs[id]})
		}
		if err := apply(&adminv1.Command{Body: &adminv1.Command_PutMembers{PutMembers: put}}); err != nil {
			return nil, Result{}, fmt.Errorf("put new members: %w", err)
		}
	}
	if c := f.Counts(); c.Leases != 0 || c.Sessions != 0 {
		return nil, Result{}, fmt.Errorf("revoke: %d leases and %d sessions are left", c.Leases, c.Sessions)
	}
	return f, res, nil
}
