// Package kafkatest starts an in-process Kafka (kfake) broker on loopback for tests, seeded with topics, served
// in plaintext or over TLS and with or without SASL, and produces, reads and inspects it the way the tests need.
package kafkatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

// Option is what Start is given: topics to seed (Topics), TLS or SASL users.
type Option interface {
	apply(*settings)
}

type settings struct {
	kfake []kfake.Opt
	tls   *tlsOption
	sasl  []sasl.Mechanism // the helpers' own clients authenticate with the first
}

// Seed is topics created with the same number of partitions.
type Seed struct {
	Partitions int32
	Topics     []string
}

func (s Seed) apply(st *settings) {
	st.kfake = append(st.kfake, kfake.SeedTopics(s.Partitions, s.Topics...))
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
	// TLS names the files of a cluster started with TLS; nil in plaintext.
	TLS *TLSFiles

	clientOpts []kgo.Opt // how the helpers' own clients reach the broker
}

// Start starts a cluster with the options' topics, TLS and SASL users, closed when the test ends. The helpers
// (Produce, ReadAll, Committed) connect the way the cluster requires.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	var st settings
	for _, o := range opts {
		o.apply(&st)
	}
	kopts := append([]kfake.Opt{kfake.NumBrokers(1)}, st.kfake...)
	c := &Cluster{}
	if st.tls != nil {
		serverCfg, clientCfg, files := st.tls.build(t)
		kopts = append(kopts, kfake.TLS(serverCfg))
		c.TLS = files
		c.clientOpts = append(c.clientOpts, kgo.DialTLSConfig(clientCfg))
	}
	if len(st.sasl) > 0 {
		c.clientOpts = append(c.clientOpts, kgo.SASL(st.sasl[0]))
	}
	k, err := kfake.NewCluster(kopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	c.Cluster, c.Brokers = k, k.ListenAddrs()
	return c
}

func (c *Cluster) client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.clientOpts...)
	cl, err := kgo.NewClient(append(all, opts...)...)
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

// Envelopes are n minimal valid envelopes on topic, message ids topic-0000 on, in order.
func Envelopes(topic string, n int) []*envelopev1.PrismEnvelope {
	out := make([]*envelopev1.PrismEnvelope, n)
	for i := range out {
		out[i] = &envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata:        &envelopev1.PrismMetadata{MessageId: fmt.Sprintf("%s-%04d", topic, i), Topic: topic, PublishedAt: timestamppb.Now()},
		}
	}
	return out
}
