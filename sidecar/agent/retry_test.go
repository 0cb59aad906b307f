package agent

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// shedErr is the admin's refusal of new work when it cannot keep up
// (admin/server/admission.go).
func shedErr(t *testing.T, d time.Duration) error {
	t.Helper()
	st, err := status.New(codes.ResourceExhausted, "shed: retry later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// A call the admin sheds with a retry delay longer than the backoff (1 s in
// the harness) is tried again no sooner than that delay, whichever call it
// was, and counted as shed.
func TestShedCallWaitsForRetryDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, call, prefix string
		delay              time.Duration
		mode               func(*Config)
		assign             bool
		// shedOnce makes the admin shed the call's first try.
		shedOnce func(f *fakeAdmin, err error)
	}{
		{
			name: "open session", call: "open_session", prefix: "admin open-session", delay: 7 * time.Second, mode: sessionMode,
			shedOnce: func(f *fakeAdmin, err error) {
				var n atomic.Int32
				f.setOpen(func(*adminv1.OpenSessionRequest) (*adminv1.OpenSessionResponse, error) {
					if n.Add(1) == 1 {
						return nil, err
					}
					return nil, nil
				})
			},
		},
		{
			name: "acquire batch", call: "acquire_leases", prefix: "admin acquire-leases", delay: 7 * time.Second, mode: sessionMode, assign: true,
			shedOnce: func(f *fakeAdmin, err error) {
				var n atomic.Int32
				f.mu.Lock()
				f.s.acquireLeasesFn = func(*adminv1.AcquireLeasesRequest) error {
					if n.Add(1) == 1 {
						return err
					}
					return nil
				}
				f.mu.Unlock()
			},
		},
		{
			name: "keepalive", call: "keepalive", prefix: "admin keepalive", delay: 2 * time.Second, mode: sessionMode,
			shedOnce: func(f *fakeAdmin, err error) {
				var n atomic.Int32
				f.setKeepAlive(func(*adminv1.KeepAliveSessionRequest) (*adminv1.KeepAliveSessionResponse, error) {
					if n.Add(1) == 1 {
						return nil, err
					}
					return &adminv1.KeepAliveSessionResponse{Renewed: true, Ttl: durationpb.New(testTTL)}, nil
				})
			},
		},
		{
			name: "acquire mailbox lease", call: "acquire", prefix: "admin acquire audit@p1", delay: 7 * time.Second, mode: func(*Config) {}, assign: true,
			shedOnce: func(f *fakeAdmin, err error) {
				var n atomic.Int32
				f.setAcquire(func(*adminv1.AcquireLeaseRequest) (*adminv1.AcquireLeaseResponse, error) {
					if n.Add(1) == 1 {
						return nil, err
					}
					return nil, nil
				})
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := shedErr(t, tc.delay)
			h := newHarness(t, tc.mode, func(c *Config) { tc.shedOnce(c.Admin.(*fakeAdmin), err) })
			if tc.assign {
				h.assign(1, "audit")
			}
			// Step the clock in small increments until the call was made
			// twice: a retry after the backoff alone comes 1 s after the
			// shed.
			deadline := time.Now().Add(20 * time.Second)
			for h.ev.count(tc.prefix) < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("no retry of %s:\n%s", tc.prefix, h.ev)
				}
				h.clk.Step(250 * time.Millisecond)
				time.Sleep(10 * time.Millisecond)
			}
			first, shed := h.waitEvent(0, tc.prefix)
			_, retried := h.waitEvent(first+1, tc.prefix)
			if gap := retried.at.Sub(shed.at); gap < tc.delay {
				t.Fatalf("retried %s after %s, want at least the %s the admin asked for:\n%s", tc.prefix, gap, tc.delay, h.ev)
			}
			if got := testutil.ToFloat64(h.agent.m.shed.WithLabelValues(tc.call)); got != 1 {
				t.Fatalf("shed %s counted %v, want 1", tc.call, got)
			}
		})
	}
}

func TestRetryHint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want time.Duration
		ok   bool
	}{
		{"shed", shedErr(t, 3*time.Second), 3 * time.Second, true},
		{"shed, wrapped", fmt.Errorf("acquire: %w", shedErr(t, time.Second)), time.Second, true},
		{"exhausted without hint", status.Error(codes.ResourceExhausted, "quota"), 0, false},
		{"other code", status.Error(codes.Unavailable, "down"), 0, false},
		{"nil", nil, 0, false},
	}
	for _, tc := range tests {
		if got, ok := retryHint(tc.err); got != tc.want || ok != tc.ok {
			t.Errorf("%s: retryHint = %s, %v; want %s, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
