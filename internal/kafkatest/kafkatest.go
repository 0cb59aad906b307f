// Package kafkatest starts an in-process Kafka (kfake) broker on loopback for tests, seeded with topics, and
// produces, reads and inspects it the way the tests need.
package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

// Seed is topics created with the same number of partitions.
type Seed struct {
	Partitions int32
	Topics     []string
}

// Topics seeds names with partitions partitions each.
func Topics(partitions int32, names ...string) Seed {
	return Seed{Partitions: partitions, Topics: names}
}

// Cluster is a one-broker kfake cluster listening on loopback TCP, so other processes can use it too. The
// embedded cluster gives tests kfake's request hooks (ControlKey).
type Cluster struct {
	*kfake.Cluster
	Brokers []string
}

// Start starts a cluster with the seeded topics, closed when the test ends.
func Start(t testing.TB, seeds ...Seed) *Cluster {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1)}
	for _, s := range seeds {
		opts = append(opts, kfake.SeedTopics(s.Partitions, s.Topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &Cluster{Cluster: c, Brokers: c.ListenAddrs()}
}

func (c *Cluster) client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// Record is e marshalled as the value of a record on topic with key.
func Record(t testing.TB, topic, key string, e *envelopev1.PrismEnvelope) *kgo.Record {
	t.Helper()
	b, err := proto.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: b}
}

// ProduceEnvelopes produces each envelope to topic keyed by its message id, synchronously.
func (c *Cluster) ProduceEnvelopes(t testing.TB, topic string, envs ...*envelopev1.PrismEnvelope) {
	t.Helper()
	recs := make([]*kgo.Record, len(envs))
	for i, e := range envs {
		recs[i] = Record(t, topic, e.GetMetadata().GetMessageId(), e)
	}
	c.Produce(t, recs...)
}

// Produce writes records synchronously, in chunks that keep a large backlog within the broker's request size,
// within 60s.
func (c *Cluster) Produce(t testing.TB, recs ...*kgo.Record) {
	t.Helper()
	cl := c.client(t, kgo.ProducerLinger(time.Millisecond))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for start := 0; start < len(recs); start += 5000 {
		if err := cl.ProduceSync(ctx, recs[start:min(start+5000, len(recs))]...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// ReadAll consumes topic from the start until want records arrived or 60s passed.
func (c *Cluster) ReadAll(t testing.TB, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := c.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// Committed sums the offsets group has committed on topic's partitions.
func (c *Cluster) Committed(t testing.TB, group, topic string) int64 {
	t.Helper()
	cl := c.client(t)
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	var sum int64
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if tp.Topic == topic && p.Offset > 0 {
				sum += p.Offset
			}
		}
	}
	return sum
}

// Header is the value of the record's header key, or "".
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
