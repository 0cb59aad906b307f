package runner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// metricSum is the sum of every series of the metric name labelled mailbox
// in r's registry (counters and gauges), 0 when there is none.
func metricSum(t *testing.T, r *Runner, name, mailbox string) float64 {
	t.Helper()
	mfs, err := r.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "mailbox" && l.GetValue() == mailbox {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

// TestLargeIngestUnderSmallMemoryBudget: a runner under a small memory
// budget (its store sized from it, the Go heap limited to it as prism runner
// limits it) drains a backlog of ~1 KiB envelopes several times its
// memtables and about the budget's size without error: every event is
// stored and found by paged and indexed queries, every offset is committed,
// nothing is dead-lettered or retried. Not parallel: it sets the process's
// memory limit.
func TestLargeIngestUnderSmallMemoryBudget(t *testing.T) {
	const (
		budget     = 64 << 20
		events     = 30_000
		payload    = 900
		topic      = "big.events"
		id         = "big@p"
		correlated = 100 // events share a correlation id with every 100th other
	)
	c := kafkatest.Start(t, kafkatest.Topics(3, topic, topic+".dlq"))
	rng := rand.New(rand.NewPCG(18, 64))
	published := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := make([]*kgo.Record, events)
	for i := range recs {
		blob := make([]byte, payload)
		for j := range blob {
			blob[j] = byte(rng.Uint32())
		}
		recs[i] = kafkatest.Record(t, topic, fmt.Sprint("k", i%64), &envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata: &envelopev1.PrismMetadata{MessageId: fmt.Sprintf("m-%06d", i), Topic: topic,
				PublishedAt: timestamppb.New(published.Add(time.Duration(i) * time.Millisecond)), CorrelationId: fmt.Sprint("c-", i%correlated)},
			Payload: &anypb.Any{TypeUrl: "type.googleapis.com/test.Blob", Value: blob},
		})
	}
	c.Produce(t, recs...)

	// The broker's copy of the backlog shares this process's heap; a runner
	// has only its own under the budget.
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(budget + 2*events*(payload+100)))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, MemoryBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	opens := recordStoreOpens(r)
	if err := r.Open(MailboxConfig{ID: id, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	if got, want := opens(), store.MemoryFor(budget, 1); len(got) != 1 || got[0].Memory != want {
		t.Fatalf("store opened %+v, want once sized %+v from the budget", got, want)
	}
	waitFor(t, "every event stored", func() bool {
		st, err := r.Stats(context.Background(), id)
		return err == nil && st.GetTotalEvents() == events
	})
	waitFor(t, "every offset committed", func() bool { return c.Committed(t, id, topic) == events })

	src, _, _ := r.Mailbox(id)
	seen := make(map[string]bool, events)
	for token := ""; ; {
		page, err := src.Query(context.Background(), &mailboxv1.EventFilter{Limit: mesh.MaxQueryLimit, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page.GetItems() {
			seen[it.GetMessageId()] = true
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	for i := range events {
		if !seen[fmt.Sprintf("m-%06d", i)] {
			t.Fatalf("m-%06d not found by paging every event (%d found)", i, len(seen))
		}
	}
	if len(seen) != events {
		t.Fatalf("paging found %d events, want %d", len(seen), events)
	}
	page, err := src.Query(context.Background(), &mailboxv1.EventFilter{CorrelationId: "c-7", Limit: mesh.MaxQueryLimit})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(page.GetItems()); n != events/correlated {
		t.Fatalf("correlation id c-7: %d events, want %d", n, events/correlated)
	}
	for _, it := range page.GetItems() {
		if it.GetCorrelationId() != "c-7" {
			t.Fatalf("correlation id c-7 answered %s of %s", it.GetMessageId(), it.GetCorrelationId())
		}
	}
	for _, name := range []string{"prism_mailbox_events_dead_lettered_total", "prism_mailbox_ingest_retries_total", "prism_mailbox_ingest_stalls_total", "prism_mailbox_duplicates_dropped_total"} {
		if got := metricSum(t, r, name, id); got != 0 {
			t.Errorf("%s{mailbox=%q} = %v, want 0", name, id, got)
		}
	}
	if got := metricSum(t, r, "prism_mailbox_events_stored_total", id); got != events {
		t.Errorf("prism_mailbox_events_stored_total = %v, want %d", got, events)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("close after the ingest: %v", err)
	}
}
