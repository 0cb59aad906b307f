package fsm

import (
	"fmt"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
)

// The members table maps raft server ids to admin gRPC addresses. Raft's
// configuration knows only raft addresses; forwarding needs the gRPC one of
// whoever leads, including members added at runtime.

// MembersResult counts the rows a PutMembersCommand wrote.
type MembersResult struct {
	Put int
}

// MaxMembers bounds one PutMembersCommand; raft groups are a handful.
const MaxMembers = 64

func validatePutMembers(cmd *adminv1.Command) error {
	ms := cmd.GetPutMembers().GetMembers()
	if len(ms) == 0 || len(ms) > MaxMembers {
		return invalid("members", "%d members, want 1-%d", len(ms), MaxMembers)
	}
	seen := map[string]bool{}
	for i, m := range ms {
		if err := mesh.ValidateID(fmt.Sprintf("members[%d].id", i), m.GetId()); err != nil {
			return err
		}
		if seen[m.GetId()] {
			return invalid(fmt.Sprintf("members[%d].id", i), "%q appears twice", m.GetId())
		}
		seen[m.GetId()] = true
		if err := ValidateAddress(fmt.Sprintf("members[%d].grpc_address", i), m.GetGrpcAddress()); err != nil {
			return err
		}
	}
	return nil
}

// applyPutMembers writes each row, or with only_absent each row whose id has
// none yet, so the leader's bootstrap rows never undo a later AddVoter's.
func applyPutMembers(tx *txn, cmd *adminv1.Command) (any, error) {
	res := &MembersResult{}
	onlyAbsent := cmd.GetPutMembers().GetOnlyAbsent()
	for _, m := range cmd.GetPutMembers().GetMembers() {
		cur, ok := tx.st.members[m.GetId()]
		if ok && (onlyAbsent || cur.GetGrpcAddress() == m.GetGrpcAddress()) {
			continue
		}
		tx.st.members[m.GetId()] = proto.CloneOf(m)
		tx.changed = true
		res.Put++
	}
	return res, nil
}

func validateRemoveMember(cmd *adminv1.Command) error {
	return mesh.ValidateID("id", cmd.GetRemoveMember().GetId())
}

func applyRemoveMember(tx *txn, cmd *adminv1.Command) (any, error) {
	id := cmd.GetRemoveMember().GetId()
	if _, ok := tx.st.members[id]; ok {
		delete(tx.st.members, id)
		tx.changed = true
	}
	return nil, nil
}

// MemberAddresses returns the members table: raft server id to admin gRPC
// address.
func (f *FSM) MemberAddresses() (map[string]string, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]string, len(f.st.members))
	for id, m := range f.st.members {
		out[id] = m.GetGrpcAddress()
	}
	return out, f.applied
}

// MemberAddress returns one member's admin gRPC address, or "".
func (f *FSM) MemberAddress(id string) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.members[id].GetGrpcAddress()
}
