package lease

import (
	"fmt"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// ValidateRenew checks a heartbeat request before Renew; errors wrap
// mesh.ErrInvalid (fsm.ErrInvalid is the same error) and name the field
// (gRPC InvalidArgument).
func ValidateRenew(req *adminv1.MailboxHeartbeatRequest) error {
	if _, err := mesh.ParseMailboxID(req.GetMailboxId()); err != nil {
		return err
	}
	if err := mesh.ValidateID("runner_id", req.GetRunnerId()); err != nil {
		return err
	}
	s := req.GetStats()
	if s.GetEventsStored() < 0 || s.GetQueriesServed() < 0 || s.GetStorageBytes() < 0 {
		return fmt.Errorf("%w: stats: counters must not be negative", mesh.ErrInvalid)
	}
	if _, ok := adminv1.RunnerHealth_name[int32(s.GetHealth())]; !ok {
		return fmt.Errorf("%w: stats.health: unknown value %d", mesh.ErrInvalid, s.GetHealth())
	}
	return nil
}
