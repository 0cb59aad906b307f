package runner

import (
	"context"
	"errors"
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

	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// storedIDs is every message id mailbox id of r answers, sorted.
func storedIDs(t *testing.T, r *Runner, id string) []string {
	t.Helper()
	ids := allIDs(t, r, id)
	slices.Sort(ids)
	return ids
}

// TestRebuildAnswersWhatKafkaHolds: a mailbox dropped from the runner's
// store by Rebuild re-ingests, on its next open, exactly the records Kafka
// still retains (not the ones deleted below the log start, nothing twice),
// while the other mailbox of the store keeps its data and offsets; a store
// still open in a runner is refused and left whole, offsets included.
// Without the reset of the consumer group the dropped mailbox would come
// back empty.
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
	if got := c.Committed(t, "a@p", "a.events"); got != 3*perPartition {
		t.Fatalf("refused rebuild reset a@p's offsets: %d committed, want %d", got, 3*perPartition)
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
	if ids, err := StoredIDs(dataDir); err != nil || !slices.Equal(ids, []string{"b@p"}) {
		t.Fatalf("StoredIDs after the rebuild = %v, %v; want [b@p]", ids, err)
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

// TestRebuildOldLayoutWhileServing: a mailbox whose store an older version
// left (a Badger of its own under OldDir, its offsets committed) is refused
// by the runner, old_layout, never opened empty in the runner's store,
// whose mailboxes go on serving; Rebuild drops that directory and the
// group while the runner runs, and the runner's next open of the mailbox
// re-ingests it from Kafka.
func TestRebuildOldLayoutWhileServing(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(2, "o.events", "k.events"))
	c.ProduceEnvelopes(t, "o.events", kafkatest.Envelopes("o.events", 12)...)
	c.ProduceEnvelopes(t, "k.events", kafkatest.Envelopes("k.events", 5)...)
	dataDir := t.TempDir()
	cfg := Config{DataDir: dataDir, Brokers: c.Brokers, BatchWait: 10 * time.Millisecond}
	stored := func(r *Runner, id string, n int64) func() bool {
		return func() bool { s, err := r.Stats(context.Background(), id); return err == nil && s.TotalEvents == n }
	}

	// The previous version: o@p's own Badger at OldDir, fed and committed.
	prev, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prev.openView = func(_ *store.DB, o store.Options) (*store.Store, error) {
		o.Dir = OldDir(dataDir, o.ID)
		return store.Open(o)
	}
	if err := prev.Open(MailboxConfig{ID: "o@p", Topics: []string{"o.events"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "o@p filled and committed", func() bool { return stored(prev, "o@p", 12)() && c.Committed(t, "o@p", "o.events") == 12 })
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}

	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Open(MailboxConfig{ID: "k@p", Topics: []string{"k.events"}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Open(MailboxConfig{ID: "o@p", Topics: []string{"o.events"}}); !errors.Is(err, store.ErrOldLayout) {
		t.Fatalf("open o@p beside its older store: %v, want ErrOldLayout", err)
	}
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := db.IDs(); err != nil || slices.Contains(ids, "o@p") {
		t.Fatalf("the runner's store holds %v (err %v): o@p opened empty beside its older store", ids, err)
	}
	if ids, err := OldLayoutIDs(dataDir); err != nil || !slices.Equal(ids, []string{"o@p"}) {
		t.Fatalf("OldLayoutIDs = %v, %v; want [o@p]", ids, err)
	}
	if done, err := Rebuild(RebuildConfig{DataDir: dataDir, Brokers: c.Brokers}, []string{"o@p"}); err != nil || !slices.Equal(done, []string{"o@p"}) {
		t.Fatalf("rebuild of the older store while the runner serves: %v (done %v)", err, done)
	}
	if _, err := os.Stat(OldDir(dataDir, "o@p")); !os.IsNotExist(err) {
		t.Fatalf("the older store of o@p is still there after the rebuild: %v", err)
	}
	if err := r.Open(MailboxConfig{ID: "o@p", Topics: []string{"o.events"}}); err != nil {
		t.Fatalf("open o@p after its rebuild: %v", err)
	}
	waitFor(t, "o@p re-ingested from Kafka", stored(r, "o@p", 12))
	if _, failed := r.OpenFailures()["o@p"]; failed {
		t.Error("o@p still listed failed after it opened")
	}
	if s, _ := r.Stats(context.Background(), "k@p"); s.TotalEvents != 5 {
		t.Fatalf("k@p holds %d events after o@p's rebuild, want 5", s.TotalEvents)
	}
}
