package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// TestMailboxEndToEnd produces valid envelopes (with duplicates and
// redeliveries) and malformed ones to a kfake broker, runs a runner against it
// over TCP and checks that every valid envelope is queryable exactly once over
// the real HTTP and gRPC servers, and every malformed one sits in its topic's
// DLQ with the right reason header.
func TestMailboxEndToEnd(t *testing.T) {
	t.Parallel()
	const mb = "$audit@proxy-01"
	topics := []string{"audit.events", "admin.events"}
	kafka := kafkatest.Start(t, kafkatest.Topics(3, "audit.events"), kafkatest.Topics(2, "admin.events"))
	brokers := kafka.Brokers

	base := time.Now().Add(-time.Hour)
	want := map[string]bool{}
	var recs []*kgo.Record
	const valid = 400
	for i := range valid {
		topic := []string{"audit.events", "admin.events"}[i%2]
		id := fmt.Sprintf("evt-%05d", i)
		want[id] = true
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(id), Value: validEnvelope(id, topic, base.Add(time.Duration(i)*time.Millisecond))})
		if i%10 == 0 { // the same event published again, on another topic/partition
			other := []string{"audit.events", "admin.events"}[(i+1)%2]
			recs = append(recs, &kgo.Record{Topic: other, Key: []byte("dup-" + id), Value: validEnvelope(id, topic, base.Add(time.Duration(i)*time.Millisecond))})
		}
	}
	mustMarshal := func(e *envelopev1.PrismEnvelope) []byte {
		b, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bad := map[string]envelope.Reason{} // DLQ key -> reason
	badPerTopic := map[string]int{}
	addBad := func(topic, key string, value []byte, reason envelope.Reason) {
		bad[key] = reason
		badPerTopic[topic]++
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: value})
	}
	for i := range 3 {
		topic := []string{"audit.events", "admin.events"}[i%2]
		addBad(topic, fmt.Sprintf("garbage-%d", i), []byte{0xff, 0xff, 0xff, byte(i)}, envelope.ReasonUndecodable)
		addBad(topic, fmt.Sprintf("no-metadata-%d", i), mustMarshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1}), envelope.ReasonMissingMetadata)
		addBad(topic, fmt.Sprintf("no-id-%d", i), mustMarshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1,
			Metadata: &envelopev1.PrismMetadata{Topic: topic, PublishedAt: timestamppb.Now()}}), envelope.ReasonMissingMessageID)
		addBad(topic, fmt.Sprintf("v2-%d", i), mustMarshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 2,
			Metadata: &envelopev1.PrismMetadata{MessageId: fmt.Sprintf("v2-%d", i), Topic: topic, PublishedAt: timestamppb.Now()}}), envelope.ReasonBadVersion)
	}
	// Half before the runner starts, half while it runs.
	half := len(recs) / 2
	kafka.Produce(t, recs[:half]...)

	r, err := runner.New(runner.Config{DataDir: t.TempDir(), Brokers: brokers, BatchSize: 64, BatchWait: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Open(runner.MailboxConfig{ID: mb, Topics: []string{"audit.events", "admin.events"}, Mode: envelope.Strict}); err != nil {
		t.Fatal(err)
	}
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	r.Serve(gl, hl)
	httpBase := "http://" + hl.Addr().String()
	kafka.Produce(t, recs[half:]...)

	// Consumed counts a record when its batch is fetched; only stored,
	// dropped as a duplicate or dead-lettered says it has been handled.
	testwait.For(t, 60*time.Second, "all records handled", func() (bool, string) {
		var handled float64
		for _, name := range []string{"prism_mailbox_events_stored_total", "prism_mailbox_duplicates_dropped_total", "prism_mailbox_events_dead_lettered_total"} {
			n, err := metric(httpBase, name, "mailbox="+mb)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", name, err)
			}
			handled += n
		}
		return handled == float64(len(recs)), fmt.Sprintf("handled %v of %d", handled, len(recs))
	})
	testwait.For(t, 30*time.Second, "ready", func() (bool, string) {
		err := r.Ready()
		return err == nil, fmt.Sprint(err)
	})

	exactlyOnce(t, httpIDs(t, httpBase, mb), want)

	cc, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	qc := mailboxv1.NewMailboxQueryClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, mb)
	var grpcIDs []string
	f := &mailboxv1.EventFilter{Limit: 77}
	for range 100 {
		resp, err := qc.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range resp.Items {
			grpcIDs = append(grpcIDs, it.MessageId)
		}
		if resp.NextPageToken == "" {
			break
		}
		f.PageToken = resp.NextPageToken
	}
	exactlyOnce(t, grpcIDs, want)
	got, err := qc.GetEvent(ctx, &mailboxv1.GetEventRequest{MessageId: "evt-00042"})
	if err != nil || got.Item.Principal != "user-2" || got.Item.Topic != "audit.events" {
		t.Fatalf("GetEvent = %v, %v", got, err)
	}

	var dlq []*kgo.Record
	for _, topic := range topics {
		dlq = append(dlq, kafka.ReadAll(t, topic+ingest.DLQSuffix, badPerTopic[topic])...)
	}
	if len(dlq) != len(bad) {
		t.Fatalf("%d DLQ records, want %d", len(dlq), len(bad))
	}
	for _, rec := range dlq {
		key := string(rec.Key)
		if got := kafkatest.Header(rec, ingest.HeaderReason); got != string(bad[key]) {
			t.Errorf("DLQ record %s: reason %q, want %q", key, got, bad[key])
		}
		if src := kafkatest.Header(rec, ingest.HeaderSourceTopic); src+ingest.DLQSuffix != rec.Topic || kafkatest.Header(rec, ingest.HeaderSourceOffset) == "" {
			t.Errorf("DLQ record %s: source headers topic=%q offset=%q", key, src, kafkatest.Header(rec, ingest.HeaderSourceOffset))
		}
		delete(bad, key)
	}
	if len(bad) > 0 {
		t.Errorf("not dead-lettered: %v", bad)
	}
	dups, _ := metric(httpBase, "prism_mailbox_duplicates_dropped_total", "mailbox="+mb)
	if dups != valid/10 {
		t.Errorf("duplicates metric = %v, want %d", dups, valid/10)
	}
	dead, _ := metric(httpBase, "prism_mailbox_events_dead_lettered_total", "mailbox="+mb, "reason="+string(envelope.ReasonBadVersion))
	if dead != 3 {
		t.Errorf("dead-lettered %s = %v, want 3", envelope.ReasonBadVersion, dead)
	}
	stored, err1 := metric(httpBase, "prism_mailbox_events_stored_total", "mailbox="+mb)
	writes, err2 := metric(httpBase, "prism_mailbox_batch_write_seconds_count", "mailbox="+mb)
	queries, err3 := metric(httpBase, "prism_mailbox_query_seconds_count", "api=http", "method=QueryEvents")
	grpcQueries, err4 := metric(httpBase, "prism_mailbox_queries_total", "mailbox="+mb, "api=grpc", "method=QueryEvents", "code=OK")
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		t.Error(err)
	}
	if stored != valid || writes == 0 || queries == 0 || grpcQueries == 0 {
		t.Errorf("metrics: stored %v (want %d), batch writes %v, http queries %v, grpc queries %v", stored, valid, writes, queries, grpcQueries)
	}
	// Every partition was consumed to its end, so the lag reads 0 on each.
	testwait.For(t, 10*time.Second, "zero lag", func() (bool, string) {
		lag, err := metric(httpBase, "prism_mailbox_consumer_lag", "mailbox="+mb)
		return err == nil && lag == 0, fmt.Sprintf("lag %v (%v)", lag, err)
	})
}
