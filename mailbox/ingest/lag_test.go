package ingest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// gatedWriter holds every write until open closes.
type gatedWriter struct {
	st   *store.Store
	open chan struct{}
}

func (g *gatedWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	select {
	case <-g.open:
		return g.st.Write(ctx, items)
	case <-ctx.Done():
		return store.WriteResult{}, ctx.Err()
	}
}

// TestLag: Lag sums the records behind over every partition of the topics,
// an empty topic counting as known and 0 behind, falls to 0 once the backlog
// is stored, and is unknown again after Close.
func TestLag(t *testing.T) {
	t.Parallel()
	const full, empty, group = "full", "empty", "lag@proxy-01"
	kc := kafkatest.Start(t, kafkatest.Topics(2, full, empty, full+DLQSuffix, empty+DLQSuffix))
	const n = 40
	envs := make([]*envelopev1.PrismEnvelope, n)
	for i := range envs {
		envs[i] = &envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprintf("m-%03d", i), Topic: full, PublishedAt: timestamppb.Now()}}
	}
	kc.ProduceEnvelopes(t, full, envs...)
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	w := &gatedWriter{st: st, open: make(chan struct{})}
	ing, err := Start(Config{MailboxID: group, Brokers: kc.Brokers, Topics: []string{full, empty}, BatchSize: 10,
		BatchWait: 10 * time.Millisecond, DrainTimeout: 300 * time.Millisecond, LagInterval: 10 * time.Millisecond,
		Metrics: NewMetrics(prometheus.NewRegistry())}, w)
	if err != nil {
		t.Fatal(err)
	}
	lagIs := func(want int64) func() bool {
		return func() bool { lag, known := ing.Lag(); return known && lag == want }
	}
	waitFor(t, fmt.Sprintf("lag %d while nothing is stored", n), lagIs(n))
	checkPositions(t, ing, 0)
	close(w.open)
	waitFor(t, "lag 0 once the backlog is stored", lagIs(0))
	checkPositions(t, ing, n)
	if err := ing.Close(); err != nil {
		t.Fatal(err)
	}
	if lag, known := ing.Lag(); known {
		t.Fatalf("Lag() after Close = %d, known; want unknown", lag)
	}
	if ps, known := ing.Positions(); known {
		t.Fatalf("Positions() after Close = %v, known; want unknown", ps)
	}
}

// checkPositions: both partitions of both topics, sorted, the empty topic's
// at its start and the full one's summing to the records stored.
func checkPositions(t *testing.T, ing *Ingester, stored int64) {
	t.Helper()
	ps, known := ing.Positions()
	want := []struct {
		topic     string
		partition int32
	}{{"empty", 0}, {"empty", 1}, {"full", 0}, {"full", 1}}
	if !known || len(ps) != len(want) {
		t.Fatalf("Positions() = %v, %v; want %d known", ps, known, len(want))
	}
	var sum int64
	for i, p := range ps {
		if p.Topic != want[i].topic || p.Partition != want[i].partition {
			t.Fatalf("Positions() = %v; want sorted by topic then partition", ps)
		}
		if p.Topic == "empty" && p.Next != 0 {
			t.Fatalf("Positions() = %v; want the empty topic at 0", ps)
		}
		if p.Topic == "full" {
			sum += p.Next
		}
	}
	if sum != stored {
		t.Fatalf("Positions() = %v; want the full topic's summing to %d", ps, stored)
	}
}
