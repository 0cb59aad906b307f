package control

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/internal/boottime"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

const testBootID = "6a1b0c8e-0000-4000-8000-000000000001"

// newServerBoot is newServerClock with a boot clock that runs with the fake
// clock, at boot (an instant on it) when the test starts.
func newServerBoot(t *testing.T, boot time.Duration) (*Server, *fakeHost, *clocktesting.FakeClock) {
	t.Helper()
	h := newFakeHost()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	read := func() (boottime.Stamp, bool) {
		return boottime.Stamp{BootID: testBootID, Since: boot + clk.Since(start)}, true
	}
	s := New(Config{Host: h, Registerer: prometheus.NewRegistry(), Clock: clk, Boottime: read, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return s, h, clk
}

// valid_for counts from receipt, so a call that waited in a paused runner's
// socket would outlast what the sidecar meant; its bound on the shared boot
// clock cuts it back. A bound passed on receipt is a passed deadline: the
// call is refused and fences, and the deadline the runner holds is not
// moved. Another boot's bound (another host), or none, leaves valid_for as
// it is.
func TestBoottimeBoundCutsValidFor(t *testing.T) {
	t.Parallel()
	const (
		id    = "a@p"
		boot  = time.Hour // the boot clock when the test starts
		first = 10 * time.Second
		step  = time.Second // between the first activation and the call
	)
	now := boot + step // the boot clock when the call arrives
	calls := []struct {
		name string
		// fresh: the call opens the mailbox; otherwise it is active
		// under epoch 7 for first, step ago.
		fresh bool
		call  func(*Server, *runnerv1.BoottimeBound) (*runnerv1.MailboxStatus, error)
	}{
		{"extend", false, func(s *Server, b *runnerv1.BoottimeBound) (*runnerv1.MailboxStatus, error) {
			r, err := s.ExtendMailbox(context.Background(), &runnerv1.ExtendMailboxRequest{MailboxId: id, Epoch: 7, ValidFor: vf, Bound: b})
			return r.GetStatus(), err
		}},
		{"activate", false, func(s *Server, b *runnerv1.BoottimeBound) (*runnerv1.MailboxStatus, error) {
			r, err := s.ActivateMailbox(context.Background(), &runnerv1.ActivateMailboxRequest{MailboxId: id, Epoch: 7, ValidFor: vf, Bound: b})
			return r.GetStatus(), err
		}},
		{"open", true, func(s *Server, b *runnerv1.BoottimeBound) (*runnerv1.MailboxStatus, error) {
			r, err := s.OpenMailbox(context.Background(), &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: 7, ValidFor: vf, Bound: b})
			return r.GetStatus(), err
		}},
	}
	bounds := []struct {
		name  string
		bound *runnerv1.BoottimeBound
		want  time.Duration // the time left granted; 0: refused and fenced
	}{
		{"none", nil, vf.AsDuration()},
		{"another boot", &runnerv1.BoottimeBound{BootId: "another", ValidUntilBoottime: int64(now - time.Second)}, vf.AsDuration()},
		{"later than valid_for", &runnerv1.BoottimeBound{BootId: testBootID, ValidUntilBoottime: int64(now + 2*vf.AsDuration())}, vf.AsDuration()},
		{"earlier than valid_for", &runnerv1.BoottimeBound{BootId: testBootID, ValidUntilBoottime: int64(now + 4*time.Second)}, 4 * time.Second},
		{"passed", &runnerv1.BoottimeBound{BootId: testBootID, ValidUntilBoottime: int64(now - time.Second)}, 0},
		{"passing on receipt", &runnerv1.BoottimeBound{BootId: testBootID, ValidUntilBoottime: int64(now)}, 0},
	}
	for _, c := range calls {
		for _, b := range bounds {
			t.Run(c.name+"/"+b.name, func(t *testing.T) {
				t.Parallel()
				s, h, clk := newServerBoot(t, boot)
				var held time.Duration // what the runner holds before the call
				if !c.fresh {
					if _, err := s.OpenMailbox(context.Background(), &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: 7, ValidFor: durationpb.New(first)}); err != nil {
						t.Fatal(err)
					}
					held = first
				}
				clk.Step(step)
				h.takeCalls()
				st, err := c.call(s, b.bound)
				h.mu.Lock()
				got := h.validFor[id]
				h.mu.Unlock()
				if b.want == 0 {
					if status.Code(err) != codes.FailedPrecondition {
						t.Fatalf("a late %s: %v, want FailedPrecondition", c.name, err)
					}
					if got != held {
						t.Fatalf("the runner was given %v, want the deadline it held (%v) unmoved", got, held)
					}
					st := stateOf(t, s, id)
					if st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_FENCED || st.GetFenceReason() != "deadline_passed" {
						t.Fatalf("after a late %s: %v, want fenced (deadline_passed)", c.name, st)
					}
					if calls := h.takeCalls(); !slices.Contains(calls, "close "+id) || h.Consuming(id) {
						t.Fatalf("calls %v: the runner must close the mailbox at once", calls)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got != b.want || st.GetValidFor().AsDuration() != b.want {
					t.Fatalf("runner given %v, status valid_for %v, want %v", got, st.GetValidFor().AsDuration(), b.want)
				}
				clk.Step(b.want - time.Nanosecond)
				if st := stateOf(t, s, id); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE {
					t.Fatalf("fenced before the deadline: %v", st)
				}
				clk.Step(time.Nanosecond)
				waitFor(t, func() bool { return stateOf(t, s, id).GetState() == runnerv1.MailboxState_MAILBOX_STATE_FENCED })
			})
		}
	}
}
