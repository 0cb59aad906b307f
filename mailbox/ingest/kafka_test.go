package ingest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// requestCounts counts the requests c's broker gets: CreateTopics,
// DescribeConfigs and the metadata requests for every topic (a client's
// full fetch). fail, when it returns true for a request, answers it with an
// error instead.
type requestCounts struct {
	create, describe, fullMetadata atomic.Int64
}

func countRequests(c *kafkatest.Cluster, fail func(kmsg.Request) kmsg.Response) *requestCounts {
	n := &requestCounts{}
	watch := func(key kmsg.Key, count *atomic.Int64, only func(kmsg.Request) bool) {
		c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if only == nil || only(req) {
				count.Add(1)
			}
			if fail != nil {
				if resp := fail(req); resp != nil {
					return resp, nil, true
				}
			}
			return nil, nil, false
		})
	}
	watch(kmsg.CreateTopics, &n.create, nil)
	watch(kmsg.DescribeConfigs, &n.describe, nil)
	watch(kmsg.Metadata, &n.fullMetadata, func(req kmsg.Request) bool { return req.(*kmsg.MetadataRequest).Topics == nil })
	return n
}

func (n *requestCounts) String() string {
	return fmt.Sprintf("%d CreateTopics, %d DescribeConfigs, %d full metadata fetches", n.create.Load(), n.describe.Load(), n.fullMetadata.Load())
}

// startShared starts mailbox id's ingest on k into a new in-memory store.
func startShared(t *testing.T, k *Kafka, id string, topics ...string) (*Ingester, *store.Store) {
	t.Helper()
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ing, err := Start(Config{MailboxID: id, Kafka: k, Topics: topics, BatchWait: 10 * time.Millisecond,
		Metrics: NewMetrics(prometheus.NewRegistry())}, st)
	if err != nil {
		t.Fatal(err)
	}
	return ing, st
}

func waitStored(t *testing.T, st *store.Store, want int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d events stored", want), func() bool {
		s, err := st.Stats(context.Background())
		return err == nil && s.TotalEvents == want
	})
}

// TestIngestersShareTheRunnersKafka: the mailboxes of one runner, started
// at once on its Kafka, make the cluster create and describe their
// dead-letter topic once between them, and fetch the full metadata once
// (their own clients fetch only their topics'); each still consumes the
// whole topic into its store. Closing them leaves the shared client open: a
// mailbox started after asks the cluster nothing again. After Close, Start
// fails.
func TestIngestersShareTheRunnersKafka(t *testing.T) {
	t.Parallel()
	const topic, n, events = "shared", 6, 5
	c := kafkatest.Start(t, kafkatest.Topics(1, topic))
	c.ProduceEnvelopes(t, topic, kafkatest.Envelopes(topic, events)...)
	counts := countRequests(c, nil)
	k := NewKafka(c.Brokers, nil)

	ings := make([]*Ingester, n)
	stores := make([]*store.Store, n)
	var wg sync.WaitGroup
	for j := range n {
		wg.Go(func() { ings[j], stores[j] = startShared(t, k, fmt.Sprintf("m%d@proxy-01", j), topic) })
	}
	wg.Wait()
	for _, st := range stores {
		waitStored(t, st, events)
	}
	if counts.create.Load() != 1 || counts.describe.Load() != 1 || counts.fullMetadata.Load() != 1 {
		t.Fatalf("%d mailboxes started on one Kafka: %v, want one of each", n, counts)
	}
	for _, ing := range ings {
		if err := ing.Close(); err != nil {
			t.Fatal(err)
		}
	}

	ing, st := startShared(t, k, "late@proxy-01", topic)
	waitStored(t, st, events)
	if err := ing.Close(); err != nil {
		t.Fatal(err)
	}
	if counts.create.Load() != 1 || counts.describe.Load() != 1 || counts.fullMetadata.Load() != 1 {
		t.Fatalf("a mailbox started after the others closed: %v, want still one of each", counts)
	}

	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if ing, err := Start(Config{MailboxID: "closed@proxy-01", Kafka: k, Topics: []string{topic}}, st2); err == nil {
		ing.Close()
		t.Fatal("Start on a closed Kafka succeeded")
	} else if !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Start on a closed Kafka: %v, want it to say the client is closed", err)
	}
}

// TestKafkaAsksAgainAfterAFailedCheck: a dead-letter topic check that fails
// is not remembered as failed: the next mailbox's Start asks again, and once
// it succeeded no later one asks. While the limit is unknown the producer
// keeps its configured max.message.bytes; then it takes the topic's.
func TestKafkaAsksAgainAfterAFailedCheck(t *testing.T) {
	t.Parallel()
	defaultLimit := SaramaConfig().Producer.MaxMessageBytes
	for _, tc := range []struct {
		name                     string
		fail                     kmsg.Key
		wantCreate, wantDescribe int64
	}{
		// The topic is not there to describe either, so both are asked again.
		{name: "create fails", fail: kmsg.CreateTopics, wantCreate: 2, wantDescribe: 2},
		{name: "describe fails", fail: kmsg.DescribeConfigs, wantCreate: 1, wantDescribe: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const topic = "checked"
			c := kafkatest.Start(t, kafkatest.Topics(1, topic))
			var failed atomic.Bool
			counts := countRequests(c, func(req kmsg.Request) kmsg.Response {
				if kmsg.Key(req.Key()) != tc.fail || failed.Swap(true) {
					return nil
				}
				switch r := req.(type) {
				case *kmsg.CreateTopicsRequest:
					resp := r.ResponseKind().(*kmsg.CreateTopicsResponse)
					for _, rt := range r.Topics {
						st := kmsg.NewCreateTopicsResponseTopic()
						st.Topic, st.ErrorCode = rt.Topic, kerr.PolicyViolation.Code
						resp.Topics = append(resp.Topics, st)
					}
					return resp
				case *kmsg.DescribeConfigsRequest:
					resp := r.ResponseKind().(*kmsg.DescribeConfigsResponse)
					for _, rr := range r.Resources {
						sr := kmsg.NewDescribeConfigsResponseResource()
						sr.ResourceType, sr.ResourceName, sr.ErrorCode = rr.ResourceType, rr.ResourceName, kerr.UnknownServerError.Code
						resp.Resources = append(resp.Resources, sr)
					}
					return resp
				}
				return nil
			})
			k := NewKafka(c.Brokers, nil)
			defer k.Close()
			var limits []int
			for j := range 3 {
				ing, _ := startShared(t, k, fmt.Sprintf("m%d@proxy-01", j), topic)
				limits = append(limits, ing.cfg.Sarama.Producer.MaxMessageBytes)
				if err := ing.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if counts.create.Load() != tc.wantCreate || counts.describe.Load() != tc.wantDescribe {
				t.Fatalf("three Starts, the first check failing: %v, want %d CreateTopics and %d DescribeConfigs",
					counts, tc.wantCreate, tc.wantDescribe)
			}
			if limits[0] != defaultLimit || limits[1] == defaultLimit || limits[2] != limits[1] {
				t.Fatalf("producers' max.message.bytes %v: want the configured %d first, then the topic's", limits, defaultLimit)
			}
		})
	}
}

// TestSharedKafkaKeepsEachMailboxsDLQLimit: two mailboxes on one Kafka whose
// dead-letter topics take different sizes (8 MiB, and the broker's 1 MiB)
// each get an invalid 1.5 MiB record: the first dead-letters it whole, the
// second as a reference, as each would alone.
func TestSharedKafkaKeepsEachMailboxsDLQLimit(t *testing.T) {
	t.Parallel()
	const wide, narrow = "wide", "narrow"
	c := kafkatest.Start(t, kafkatest.Topics(1, wide, wide+DLQSuffix, narrow, narrow+DLQSuffix))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.ProducerBatchMaxBytes(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, topic := range []string{wide, narrow} {
		setTopicMaxMessageBytes(t, cl, topic, 8<<20)
	}
	setTopicMaxMessageBytes(t, cl, wide+DLQSuffix, 8<<20)
	big, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{Topic: wide},
		Extensions: map[string][]byte{"blob": make([]byte, 3<<19)}}) // 1.5 MiB, no message_id
	for _, topic := range []string{wide, narrow} {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte("big"), Value: big}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	k := NewKafka(c.Brokers, nil)
	defer k.Close()
	for _, topic := range []string{wide, narrow} {
		ing, _ := startShared(t, k, topic+"@proxy-01", topic)
		defer ing.Close()
	}
	for _, tc := range []struct {
		topic   string
		wantRef bool
	}{{wide, false}, {narrow, true}} {
		recs := c.ReadAll(t, tc.topic+DLQSuffix, 1)
		if len(recs) != 1 {
			t.Fatalf("%s's dead-letter topic holds %d records, want 1", tc.topic, len(recs))
		}
		r := recs[0]
		ref, whole := kafkatest.Header(r, HeaderTruncated) != "", bytes.Equal(r.Value, big)
		if ref != tc.wantRef || whole == tc.wantRef {
			t.Errorf("%s's big record dead-lettered with %d value bytes, truncated %q; want a reference %v",
				tc.topic, len(r.Value), kafkatest.Header(r, HeaderTruncated), tc.wantRef)
		}
	}
}
