package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// flakyWriter fails its first failures calls (all of them while failAll is
// set), then writes to an in-memory store.
type flakyWriter struct {
	st       *store.Store
	failures atomic.Int64
	failAll  atomic.Bool
	calls    atomic.Int64
}

func (f *flakyWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	f.calls.Add(1)
	if f.failAll.Load() || f.failures.Add(-1) >= 0 {
		return store.WriteResult{}, errors.New("disk on fire")
	}
	return f.st.Write(ctx, items)
}

func committed(t *testing.T, brokers []string, group, topic string) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		// The group has not joined yet, so it has committed nothing.
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetBlock(topic, 0).Offset
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStoreErrorsNeverCommit: while the store fails, ingest retries with
// backoff and commits nothing, and a stop at the drain deadline leaves the
// offsets where they were; the next run, with a store that recovers after a
// few more failures, stores everything and commits past it.
func TestStoreErrorsNeverCommit(t *testing.T) {
	t.Parallel()
	const topic, group = "t", "flaky@proxy-01"
	brokers := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+DLQSuffix)).Brokers
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const n = 100
	for i := range n {
		b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprintf("m-%03d", i), Topic: topic, PublishedAt: timestamppb.Now()}})
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	m := NewMetrics(prometheus.NewRegistry())
	cfg := Config{MailboxID: group, Brokers: brokers, Topics: []string{topic}, BatchSize: 30, BatchWait: 10 * time.Millisecond,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond, DrainTimeout: 300 * time.Millisecond,
		LagInterval: 10 * time.Millisecond, StallAfter: 3, Metrics: m}
	stalled := m.stalled.WithLabelValues(group, topic, "0", "store")

	w := &flakyWriter{st: st}
	w.failAll.Store(true)
	ing, err := Start(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "retries", func() bool { return testutil.ToFloat64(m.retries.WithLabelValues(group, "store")) >= 5 })
	// Nothing gets through, and the lag gauge says so while the write is stuck.
	waitFor(t, "lag of the stuck partition", func() bool {
		return testutil.ToFloat64(m.lag.WithLabelValues(group, topic, "0")) == n
	})
	// Past StallAfter failed attempts the partition is reported stalled, for an alert.
	if testutil.ToFloat64(stalled) != 1 || testutil.ToFloat64(m.stalls.WithLabelValues(group, "store")) < 1 {
		t.Fatalf("stalled %v, stalls %v after %v retries; want the partition reported stalled",
			testutil.ToFloat64(stalled), testutil.ToFloat64(m.stalls.WithLabelValues(group, "store")),
			testutil.ToFloat64(m.retries.WithLabelValues(group, "store")))
	}
	if err := ing.Close(); err != nil {
		t.Fatal(err)
	}
	if off := committed(t, brokers, group, topic); off >= 0 {
		t.Fatalf("offset %d committed although nothing was stored", off)
	}

	w = &flakyWriter{st: st}
	w.failures.Store(3)
	ing, err = Start(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all stored", func() bool {
		s, err := st.Stats(context.Background())
		return err == nil && s.TotalEvents == n
	})
	// The third failure stalled the partition again; the write that then succeeded cleared it.
	if now, n := testutil.ToFloat64(m.stalled.WithLabelValues(group, topic, "0", "store")),
		testutil.ToFloat64(m.stalls.WithLabelValues(group, "store")); now != 0 || n < 1 {
		t.Fatalf("stalled %v, stalls %v after the store recovered; want 0 and >= 1", now, n)
	}
	if err := ing.Close(); err != nil {
		t.Fatal(err)
	}
	if off := committed(t, brokers, group, topic); off != n {
		t.Fatalf("committed offset %d, want %d", off, n)
	}
	if w.calls.Load() < 4 {
		t.Fatalf("%d write calls; the 3 failures were not retried", w.calls.Load())
	}

}

// TestConsumeClaimFlushesOnClose checks the batching contract with a fake
// session: a partial batch is flushed when the claim closes, and the offset
// marked is the one after the last record, committed after the write.
func TestConsumeClaimFlushesOnClose(t *testing.T) {
	t.Parallel()
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := Config{MailboxID: "unit@p", Brokers: []string{"x"}, Topics: []string{"t"}, BatchSize: 1000, BatchWait: time.Hour}
	cfg.setDefaults()
	i := &Ingester{cfg: cfg, w: st, log: cfg.Logger}
	i.drainCtx = context.Background()
	claim := &fakeClaim{ch: make(chan *sarama.ConsumerMessage, 10)}
	for k := range 3 {
		b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprint(k), Topic: "t", PublishedAt: timestamppb.Now()}})
		claim.ch <- &sarama.ConsumerMessage{Topic: "t", Offset: int64(10 + k), Value: b}
	}
	close(claim.ch)
	sess := &fakeSession{}
	h := &handler{i: i}
	if err := h.Setup(sess); err != nil {
		t.Fatal(err)
	}
	if err := h.ConsumeClaim(sess, claim); err != nil {
		t.Fatal(err)
	}
	s, _ := st.Stats(context.Background())
	if s.TotalEvents != 3 || sess.markedOffset() != 13 {
		t.Fatalf("stored %d, marked %d; want 3, 13", s.TotalEvents, sess.markedOffset())
	}
	// The flush asked for a commit, which the session's committer makes without waiting for Cleanup.
	waitFor(t, "a commit", func() bool { return sess.commitCount() >= 1 })
	before := sess.commitCount()
	if err := h.Cleanup(sess); err != nil {
		t.Fatal(err)
	}
	if got := sess.commitCount(); got != before+1 {
		t.Fatalf("%d commits after Cleanup, want %d: Cleanup commits once more", got, before+1)
	}
}

type fakeClaim struct{ ch chan *sarama.ConsumerMessage }

func (c *fakeClaim) Topic() string                            { return "t" }
func (c *fakeClaim) Partition() int32                         { return 0 }
func (c *fakeClaim) InitialOffset() int64                     { return 0 }
func (c *fakeClaim) HighWaterMarkOffset() int64               { return 13 }
func (c *fakeClaim) Messages() <-chan *sarama.ConsumerMessage { return c.ch }

type fakeSession struct {
	sarama.ConsumerGroupSession
	mu      sync.Mutex
	marked  int64
	commits int
}

func (s *fakeSession) MarkMessage(m *sarama.ConsumerMessage, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marked = m.Offset + 1
}

func (s *fakeSession) GenerationID() int32        { return 1 }
func (s *fakeSession) Claims() map[string][]int32 { return map[string][]int32{"t": {0}} }

func (s *fakeSession) markedOffset() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.marked
}

func (s *fakeSession) commitCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits
}

func (s *fakeSession) Commit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits++
}

// TestDLQErrorsAreRetried fails the broker's first produce requests to the
// dead-letter topic: ingest retries until they are acknowledged, dead-letters
// each rejected record once, and only then commits.
func TestDLQErrorsAreRetried(t *testing.T) {
	t.Parallel()
	const topic, group = "p", "dlq@proxy-01"
	c := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+DLQSuffix))
	var failed atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		pr := req.(*kmsg.ProduceRequest)
		if len(pr.Topics) == 0 || pr.Topics[0].Topic != topic+DLQSuffix || failed.Load() >= 3 {
			return nil, nil, false
		}
		c.KeepControl()
		failed.Add(1)
		// InvalidRecord is not retried inside sarama.
		return produceError(pr, kerr.InvalidRecord.Code), nil, true
	})
	brokers := c.Brokers
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 10 {
		v := []byte{0xff, byte(i)}
		if i%2 == 0 {
			v, _ = proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
				MessageId: fmt.Sprint(i), Topic: topic, PublishedAt: timestamppb.Now()}})
		}
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i)), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := NewMetrics(prometheus.NewRegistry())
	ing, err := Start(Config{MailboxID: group, Brokers: brokers, Topics: []string{topic}, BatchWait: 10 * time.Millisecond,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond, Metrics: m}, st)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "committed past the batch", func() bool { return committed(t, brokers, group, topic) == 10 })
	// sarama may absorb a failure in its own retry; at least one must reach ingest.
	if r := testutil.ToFloat64(m.retries.WithLabelValues(group, "dlq")); r < 1 {
		t.Fatalf("dlq retries = %v, want >= 1", r)
	}
	if err := ing.Close(); err != nil {
		t.Fatal(err)
	}
	if n := failed.Load(); n != 3 {
		t.Fatalf("%d DLQ produce requests failed, want 3", n)
	}
	s, _ := st.Stats(context.Background())
	if s.TotalEvents != 5 {
		t.Fatalf("stored %d, want 5", s.TotalEvents)
	}
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic+DLQSuffix), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := map[string]int{}
	for len(keys) < 5 && ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) { keys[string(r.Key)]++ })
	}
	for _, k := range []string{"1", "3", "5", "7", "9"} {
		if keys[k] != 1 {
			t.Errorf("DLQ holds record %s %d times, want once (all: %v)", k, keys[k], keys)
		}
	}
}

// setTopicMaxMessageBytes sets a topic's max.message.bytes on the broker.
func setTopicMaxMessageBytes(t *testing.T, cl *kgo.Client, topic string, n int) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = "max.message.bytes"
	c.Value = kmsg.StringPtr(fmt.Sprint(n))
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, rr := range resp.Resources {
		if err := kerr.ErrorForCode(rr.ErrorCode); err != nil {
			t.Fatalf("alter %s: %v", rr.ResourceName, err)
		}
	}
}

// TestPoisonRecordsNeverStallThePartition interleaves valid envelopes with an
// invalid one larger than sarama's default producer limit (the source topic
// takes 8 MiB) and a record that panics the decoder. Every valid event is
// stored once, each poison record reaches the DLQ with its reason, and the
// committed offset reaches the end of the partition. When the DLQ topic takes
// 8 MiB too the big record is dead-lettered whole; when it keeps the broker's
// 1 MiB, as a reference without its value.
func TestPoisonRecordsNeverStallThePartition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		dlqLimit int // 0: the broker's default
		wantRef  bool
	}{
		{name: "dlq takes it", dlqLimit: 8 << 20},
		{name: "dlq too small", wantRef: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const topic, group = "poison", "poison@proxy-01"
			c := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+DLQSuffix))
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.ProducerBatchMaxBytes(8<<20))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			setTopicMaxMessageBytes(t, cl, topic, 8<<20)
			if tc.dlqLimit > 0 {
				setTopicMaxMessageBytes(t, cl, topic+DLQSuffix, tc.dlqLimit)
			}

			big, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{Topic: topic},
				Extensions: map[string][]byte{"blob": make([]byte, 3<<19)}}) // 1.5 MiB, no message_id
			boom := []byte("boom")
			var recs []*kgo.Record
			var valid []string
			for k := range 30 {
				switch k {
				case 7:
					recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("big"), Value: big})
				case 19:
					recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("boom"), Value: boom})
				default:
					id := fmt.Sprintf("v-%02d", k)
					valid = append(valid, id)
					recs = append(recs, kafkatest.Record(t, topic, id, &envelopev1.PrismEnvelope{EnvelopeVersion: 1,
						Metadata: &envelopev1.PrismMetadata{MessageId: id, Topic: topic, PublishedAt: timestamppb.Now()}}))
				}
			}
			if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}

			st, err := store.Open(store.Options{InMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			m := NewMetrics(prometheus.NewRegistry())
			cfg := Config{MailboxID: group, Brokers: c.Brokers, Topics: []string{topic}, BatchSize: 5, BatchWait: 10 * time.Millisecond,
				BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond, Metrics: m}
			cfg.process = func(raw []byte, mode envelope.Mode, log *slog.Logger) (*mailboxv1.MailboxItem, error) {
				if bytes.Equal(raw, boom) {
					panic("decoder bug")
				}
				return envelope.Process(raw, mode, log)
			}
			ing, err := Start(cfg, st)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "committed to the end of the partition", func() bool { return committed(t, c.Brokers, group, topic) == int64(len(recs)) })
			if err := ing.Close(); err != nil {
				t.Fatal(err)
			}

			if s, err := st.Stats(context.Background()); err != nil || s.TotalEvents != int64(len(valid)) {
				t.Fatalf("stored %d events (err %v), want %d", s.TotalEvents, err, len(valid))
			}
			for _, id := range valid {
				if _, err := st.Get(context.Background(), id); err != nil {
					t.Fatalf("valid event %s: %v", id, err)
				}
			}
			if d := testutil.ToFloat64(m.duplicates.WithLabelValues(group)); d != 0 {
				t.Fatalf("%v duplicates: a valid event was written twice", d)
			}

			dlq := c.ReadAll(t, topic+DLQSuffix, 2)
			byKey := map[string]*kgo.Record{}
			for _, r := range dlq {
				if byKey[string(r.Key)] != nil {
					t.Fatalf("record %s dead-lettered twice", r.Key)
				}
				byKey[string(r.Key)] = r
			}
			if len(dlq) != 2 || byKey["big"] == nil || byKey["boom"] == nil {
				t.Fatalf("DLQ holds %d records (keys %v), want big and boom", len(dlq), byKey)
			}
			if r := kafkatest.Header(byKey["boom"], HeaderReason); r != string(reasonDecodePanic) {
				t.Errorf("panicking record's reason %q, want %q", r, reasonDecodePanic)
			}
			if !bytes.Equal(byKey["boom"].Value, boom) {
				t.Errorf("panicking record dead-lettered with value %q, want %q", byKey["boom"].Value, boom)
			}
			b := byKey["big"]
			if r := kafkatest.Header(b, HeaderReason); r != string(envelope.ReasonMissingMessageID) {
				t.Errorf("big record's reason %q, want %q", r, envelope.ReasonMissingMessageID)
			}
			if off := kafkatest.Header(b, HeaderSourceOffset); off != "7" {
				t.Errorf("big record's source offset %q, want 7", off)
			}
			if tc.wantRef {
				if len(b.Value) != 0 || kafkatest.Header(b, HeaderTruncated) == "" ||
					kafkatest.Header(b, HeaderOriginalBytes) != fmt.Sprint(len(big)+len("big")) {
					t.Errorf("big record dead-lettered with %d value bytes, truncated %q, original bytes %q; want a reference of %d bytes",
						len(b.Value), kafkatest.Header(b, HeaderTruncated), kafkatest.Header(b, HeaderOriginalBytes), len(big)+len("big"))
				}
			} else if !bytes.Equal(b.Value, big) || kafkatest.Header(b, HeaderTruncated) != "" {
				t.Errorf("big record dead-lettered with %d value bytes (truncated %q), want it whole (%d)",
					len(b.Value), kafkatest.Header(b, HeaderTruncated), len(big))
			}
		})
	}
}

// TestDLQRefusalsAsTooLarge has the broker refuse, as MESSAGE_TOO_LARGE, every
// DLQ batch of more than one record or of more than 64 KiB, whatever the
// producer believes the limit is: records refused only for sharing a batch are
// dead-lettered whole, one at a time; the one too large alone as a reference.
func TestDLQRefusalsAsTooLarge(t *testing.T) {
	t.Parallel()
	const topic, group = "q", "refuse@proxy-01"
	c := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+DLQSuffix))
	var refused atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		pr := req.(*kmsg.ProduceRequest)
		tooLarge := false
		for _, rt := range pr.Topics {
			for _, rp := range rt.Partitions {
				var b kmsg.RecordBatch
				if rt.Topic == topic+DLQSuffix && b.ReadFrom(rp.Records) == nil && (b.NumRecords > 1 || b.Length > 64<<10) {
					tooLarge = true
				}
			}
		}
		if !tooLarge {
			return nil, nil, false
		}
		c.KeepControl()
		refused.Add(1)
		return produceError(pr, kerr.MessageTooLarge.Code), nil, true
	})
	var recs []*kgo.Record
	for k := range 6 {
		v := []byte{0xff, byte(k)} // undecodable
		if k == 3 {
			v = bytes.Repeat([]byte{0xff}, 200<<10)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(k)), Value: v})
	}
	c.Produce(t, recs...)
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ing, err := Start(Config{MailboxID: group, Brokers: c.Brokers, Topics: []string{topic}, BatchWait: 50 * time.Millisecond,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond}, st)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "committed past the poison", func() bool { return committed(t, c.Brokers, group, topic) == int64(len(recs)) })
	if err := ing.Close(); err != nil {
		t.Fatal(err)
	}
	if refused.Load() == 0 {
		t.Fatal("the broker refused no DLQ batch; the test exercised nothing")
	}
	got := map[string]*kgo.Record{}
	for _, r := range c.ReadAll(t, topic+DLQSuffix, len(recs)) {
		if got[string(r.Key)] != nil {
			t.Fatalf("record %s dead-lettered twice", r.Key)
		}
		got[string(r.Key)] = r
	}
	for k, want := range recs {
		r := got[fmt.Sprint(k)]
		switch {
		case r == nil:
			t.Errorf("record %d not dead-lettered", k)
		case kafkatest.Header(r, HeaderReason) != string(envelope.ReasonUndecodable):
			t.Errorf("record %d reason %q", k, kafkatest.Header(r, HeaderReason))
		case k == 3 && (len(r.Value) != 0 || kafkatest.Header(r, HeaderTruncated) == ""):
			t.Errorf("record 3 (200 KiB) dead-lettered with %d value bytes, truncated %q; want a reference", len(r.Value), kafkatest.Header(r, HeaderTruncated))
		case k != 3 && !bytes.Equal(r.Value, want.Value):
			t.Errorf("record %d dead-lettered as %x, want whole %x", k, r.Value, want.Value)
		}
	}
}

// produceError answers every partition of a produce request with code.
func produceError(pr *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range pr.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// refusingWriter refuses, with err, every write holding an item whose
// message id starts with "bad", and writes the rest to st.
type refusingWriter struct {
	st  *store.Store
	err error
}

func (w *refusingWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	for _, it := range items {
		if strings.HasPrefix(it.GetMessageId(), "bad") {
			return store.WriteResult{}, w.err
		}
	}
	return w.st.Write(ctx, items)
}

// TestStoreRefusalsAreDeadLettered: records the store keeps refusing are
// dead-lettered as store_failed once their batch failed StoreAttempts times,
// every other record of their batches is stored once, and the partition is
// committed to its end; a refusal that is the store's own (an I/O error)
// dead-letters nothing and stalls the partition instead.
func TestStoreRefusalsAreDeadLettered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		err      error
		deadLets bool
	}{
		{name: "record refused", err: errors.New("value too large for the store"), deadLets: true},
		{name: "store failing", err: fmt.Errorf("write: %w", &fs.PathError{Op: "write", Path: "000001.vlog", Err: syscall.EIO})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const topic, group = "refused", "refused@proxy-01"
			c := kafkatest.Start(t, kafkatest.Topics(1, topic, topic+DLQSuffix))
			var recs []*kgo.Record
			var valid, bad []string
			for k := range 20 {
				id := fmt.Sprintf("ok-%02d", k)
				if k%7 == 3 {
					id = fmt.Sprintf("bad-%02d", k)
					bad = append(bad, id)
				} else {
					valid = append(valid, id)
				}
				recs = append(recs, kafkatest.Record(t, topic, id, &envelopev1.PrismEnvelope{EnvelopeVersion: 1,
					Metadata: &envelopev1.PrismMetadata{MessageId: id, Topic: topic, PublishedAt: timestamppb.Now()}}))
			}
			c.Produce(t, recs...)
			st, err := store.Open(store.Options{InMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			m := NewMetrics(prometheus.NewRegistry())
			ing, err := Start(Config{MailboxID: group, Brokers: c.Brokers, Topics: []string{topic}, BatchSize: 4, BatchWait: 10 * time.Millisecond,
				BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond, DrainTimeout: 200 * time.Millisecond,
				StoreAttempts: 3, StallAfter: 6, Metrics: m}, &refusingWriter{st: st, err: tc.err})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.deadLets {
				stalled := m.stalled.WithLabelValues(group, topic, "0", "store")
				waitFor(t, "the partition stalled", func() bool { return testutil.ToFloat64(stalled) == 1 })
				if err := ing.Close(); err != nil {
					t.Logf("close: %v", err)
				}
				// Only the batch before the first refused record (offsets 0-3 hold bad-03) may be stored.
				if off := committed(t, c.Brokers, group, topic); off > 0 {
					t.Fatalf("committed offset %d past a batch the store failed to write", off)
				}
				if n := testutil.ToFloat64(m.deadLettered.WithLabelValues(group, string(reasonStoreFailed))); n != 0 {
					t.Fatalf("%v records dead-lettered for the store's own failure", n)
				}
				return
			}
			waitFor(t, "committed to the end of the partition", func() bool { return committed(t, c.Brokers, group, topic) == int64(len(recs)) })
			if err := ing.Close(); err != nil {
				t.Fatal(err)
			}
			if s, err := st.Stats(context.Background()); err != nil || s.TotalEvents != int64(len(valid)) {
				t.Fatalf("stored %d events (err %v), want %d", s.TotalEvents, err, len(valid))
			}
			for _, id := range valid {
				if _, err := st.Get(context.Background(), id); err != nil {
					t.Fatalf("valid event %s: %v", id, err)
				}
			}
			got := map[string]string{}
			for _, r := range c.ReadAll(t, topic+DLQSuffix, len(bad)) {
				if _, dup := got[string(r.Key)]; dup {
					t.Fatalf("record %s dead-lettered twice", r.Key)
				}
				got[string(r.Key)] = kafkatest.Header(r, HeaderReason)
				if e := kafkatest.Header(r, HeaderError); !strings.Contains(e, "value too large") {
					t.Errorf("record %s dead-lettered with error %q, want the store's", r.Key, e)
				}
			}
			if len(got) != len(bad) {
				t.Fatalf("DLQ holds %v, want %v", got, bad)
			}
			for _, id := range bad {
				if got[id] != string(reasonStoreFailed) {
					t.Errorf("record %s reason %q, want %q", id, got[id], reasonStoreFailed)
				}
			}
			if s := testutil.ToFloat64(m.stalls.WithLabelValues(group, "store")); s != 0 {
				t.Errorf("%v stalls counted for records the store refused", s)
			}
		})
	}
}
