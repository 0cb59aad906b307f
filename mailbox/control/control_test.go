package control

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/runner"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// fakeHost records what the control API asked of the runner.
type fakeHost struct {
	mu      sync.Mutex
	open    map[string]runner.MailboxConfig
	drained map[string]bool
	calls   []string
	failOn  string
	queries map[string]int64
	lags    map[string]int64 // reported lag; absent is unknown
	// reported stored positions; absent is unknown
	positions map[string][]ingest.Position
	// gates hold the calls named as calls records them ("prepare a@p")
	// until their channel is closed.
	gates map[string]chan struct{}
	// reads counts Status and Statuses calls.
	reads struct{ one, all int }
	// expired are the mailboxes whose deadline the runner holds as passed
	// (SetValidFor refuses); deadlines are not recorded in calls.
	expired map[string]bool
	// validFor is the last time left each mailbox was given (SetValidFor).
	validFor map[string]time.Duration
	// allowed is each mailbox's recovery peers (AllowRecovery).
	allowed map[string][]string
	// recovery is each mailbox's reported recovery.
	recovery map[string]runner.RecoveryStatus
}

func (h *fakeHost) UpdateRecovery(id string, src runner.RecoverySource) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "update recovery "+id+" "+src.Address)
}

func (h *fakeHost) AllowRecovery(id string, proxies []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(proxies) == 0 {
		delete(h.allowed, id)
		return
	}
	h.allowed[id] = proxies
}

// gate waits until the gate of call, if any, is open.
func (h *fakeHost) gate(call string) {
	h.mu.Lock()
	ch := h.gates[call]
	h.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func newFakeHost() *fakeHost {
	return &fakeHost{open: map[string]runner.MailboxConfig{}, drained: map[string]bool{}, allowed: map[string][]string{}, recovery: map[string]runner.RecoveryStatus{}}
}

func (h *fakeHost) Drain(id string) error {
	h.gate("drain " + id)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "drain "+id)
	if _, ok := h.open[id]; !ok {
		return runner.ErrNotOpen
	}
	h.drained[id] = true
	return nil
}

func (h *fakeHost) Prepare(mc runner.MailboxConfig) error {
	h.gate("prepare " + mc.ID)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "prepare "+mc.ID)
	if h.failOn == "prepare "+mc.ID {
		return fmt.Errorf("disk full")
	}
	return nil
}

func (h *fakeHost) Discard(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "discard "+id)
	return nil
}

func (h *fakeHost) Open(mc runner.MailboxConfig) error {
	h.gate(fmt.Sprintf("open %s %d", mc.ID, mc.Epoch))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, fmt.Sprintf("open %s %d", mc.ID, mc.Epoch))
	if h.failOn == mc.ID {
		return fmt.Errorf("disk full")
	}
	if _, ok := h.open[mc.ID]; ok {
		return fmt.Errorf("already open")
	}
	h.open[mc.ID] = mc
	return nil
}

func (h *fakeHost) CloseMailbox(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "close "+id)
	if _, ok := h.open[id]; !ok {
		return runner.ErrNotOpen
	}
	delete(h.open, id)
	delete(h.drained, id)
	return nil
}

func (h *fakeHost) SetEpoch(id string, epoch uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, fmt.Sprintf("epoch %s %d", id, epoch))
	mc, ok := h.open[id]
	if !ok {
		return runner.ErrNotOpen
	}
	mc.Epoch = epoch
	h.open[id] = mc
	return nil
}

func (h *fakeHost) SetValidFor(id string, d time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.expired[id] {
		return runner.ErrDeadlinePassed
	}
	if h.validFor == nil {
		h.validFor = map[string]time.Duration{}
	}
	h.validFor[id] = d
	return nil
}

// Consuming is whether the fake consumes mailbox id.
func (h *fakeHost) Consuming(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.consumingLocked(id)
}

func (h *fakeHost) consumingLocked(id string) bool {
	_, ok := h.open[id]
	return ok && !h.drained[id]
}

func (h *fakeHost) Status(id string) (runner.Status, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reads.one++
	return h.statusLocked(id)
}

func (h *fakeHost) statusLocked(id string) (runner.Status, bool) {
	if _, ok := h.open[id]; !ok {
		return runner.Status{}, false
	}
	lag, lagKnown := h.lags[id]
	return runner.Status{
		Consuming: h.consumingLocked(id), Lag: lag, LagKnown: lagKnown, Positions: h.positions[id],
		Events: 7, Bytes: 700, StoreKnown: true, QueriesServed: h.queries[id], Recovery: h.recovery[id],
	}, true
}

func (h *fakeHost) Statuses() map[string]runner.Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reads.all++
	out := make(map[string]runner.Status, len(h.open))
	for id := range h.open {
		out[id], _ = h.statusLocked(id)
	}
	return out
}

func (h *fakeHost) takeCalls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	return c
}

var vf = durationpb.New(10 * time.Second)

var cfg = &runnerv1.MailboxConfig{Topics: []string{"audit.events"}, ValidationMode: runnerv1.ValidationMode_VALIDATION_MODE_WARN, MaxAgeMillis: 60000}

func newServer(t *testing.T) (*Server, *fakeHost, *prometheus.Registry) {
	s, h, reg, _ := newServerClock(t)
	return s, h, reg
}

func newServerClock(t *testing.T) (*Server, *fakeHost, *prometheus.Registry, *clocktesting.FakeClock) {
	t.Helper()
	h := newFakeHost()
	reg := prometheus.NewRegistry()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return New(Config{Host: h, Registerer: reg, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}), h, reg, clk
}

func TestOpenDoesNotServeUntilActivated(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	resp, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "audit@p1", Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetStatus().GetState(); got != runnerv1.MailboxState_MAILBOX_STATE_OPEN {
		t.Fatalf("state %v, want OPEN", got)
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"prepare audit@p1"}) {
		t.Fatalf("calls %v: before a lease epoch the runner only opens the store", c)
	}
	if s.Ready() == nil {
		t.Fatal("ready with a mailbox waiting for its lease")
	}
	act, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "audit@p1", Epoch: 12, ValidFor: vf})
	if err != nil {
		t.Fatal(err)
	}
	if act.GetStatus().GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || act.GetStatus().GetEpoch() != 12 || act.GetStatus().GetEventsStored() != 7 {
		t.Fatalf("status %v", act.GetStatus())
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"open audit@p1 12"}) {
		t.Fatalf("calls %v: want the store opened with its epoch in one step", c)
	}
	mc := h.open["audit@p1"]
	if mc.Mode != envelope.Warn || mc.MaxAge.Seconds() != 60 || !slices.Equal(mc.Topics, cfg.Topics) {
		t.Fatalf("runner config %+v", mc)
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("not ready with every mailbox active: %v", err)
	}
}

func TestOpenWithEpochActivatesAtOnce(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	resp, err := s.OpenMailbox(context.Background(), &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 3, ValidFor: vf})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus().GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE {
		t.Fatalf("state %v", resp.GetStatus().GetState())
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"prepare a@p", "open a@p 3"}) {
		t.Fatalf("calls %v", c)
	}
}

func TestEpochs(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 10, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	h.takeCalls()
	_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 9, ValidFor: vf})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("older epoch: %v, want FailedPrecondition", err)
	}
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 10, ValidFor: vf}); err != nil {
		t.Fatalf("same epoch again (a retry): %v", err)
	}
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 15, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"epoch a@p 15"}) {
		t.Fatalf("calls %v: a newer epoch on a live mailbox moves it without reopening", c)
	}
}

func TestFenceKeepsRecordAndReactivates(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 4, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	h.takeCalls()
	f, err := s.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: "a@p", Reason: "ttl_elapsed"})
	if err != nil {
		t.Fatal(err)
	}
	if f.GetStatus().GetState() != runnerv1.MailboxState_MAILBOX_STATE_FENCED || f.GetStatus().GetEpoch() != 4 {
		t.Fatalf("status %v", f.GetStatus())
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"close a@p"}) {
		t.Fatalf("calls %v", c)
	}
	if h.Consuming("a@p") {
		t.Fatal("fenced mailbox still consuming")
	}
	if got := testutil.ToFloat64(s.fences.WithLabelValues("ttl_elapsed")); got != 1 {
		t.Fatalf("fences counted %v", got)
	}
	if _, err := s.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: "a@p", Reason: "again"}); err != nil {
		t.Fatalf("fencing a fenced mailbox: %v", err)
	}
	if c := h.takeCalls(); len(c) != 0 {
		t.Fatalf("second fence touched the runner: %v", c)
	}
	if s.Ready() == nil {
		t.Fatal("ready with a fenced mailbox")
	}
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 3, ValidFor: vf}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("reactivating under an older epoch: %v", err)
	}
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 8, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"open a@p 8"}) {
		t.Fatalf("calls %v", c)
	}
}

func TestCloseAndDrain(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	for i, id := range []string{"a@p", "b@p", "c@p"} {
		if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: uint64(i), ValidFor: vf}); err != nil {
			t.Fatal(err)
		}
	}
	h.takeCalls()
	c, err := s.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: "b@p"})
	if err != nil || !c.GetClosed() {
		t.Fatalf("close: %v %v", c, err)
	}
	c, err = s.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: "b@p"})
	if err != nil || c.GetClosed() {
		t.Fatalf("second close: %v %v, want closed=false", c, err)
	}
	if calls := h.takeCalls(); !slices.Equal(calls, []string{"close b@p"}) {
		t.Fatalf("calls %v", calls)
	}
	d, err := s.Drain(ctx, &runnerv1.DrainRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.GetDrained(), []string{"c@p"}) {
		t.Fatalf("drained %v: only the consuming mailbox drains", d.GetDrained())
	}
	if calls := h.takeCalls(); !slices.Equal(calls, []string{"drain c@p"}) {
		t.Fatalf("calls %v", calls)
	}
	if st := stateOf(t, s, "c@p"); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || !st.GetDrained() || st.GetConsuming() {
		t.Fatalf("drained mailbox %v: still served, no longer consuming", st)
	}
	if err := s.Ready(); err == nil || err.Error() != "draining" {
		t.Fatalf("ready while draining: %v", err)
	}
	for _, id := range []string{"a@p", "c@p"} {
		if _, err := s.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if calls := h.takeCalls(); !slices.Equal(calls, []string{"discard a@p", "close c@p"}) {
		t.Fatalf("calls %v: the OPEN mailbox's store is discarded, the drained one closed", calls)
	}
}

func TestDrainOne(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	for _, id := range []string{"a@p", "b@p"} {
		if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: 1, ValidFor: vf}); err != nil {
			t.Fatal(err)
		}
	}
	h.takeCalls()
	d, err := s.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{"a@p"}})
	if err != nil || !slices.Equal(d.GetDrained(), []string{"a@p"}) {
		t.Fatalf("drain a: %v %v", d, err)
	}
	if !h.Consuming("b@p") || h.Consuming("a@p") {
		t.Fatal("draining a@p touched b@p, or a@p still consumes")
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "c@p", Config: cfg}); err != nil {
		t.Fatalf("draining one mailbox must not stop the runner taking others: %v", err)
	}
	if _, err := s.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{"../x"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad id: %v", err)
	}
}

func TestStatsCountsQueries(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	h.queries = map[string]int64{"a@p": 5, "b@p": 9}
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 1, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "b@p", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.GetStats(ctx, &runnerv1.GetStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetMailboxes()) != 2 {
		t.Fatalf("stats %v", resp)
	}
	a, b := resp.GetMailboxes()[0], resp.GetMailboxes()[1]
	if a.GetMailboxId() != "a@p" || a.GetQueriesServed() != 5 || a.GetEventsStored() != 7 || a.GetStorageBytes() != 700 || !a.GetConsuming() || a.GetEpoch() != 1 {
		t.Fatalf("a: %v", a)
	}
	if b.GetState() != runnerv1.MailboxState_MAILBOX_STATE_OPEN || b.GetEventsStored() != 0 {
		t.Fatalf("b: %v", b)
	}
	if _, err := s.GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: "zz@p"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown mailbox: %v", err)
	}
}

// TestStatsLag: a serving mailbox reports its consumer's lag once the
// consumer knows it, and none (unknown) while it does not; a mailbox not
// serving (open, fenced) reports none whatever the consumer last said.
func TestStatsLag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		epoch  uint64 // 0 leaves it OPEN
		fence  bool
		lags   map[string]int64
		want   *int64 // nil: unknown
		active bool
	}{
		{name: "serving, known", epoch: 1, lags: map[string]int64{"a@p": 42}, want: proto.Int64(42), active: true},
		{name: "serving, caught up", epoch: 1, lags: map[string]int64{"a@p": 0}, want: proto.Int64(0), active: true},
		{name: "serving, unknown", epoch: 1, active: true},
		{name: "open, not serving", lags: map[string]int64{"a@p": 42}},
		{name: "fenced", epoch: 1, fence: true, lags: map[string]int64{"a@p": 42}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, h, _ := newServer(t)
			h.lags = tt.lags
			ctx := context.Background()
			req := &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg}
			if tt.epoch != 0 {
				req.Epoch, req.ValidFor = tt.epoch, vf
			}
			open, err := s.OpenMailbox(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if tt.fence {
				if _, err := s.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: "a@p", Reason: "test"}); err != nil {
					t.Fatal(err)
				}
			} else if got := open.GetStatus().Lag; !equalPtr(got, tt.want) {
				t.Fatalf("OpenMailbox status lag = %v, want %v", open.GetStatus(), tt.want)
			}
			resp, err := s.GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: "a@p"})
			if err != nil {
				t.Fatal(err)
			}
			st := resp.GetMailboxes()[0]
			if !equalPtr(st.Lag, tt.want) || (st.GetState() == runnerv1.MailboxState_MAILBOX_STATE_ACTIVE) != tt.active {
				t.Fatalf("GetStats = %v; want lag %v, active %v", st, tt.want, tt.active)
			}
		})
	}
}

// TestStatsPositions: a serving mailbox reports its stored positions per
// topic-partition once its consumer knows them, none while it does not, and
// a mailbox not serving none at all.
func TestStatsPositions(t *testing.T) {
	t.Parallel()
	known := []ingest.Position{{Topic: "a", Partition: 0, Next: 17}, {Topic: "a", Partition: 1, Next: 0}, {Topic: "b", Partition: 0, Next: 5}}
	want := []*runnerv1.StoredPosition{{Topic: "a", Partition: 0, NextOffset: 17}, {Topic: "a", Partition: 1, NextOffset: 0}, {Topic: "b", Partition: 0, NextOffset: 5}}
	tests := []struct {
		name      string
		epoch     uint64 // 0 leaves it OPEN
		positions map[string][]ingest.Position
		want      []*runnerv1.StoredPosition
	}{
		{name: "serving, known", epoch: 1, positions: map[string][]ingest.Position{"a@p": known}, want: want},
		{name: "serving, unknown", epoch: 1},
		{name: "serving, another mailbox's", epoch: 1, positions: map[string][]ingest.Position{"b@p": known}},
		{name: "open, not serving", positions: map[string][]ingest.Position{"a@p": known}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, h, _ := newServer(t)
			h.positions = tt.positions
			ctx := context.Background()
			req := &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg}
			if tt.epoch != 0 {
				req.Epoch, req.ValidFor = tt.epoch, vf
			}
			if _, err := s.OpenMailbox(ctx, req); err != nil {
				t.Fatal(err)
			}
			resp, err := s.GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: "a@p"})
			if err != nil {
				t.Fatal(err)
			}
			got := resp.GetMailboxes()[0].GetStoredPositions()
			if len(got) != len(tt.want) {
				t.Fatalf("stored positions = %v, want %v", got, tt.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Fatalf("stored positions = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func equalPtr[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func TestBadRequests(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	h.failOn = "broken@p"
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "broken@p", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"open without id", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{Config: cfg})
			return err
		}, codes.InvalidArgument},
		{"open with a path in the id", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "../x", Config: cfg})
			return err
		}, codes.InvalidArgument},
		{"open without topics", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "x@p"})
			return err
		}, codes.InvalidArgument},
		{"open with an unknown validation mode", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "x@p", Config: &runnerv1.MailboxConfig{Topics: []string{"t"}, ValidationMode: 42}})
			return err
		}, codes.InvalidArgument},
		{"open with a dead-letter topic it consumes", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "x@p", Config: &runnerv1.MailboxConfig{Topics: []string{"t", "u"}, DeadLetterTopic: "u"}})
			return err
		}, codes.InvalidArgument},
		{"open again with another config", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: &runnerv1.MailboxConfig{Topics: []string{"other"}}})
			return err
		}, codes.FailedPrecondition},
		{"activate without epoch", func() error {
			_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p"})
			return err
		}, codes.InvalidArgument},
		{"activate without valid_for", func() error {
			_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 1})
			return err
		}, codes.InvalidArgument},
		{"activate with a negative valid_for", func() error {
			_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 1, ValidFor: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument},
		{"open with an epoch but no valid_for", func() error {
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 1})
			return err
		}, codes.InvalidArgument},
		{"extend a mailbox that is not active", func() error {
			_, err := s.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: "a@p", Epoch: 1, ValidFor: vf})
			return err
		}, codes.FailedPrecondition},
		{"open when the store cannot be opened", func() error {
			h.failOn = "prepare disk@p"
			_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "disk@p", Config: cfg})
			return err
		}, codes.Internal},
		{"activate what failed to open", func() error {
			_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "disk@p", Epoch: 1, ValidFor: vf})
			return err
		}, codes.NotFound},
		{"activate unknown", func() error {
			_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "nope@p", Epoch: 1, ValidFor: vf})
			return err
		}, codes.NotFound},
		{"activate when the runner fails", func() error {
			h.failOn = "broken@p"
			_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "broken@p", Epoch: 1, ValidFor: vf})
			return err
		}, codes.Internal},
		{"fence unknown", func() error {
			_, err := s.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: "nope@p"})
			return err
		}, codes.NotFound},
	}
	for _, tc := range tests {
		if got := status.Code(tc.call()); got != tc.want {
			t.Errorf("%s: code %v, want %v", tc.name, got, tc.want)
		}
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg}); err != nil {
		t.Fatalf("reopening with the same config is a retry and succeeds: %v", err)
	}
}

// The runner must stop on its own when the sidecar stops extending: the
// sidecar may be dead while the admin's clock keeps running.
func TestDeadlineFencesWithoutSidecar(t *testing.T) {
	t.Parallel()
	s, h, _, clk := newServerClock(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 7, ValidFor: durationpb.New(3 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	ext, err := s.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: "a@p", Epoch: 7, ValidFor: durationpb.New(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if got := ext.GetStatus().GetValidFor().AsDuration(); got != 3*time.Second {
		t.Fatalf("valid_for after extend %v", got)
	}
	if _, err := s.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: "a@p", Epoch: 6, ValidFor: vf}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("extend with another epoch: %v", err)
	}
	// The first deadline (t+3s) was replaced by the extension (t+5s).
	clk.Step(2 * time.Second)
	if st := stateOf(t, s, "a@p"); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE {
		t.Fatalf("fenced at the superseded deadline: %v", st)
	}
	clk.Step(time.Second)
	waitFor(t, func() bool { return stateOf(t, s, "a@p").GetState() == runnerv1.MailboxState_MAILBOX_STATE_FENCED })
	st := stateOf(t, s, "a@p")
	if st.GetFenceReason() != "deadline_passed" || st.GetEpoch() != 7 {
		t.Fatalf("status %v", st)
	}
	if h.Consuming("a@p") {
		t.Fatal("still consuming after the deadline")
	}
	if _, err := s.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: "a@p", Epoch: 7, ValidFor: vf}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("extending a fenced mailbox must fail so the sidecar re-activates: %v", err)
	}
}

// A runner paused past a mailbox's deadline serves the calls queued in the
// pause before its timer fences: an extension or a re-activation under the
// same epoch that finds the runner holding the deadline as passed must not
// move it (the sidecar that sent it may have lost the lease meanwhile), and
// fences the mailbox at once instead of waiting for the timer.
func TestLateCallsAfterTheDeadlineFence(t *testing.T) {
	t.Parallel()
	for _, late := range []struct {
		name string
		call func(*Server) error
	}{
		{"extend", func(s *Server) error {
			_, err := s.ExtendMailbox(context.Background(), &runnerv1.ExtendMailboxRequest{MailboxId: "a@p", Epoch: 7, ValidFor: vf})
			return err
		}},
		{"activate", func(s *Server) error {
			_, err := s.ActivateMailbox(context.Background(), &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 7, ValidFor: vf})
			return err
		}},
	} {
		t.Run(late.name, func(t *testing.T) {
			t.Parallel()
			s, h, _ := newServer(t)
			if _, err := s.OpenMailbox(context.Background(), &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 7, ValidFor: vf}); err != nil {
				t.Fatal(err)
			}
			h.takeCalls()
			// The control API's timer has yet to run; the runner's own
			// check of the deadline says it passed.
			h.mu.Lock()
			h.expired = map[string]bool{"a@p": true}
			h.mu.Unlock()
			if err := late.call(s); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("late %s: %v, want FailedPrecondition", late.name, err)
			}
			st := stateOf(t, s, "a@p")
			if st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_FENCED || st.GetFenceReason() != "deadline_passed" || st.GetEpoch() != 7 {
				t.Fatalf("after a late %s: %v, want fenced (deadline_passed) at epoch 7", late.name, st)
			}
			if c := h.takeCalls(); !slices.Contains(c, "close a@p") || h.Consuming("a@p") {
				t.Fatalf("calls %v: the runner must close the mailbox at once", c)
			}
			if v := testutil.ToFloat64(s.fences.WithLabelValues("deadline_passed")); v != 1 {
				t.Fatalf("deadline_passed fences %v, want 1", v)
			}
		})
	}
}

func stateOf(t *testing.T, s *Server, id string) *runnerv1.MailboxStatus {
	t.Helper()
	resp, err := s.GetStats(context.Background(), &runnerv1.GetStatsRequest{MailboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetMailboxes()[0]
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A drained mailbox is still served, so a fence must stop it like an active
// one, and re-activation must consume again.
func TestDrainedMailboxFencesAndReactivates(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 2, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{"a@p"}}); err != nil {
		t.Fatal(err)
	}
	h.takeCalls()
	f, err := s.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: "a@p", Reason: "expired"})
	if err != nil {
		t.Fatal(err)
	}
	if st := f.GetStatus(); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_FENCED || st.GetDrained() {
		t.Fatalf("fenced drained mailbox: %v", st)
	}
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 3, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"close a@p", "open a@p 3"}) {
		t.Fatalf("calls %v", c)
	}
	if st := stateOf(t, s, "a@p"); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || st.GetDrained() || !st.GetConsuming() {
		t.Fatalf("re-activated mailbox %v: want active and consuming", st)
	}
}

// A sidecar restarted alone after its shutdown drained the runner: its open
// ends the drain, and activating a mailbox the old one left drained (killed
// before it closed it) consumes it again under the new epoch.
func TestNewSidecarAfterDrain(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 4, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Drain(ctx, &runnerv1.DrainRequest{}); err != nil {
		t.Fatal(err)
	}
	h.takeCalls()

	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "b@p", Config: cfg}); err != nil {
		t.Fatalf("open after a drain: %v", err)
	}
	if err := s.Ready(); err == nil || err.Error() == "draining" {
		t.Fatalf("ready = %v; want the drain ended and b@p waiting for its epoch", err)
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg}); err != nil {
		t.Fatalf("re-open of the drained mailbox: %v", err)
	}
	if st := stateOf(t, s, "a@p"); !st.GetDrained() {
		t.Fatalf("an open without epoch changed the drained mailbox: %v", st)
	}
	for _, id := range []string{"a@p", "b@p"} {
		if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: id, Epoch: 5, ValidFor: vf}); err != nil {
			t.Fatalf("activate %s after a drain: %v", id, err)
		}
	}
	if c := h.takeCalls(); !slices.Equal(c, []string{"prepare b@p", "close a@p", "open a@p 5", "open b@p 5"}) {
		t.Fatalf("calls %v: the drained mailbox closes and reopens, the new one opens", c)
	}
	for _, id := range []string{"a@p", "b@p"} {
		if st := stateOf(t, s, id); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || st.GetDrained() || !st.GetConsuming() || st.GetEpoch() != 5 || st.GetFenceReason() != "" {
			t.Fatalf("%s after re-activation: %v; want active, consuming, epoch 5", id, st)
		}
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("ready after the new sidecar took both: %v", err)
	}
}

// Activating a drained mailbox whose store fails to reopen leaves it fenced
// (no longer served), so the sidecar's retry reopens it.
func TestDrainedReactivateFailsFenced(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p", Config: cfg, Epoch: 1, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Drain(ctx, &runnerv1.DrainRequest{}); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.failOn = "a@p"
	h.mu.Unlock()
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 2, ValidFor: vf}); status.Code(err) != codes.Internal {
		t.Fatalf("activate with a failing store: %v, want Internal", err)
	}
	if st := stateOf(t, s, "a@p"); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_FENCED || st.GetDrained() {
		t.Fatalf("after a failed reopen: %v; want fenced", st)
	}
	h.mu.Lock()
	h.failOn = ""
	h.mu.Unlock()
	if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p", Epoch: 2, ValidFor: vf}); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(t, s, "a@p"); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || !st.GetConsuming() {
		t.Fatalf("retry: %v; want active and consuming", st)
	}
}

// ExtendMailboxes extends each listed mailbox as ExtendMailbox would, with
// one result per mailbox in request order: one that cannot be extended
// fails alone with ExtendMailbox's code, and the others' deadlines move.
func TestExtendMailboxesAnswersEachMailbox(t *testing.T) {
	t.Parallel()
	s, _, _, clk := newServerClock(t)
	ctx := context.Background()
	for _, id := range []string{"a@p", "b@p"} {
		if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: 7, ValidFor: durationpb.New(3 * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "c@p", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	ext := func(id string, epoch uint64) *runnerv1.ExtendMailboxRequest {
		return &runnerv1.ExtendMailboxRequest{MailboxId: id, Epoch: epoch, ValidFor: durationpb.New(3 * time.Second)}
	}
	resp, err := s.ExtendMailboxes(ctx, &runnerv1.ExtendMailboxesRequest{Mailboxes: []*runnerv1.ExtendMailboxRequest{
		ext("a@p", 7), ext("b@p", 6), ext("c@p", 1), ext("gone@p", 1), ext("b@p", 7),
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id   string
		code codes.Code
	}{
		{"a@p", codes.OK}, {"b@p", codes.FailedPrecondition}, {"c@p", codes.FailedPrecondition}, {"gone@p", codes.NotFound}, {"b@p", codes.OK},
	}
	if len(resp.GetResults()) != len(want) {
		t.Fatalf("%d results for %d mailboxes", len(resp.GetResults()), len(want))
	}
	for i, w := range want {
		r := resp.GetResults()[i]
		if r.GetMailboxId() != w.id || codes.Code(r.GetCode()) != w.code || (w.code == codes.OK) != (r.GetStatus() != nil) || (w.code != codes.OK) == (r.GetMessage() == "") {
			t.Errorf("result %d: %v, want %s %v", i, r, w.id, w.code)
		}
	}
	// Both extended from t+2s to t+5s: neither fences at the first deadline.
	clk.Step(2 * time.Second)
	for _, id := range []string{"a@p", "b@p"} {
		if st := stateOf(t, s, id); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE {
			t.Fatalf("%s fenced at the superseded deadline: %v", id, st)
		}
	}
	many := make([]*runnerv1.ExtendMailboxRequest, maxExtendBatch+1)
	for i := range many {
		many[i] = ext("a@p", 7)
	}
	if _, err := s.ExtendMailboxes(ctx, &runnerv1.ExtendMailboxesRequest{Mailboxes: many}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d mailboxes in one call: %v", len(many), err)
	}
}
