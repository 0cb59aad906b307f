package ingest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

// TestGovernorHoldsBackWhileQueriesAreSlow feeds the governor latencies and
// moves its clock: ingest is held back from an answer over the target until
// Linger has passed without another, and the gauge says so.
func TestGovernorHoldsBackWhileQueriesAreSlow(t *testing.T) {
	t.Parallel()
	type step struct {
		observe time.Duration // 0: none
		advance time.Duration
		held    bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"fast answers never hold", []step{{observe: 3 * time.Millisecond}, {observe: 10 * time.Millisecond}}},
		{"a slow answer holds", []step{{observe: 11 * time.Millisecond, held: true}}},
		{"the hold lingers", []step{{observe: 50 * time.Millisecond, held: true}, {advance: 999 * time.Millisecond, held: true}, {advance: time.Millisecond}}},
		{"fast answers do not end it early", []step{{observe: 50 * time.Millisecond, held: true}, {observe: time.Millisecond, advance: 500 * time.Millisecond, held: true}}},
		{"another slow answer extends it", []step{{observe: 50 * time.Millisecond, held: true}, {advance: 900 * time.Millisecond, held: true},
			{observe: 20 * time.Millisecond, advance: 900 * time.Millisecond, held: true}, {advance: 100 * time.Millisecond}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			reg := prometheus.NewRegistry()
			g := NewGovernor(GovernorConfig{Target: 10 * time.Millisecond, Linger: time.Second, Clock: clk}, reg)
			for k, s := range tc.steps {
				if s.observe > 0 {
					g.Observe(s.observe)
				}
				clk.Step(s.advance)
				if g.Held() != s.held {
					t.Fatalf("step %d: held %v, want %v", k, g.Held(), s.held)
				}
				want := 0.0
				if s.held {
					want = 1
				}
				if got := gauge(t, reg, "prism_mailbox_ingest_held_back"); got != want {
					t.Fatalf("step %d: prism_mailbox_ingest_held_back %v, want %v", k, got, want)
				}
			}
		})
	}
	var none *Governor
	none.Observe(time.Hour)
	if none.Held() || none.hold(context.Background()) {
		t.Fatal("a nil governor holds ingest back")
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// heldIngester is an ingester of one claim whose store writes the governor g decides on.
func heldIngester(t *testing.T, g *Governor, batch int) (*Ingester, *store.Store) {
	t.Helper()
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := Config{MailboxID: "unit@p", Brokers: []string{"x"}, Topics: []string{"t"}, BatchSize: batch, BatchWait: time.Hour, Governor: g}
	cfg.setDefaults()
	i := &Ingester{cfg: cfg, w: st, log: cfg.Logger}
	i.runCtx, i.drainCtx = context.Background(), context.Background()
	return i, st
}

func envelopes(n int) *fakeClaim {
	claim := &fakeClaim{ch: make(chan *sarama.ConsumerMessage, n)}
	for k := range n {
		b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprint(k), Topic: "t", PublishedAt: timestamppb.Now()}})
		claim.ch <- &sarama.ConsumerMessage{Topic: "t", Offset: int64(k), Value: b}
	}
	return claim
}

// TestHeldWriteWaitsUncommittedUntilMaxHold: a batch fetched while queries
// are slow is neither written nor marked while it waits, and is written and
// marked once MaxHold passes although queries are slow still (the floor).
func TestHeldWriteWaitsUncommittedUntilMaxHold(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	reg := prometheus.NewRegistry()
	g := NewGovernor(GovernorConfig{Target: 10 * time.Millisecond, Linger: time.Hour, MaxHold: time.Second, Clock: clk}, reg)
	g.Observe(time.Second)
	i, st := heldIngester(t, g, 5)
	claim := envelopes(5)
	close(claim.ch)
	sess := &fakeSession{}
	h := &handler{i: i}
	if err := h.Setup(sess); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.ConsumeClaim(sess, claim) }()
	waitFor(t, "the write to be held", clk.HasWaiters)
	if s, _ := st.Stats(context.Background()); s.TotalEvents != 0 || sess.markedOffset() != 0 {
		t.Fatalf("while held: stored %d, marked %d; want nothing", s.TotalEvents, sess.markedOffset())
	}
	clk.Step(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s, _ := st.Stats(context.Background()); s.TotalEvents != 5 || sess.markedOffset() != 5 {
		t.Fatalf("after MaxHold: stored %d, marked %d; want 5, 5", s.TotalEvents, sess.markedOffset())
	}
	if n := testutil.ToFloat64(g.holds); n != 1 {
		t.Fatalf("%v held writes counted, want 1", n)
	}
	if err := h.Cleanup(sess); err != nil {
		t.Fatal(err)
	}
}

// TestIngestFinishesUnderConstantQueryPressure: with every answer over the
// target, ingest still stores and marks every record, one batch per MaxHold.
func TestIngestFinishesUnderConstantQueryPressure(t *testing.T) {
	t.Parallel()
	g := NewGovernor(GovernorConfig{Target: time.Millisecond, Linger: time.Hour, MaxHold: time.Millisecond}, prometheus.NewRegistry())
	g.Observe(time.Second)
	const records, batch = 1000, 100
	i, st := heldIngester(t, g, batch)
	claim := envelopes(records)
	close(claim.ch)
	sess := &fakeSession{}
	h := &handler{i: i}
	if err := h.Setup(sess); err != nil {
		t.Fatal(err)
	}
	if err := h.ConsumeClaim(sess, claim); err != nil {
		t.Fatal(err)
	}
	if err := h.Cleanup(sess); err != nil {
		t.Fatal(err)
	}
	if !g.Held() {
		t.Fatal("the governor let go: the test did not hold ingest back")
	}
	if s, _ := st.Stats(context.Background()); s.TotalEvents != records || sess.markedOffset() != records {
		t.Fatalf("stored %d, marked %d; want %d, %d", s.TotalEvents, sess.markedOffset(), records, records)
	}
	if n := testutil.ToFloat64(g.holds); n != records/batch {
		t.Fatalf("%v held writes, want one per batch (%d)", n, records/batch)
	}
}

// TestLanesWhileQueriesAreAnswered: any answer, fast or slow, makes ingest's
// decodes and writes take turns on Lanes cores until Linger has passed
// without one; a turn waits for one to end, and a closing ingester's does
// not wait at all.
func TestLanesWhileQueriesAreAnswered(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	reg := prometheus.NewRegistry()
	g := NewGovernor(GovernorConfig{Target: 10 * time.Millisecond, Linger: time.Second, Lanes: 1, Clock: clk}, reg)
	ctx := context.Background()
	if end, took := g.lane(ctx); took {
		end()
		t.Fatal("a turn was taken before any answer")
	}
	g.Observe(time.Millisecond)
	if g.Held() {
		t.Fatal("a fast answer held ingest back")
	}
	end, took := g.lane(ctx)
	if !took {
		t.Fatal("no turn taken while queries are answered")
	}
	second := make(chan bool)
	go func() {
		end2, took2 := g.lane(ctx)
		end2()
		second <- took2
	}()
	select {
	case <-second:
		t.Fatal("a second turn on one lane did not wait for the first to end")
	case <-time.After(50 * time.Millisecond):
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if end3, took3 := g.lane(cancelled); took3 {
		end3()
		t.Fatal("a closing ingester's turn waited for a lane")
	}
	end()
	if !<-second {
		t.Fatal("the second turn was not taken once the first ended")
	}
	clk.Step(time.Second)
	if end, took := g.lane(ctx); took {
		end()
		t.Fatal("turns still taken a Linger after the last answer")
	}
}
