package runner

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/internal/kafkatest"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// storedIDs pages through every item of mailbox id on r.
func storedIDs(t *testing.T, r *Runner, id string) []string {
	t.Helper()
	src, _, ok := r.Mailbox(id)
	if !ok {
		t.Fatalf("%s not open", id)
	}
	var ids []string
	f := &mailboxv1.EventFilter{Limit: 100}
	for {
		resp, err := src.Query(context.Background(), f)
		if err != nil {
			t.Fatalf("query %s: %v", id, err)
		}
		for _, it := range resp.Items {
			ids = append(ids, it.GetMessageId())
		}
		if resp.NextPageToken == "" {
			break
		}
		f.PageToken = resp.NextPageToken
	}
	slices.Sort(ids)
	return ids
}

// TestRebuildAnswersWhatKafkaHolds: a mailbox whose store is dropped by
// Rebuild re-ingests, on its next open, exactly the records Kafka still
// retains (not the ones deleted below the log start, nothing twice), while
// the other mailbox of the data dir keeps its store and offsets; a store
// still open in a runner is refused and left whole. Without the reset of the
// consumer group the dropped mailbox would come back empty.
func TestRebuildAnswersWhatKafkaHolds(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(3, "a.events", "b.events"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const perPartition, deleted = 20, 5
	var recs []*kgo.Record
	var retained []string
	for p := range int32(3) {
		for k := range perPartition {
			id := fmt.Sprintf("a-%d-%02d", p, k)
			r := kafkatest.Record(t, "a.events", id, &envelopev1.PrismEnvelope{EnvelopeVersion: 1,
				Metadata: &envelopev1.PrismMetadata{MessageId: id, Topic: "a.events", PublishedAt: timestamppb.Now()}})
			r.Partition = p
			recs = append(recs, r)
			if p != 0 || k >= deleted {
				retained = append(retained, id)
			}
		}
	}
	slices.Sort(retained)
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	c.ProduceEnvelopes(t, "b.events", kafkatest.Envelopes("b.events", 10)...)

	dataDir := t.TempDir()
	cfg := Config{DataDir: dataDir, Brokers: c.Brokers, BatchWait: 10 * time.Millisecond}
	open := func() *Runner {
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a@p", "b@p"} {
			if err := r.Open(MailboxConfig{ID: id, Topics: []string{id[:1] + ".events"}}); err != nil {
				t.Fatal(err)
			}
		}
		return r
	}
	stored := func(r *Runner, id string, n int64) func() bool {
		return func() bool { s, err := r.Stats(context.Background(), id); return err == nil && s.TotalEvents == n }
	}
	r := open()
	waitFor(t, "both mailboxes filled", func() bool { return stored(r, "a@p", 3*perPartition)() && stored(r, "b@p", 10)() })
	waitFor(t, "offsets committed", func() bool { return c.Committed(t, "a@p", "a.events") == 3*perPartition })

	rb := RebuildConfig{DataDir: dataDir, Brokers: c.Brokers}
	if done, err := Rebuild(rb, []string{"a@p"}); err == nil || len(done) != 0 || !strings.Contains(err.Error(), "running runner") {
		t.Fatalf("rebuild of an open mailbox: %v (done %v), want refused as open in a running runner", err, done)
	}
	if _, err := os.Stat(Dir(dataDir, "a@p")); err != nil {
		t.Fatalf("refused rebuild touched the store: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// Kafka's retention moves partition 0's log start past its first records.
	del := kmsg.NewPtrDeleteRecordsRequest()
	del.TimeoutMillis = 10_000
	dt := kmsg.NewDeleteRecordsRequestTopic()
	dt.Topic = "a.events"
	dp := kmsg.NewDeleteRecordsRequestTopicPartition()
	dp.Partition, dp.Offset = 0, deleted
	dt.Partitions = append(dt.Partitions, dp)
	del.Topics = append(del.Topics, dt)
	resp, err := del.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode); err != nil {
		t.Fatalf("delete records: %v", err)
	}

	if ids, err := StoredIDs(dataDir); err != nil || !slices.Equal(ids, []string{"a@p", "b@p"}) {
		t.Fatalf("StoredIDs = %v, %v; want [a@p b@p]", ids, err)
	}
	if done, err := Rebuild(rb, []string{"a@p"}); err != nil || !slices.Equal(done, []string{"a@p"}) {
		t.Fatalf("rebuild: %v (done %v)", err, done)
	}
	if _, err := os.Stat(Dir(dataDir, "a@p")); !os.IsNotExist(err) {
		t.Fatalf("store of a@p still there after the rebuild: %v", err)
	}

	r = open()
	t.Cleanup(func() { r.Close() })
	waitFor(t, "a@p re-ingested", stored(r, "a@p", int64(len(retained))))
	waitFor(t, "a@p's offsets committed again", func() bool { return c.Committed(t, "a@p", "a.events") == 3*perPartition })
	if got := storedIDs(t, r, "a@p"); !slices.Equal(got, retained) {
		t.Fatalf("rebuilt a@p holds %d ids %v, want what Kafka retains, %d ids %v", len(got), got, len(retained), retained)
	}
	if s, _ := r.Stats(context.Background(), "a@p"); s.TotalEvents != int64(len(retained)) {
		t.Fatalf("rebuilt a@p counts %d events, want %d", s.TotalEvents, len(retained))
	}
	// b@p kept its store and resumed from its offsets: nothing redelivered.
	if s, _ := r.Stats(context.Background(), "b@p"); s.TotalEvents != 10 {
		t.Fatalf("b@p holds %d events after a@p's rebuild, want 10", s.TotalEvents)
	}
	if d := gauge(t, r, "prism_mailbox_duplicates_dropped_total", "b@p"); d > 0 {
		t.Fatalf("b@p dropped %v duplicates: its offsets were reset too", d)
	}
}
