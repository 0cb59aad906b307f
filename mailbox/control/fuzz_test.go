package control

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// FuzzControlCalls drives a sequence of control calls with arbitrary ids,
// configs, epochs and durations: no call may panic, and every failure is one
// of the documented codes.
func FuzzControlCalls(f *testing.F) {
	f.Add("a@p", "t", int32(1), int64(0), int64(0), uint64(3), int64(1e9), []byte{0, 1, 2, 3, 4, 5})
	f.Add("../x", "", int32(9), int64(-1), int64(-5), uint64(0), int64(-1), []byte{1, 1, 3, 2, 0})
	f.Add("a@p", "t", int32(0), int64(1), int64(1), uint64(1<<63), int64(0), []byte{0, 0, 1, 1, 2, 2, 5, 4})
	allowed := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.FailedPrecondition: true, codes.Internal: true, codes.Unavailable: true}
	f.Fuzz(func(t *testing.T, id, topic string, mode int32, maxAge, maxSize int64, epoch uint64, validFor int64, ops []byte) {
		s, _, _, _ := newServerClock(t)
		ctx := context.Background()
		cfg := &runnerv1.MailboxConfig{Topics: []string{topic}, ValidationMode: runnerv1.ValidationMode(mode), MaxAgeMillis: maxAge, MaxSizeBytes: maxSize}
		vf := durationpb.New(time.Duration(validFor))
		if len(ops) > 32 {
			ops = ops[:32]
		}
		for i, op := range ops {
			var err error
			switch op % 8 {
			case 0:
				_, err = s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg})
			case 1:
				_, err = s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: id, Epoch: epoch + uint64(i), ValidFor: vf})
			case 2:
				_, err = s.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: id, Reason: topic})
			case 3:
				_, err = s.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: id, Epoch: epoch, ValidFor: vf})
			case 4:
				_, err = s.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: id})
			case 5:
				_, err = s.GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: id})
			case 6:
				_, err = s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: epoch, ValidFor: vf})
			case 7:
				_, err = s.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{id}})
			}
			if c := status.Code(err); !allowed[c] {
				t.Fatalf("op %d: code %v: %v", op%8, c, err)
			}
		}
		_ = s.Ready()
	})
}
