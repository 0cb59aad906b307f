package ingest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// TestStartPositionsWinOverANewGroup: a mailbox seeded by a copy consumes from the copied positions, not from the
// oldest offset a new group starts at (the records before them are in the copy), and commits from there; a group
// that has committed past Start keeps its own offset.
func TestStartPositionsWinOverANewGroup(t *testing.T) {
	t.Parallel()
	const topic = "t"
	brokers := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+DLQSuffix)).Brokers
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
				MessageId: fmt.Sprintf("m-%03d", i), Topic: topic, PublishedAt: timestamppb.Now()}})
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: b}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(0, 50)
	const group = "seeded@p"
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	run := func(start, end int64) {
		ing, err := Start(Config{MailboxID: group, Brokers: brokers, Topics: []string{topic}, BatchWait: 10 * time.Millisecond,
			Start: []Position{{Topic: topic, Partition: 0, Next: start}}, Metrics: NewMetrics(prometheus.NewRegistry())}, st)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "caught up", func() bool { ps, ok := ing.Positions(); return ok && ps[0].Next == end })
		if err := ing.Close(); err != nil {
			t.Fatal(err)
		}
	}
	run(30, 50)
	if s, _ := st.Stats(context.Background()); s.GetTotalEvents() != 20 {
		t.Fatalf("stored %d events from Start 30 of 50, want 20", s.GetTotalEvents())
	}
	if off := committed(t, brokers, group, topic); off != 50 {
		t.Fatalf("committed %d, want 50", off)
	}
	// Restarted with a Start behind what it committed: the group's offset wins, nothing is read again.
	produce(50, 60)
	run(10, 60)
	if s, _ := st.Stats(context.Background()); s.GetTotalEvents() != 30 {
		t.Fatalf("stored %d events after the restart, want 30", s.GetTotalEvents())
	}
}
