package ingest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// TestSecureIngest: against brokers that require TLS, SASL or both, ingest
// consumes through the authenticated consumer group, stores the valid
// envelopes, dead-letters the bad one through the authenticated producer
// and commits past both.
func TestSecureIngest(t *testing.T) {
	t.Parallel()
	const topic = "sec"
	for _, tc := range []struct {
		name    string
		cluster []kafkatest.Option
		sec     func(c *kafkatest.Cluster) kafkasec.Security
	}{
		{"scram-sha-256", []kafkatest.Option{kafkatest.SASL(kafkatest.ScramSHA256, "runner", "s3cret")},
			func(*kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLScramSHA256, User: "runner", Password: "s3cret"}}
			}},
		{"plain over tls", []kafkatest.Option{kafkatest.TLS(), kafkatest.SASL(kafkatest.Plain, "runner", "s3cret")},
			func(c *kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{TLS: &kafkasec.TLS{CAFile: c.TLS.CA}, SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLPlain, User: "runner", Password: "s3cret"}}
			}},
		{"scram-sha-512 over mutual tls", []kafkatest.Option{kafkatest.MutualTLS(), kafkatest.SASL(kafkatest.ScramSHA512, "runner", "s3cret")},
			func(c *kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{
					TLS:  &kafkasec.TLS{CAFile: c.TLS.CA, CertFile: c.TLS.ClientCert, KeyFile: c.TLS.ClientKey, ServerName: "localhost"},
					SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLScramSHA512, User: "runner", Password: "s3cret"},
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			group := "sec-" + strings.ReplaceAll(tc.name, " ", "-") + "@proxy-01"
			c := kafkatest.Start(t, append([]kafkatest.Option{kafkatest.Topics(1, topic, topic+DLQSuffix)}, tc.cluster...)...)
			var envs []*envelopev1.PrismEnvelope
			for i := range 3 {
				envs = append(envs, &envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
					MessageId: fmt.Sprint("m-", i), Topic: topic, PublishedAt: timestamppb.Now()}})
			}
			c.ProduceEnvelopes(t, topic, envs...)
			c.Produce(t, &kgo.Record{Topic: topic, Key: []byte("bad"), Value: []byte{0xff, 0x01}})

			st, err := store.Open(store.Options{InMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			sc := SaramaConfig()
			if err := tc.sec(c).Apply(sc); err != nil {
				t.Fatal(err)
			}
			ing, err := Start(Config{MailboxID: group, Brokers: c.Brokers, Topics: []string{topic},
				BatchWait: 10 * time.Millisecond, Sarama: sc}, st)
			if err != nil {
				t.Fatal(err)
			}
			defer ing.Close()
			waitFor(t, "committed past the bad record", func() bool { return c.Committed(t, group, topic) == 4 })
			if s, err := st.Stats(context.Background()); err != nil || s.TotalEvents != 3 {
				t.Fatalf("stored %d events (err %v), want 3", s.TotalEvents, err)
			}
			dlq := c.ReadAll(t, topic+DLQSuffix, 1)
			if len(dlq) != 1 || string(dlq[0].Key) != "bad" || kafkatest.Header(dlq[0], HeaderReason) != string(envelope.ReasonUndecodable) {
				t.Fatalf("dead letters %v, want the bad record as undecodable", dlq)
			}
		})
	}
}

// TestSecureIngestRefused: a client the broker does not accept fails Start
// promptly with an error naming the cause, instead of retrying forever.
func TestSecureIngestRefused(t *testing.T) {
	t.Parallel()
	const topic = "sec"
	for _, tc := range []struct {
		name    string
		cluster []kafkatest.Option
		sec     func(c *kafkatest.Cluster) kafkasec.Security
		want    string // in Start's error
	}{
		{"wrong scram password", []kafkatest.Option{kafkatest.SASL(kafkatest.ScramSHA256, "runner", "s3cret")},
			func(*kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLScramSHA256, User: "runner", Password: "guess"}}
			}, "(plaintext, sasl SCRAM-SHA-256 as \"runner\"): kafka: client has run out of available brokers to talk to: EOF (the broker closed the connection: check the SASL mechanism, user and password"},
		{"wrong plain password", []kafkatest.Option{kafkatest.TLS(), kafkatest.SASL(kafkatest.Plain, "runner", "s3cret")},
			func(c *kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{TLS: &kafkasec.TLS{CAFile: c.TLS.CA}, SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLPlain, User: "runner", Password: "guess"}}
			}, "(tls, sasl PLAIN as \"runner\")"},
		{"no sasl against a sasl broker", []kafkatest.Option{kafkatest.SASL(kafkatest.ScramSHA256, "runner", "s3cret")},
			func(*kafkatest.Cluster) kafkasec.Security { return kafkasec.Security{} }, "(plaintext, unauthenticated)"},
		{"tls broker, plaintext client", []kafkatest.Option{kafkatest.TLS()},
			func(*kafkatest.Cluster) kafkasec.Security { return kafkasec.Security{} }, "(plaintext, unauthenticated)"},
		{"tls broker, client without its ca", []kafkatest.Option{kafkatest.TLS()},
			func(*kafkatest.Cluster) kafkasec.Security { return kafkasec.Security{TLS: &kafkasec.TLS{}} }, "x509: certificate signed by unknown authority"},
		{"tls broker, wrong server name", []kafkatest.Option{kafkatest.TLS()},
			func(c *kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{TLS: &kafkasec.TLS{CAFile: c.TLS.CA, ServerName: "kafka.example"}}
			},
			"not kafka.example"},
		{"mutual tls broker, client without a certificate", []kafkatest.Option{kafkatest.MutualTLS()},
			func(c *kafkatest.Cluster) kafkasec.Security {
				return kafkasec.Security{TLS: &kafkasec.TLS{CAFile: c.TLS.CA}}
			}, "tls: certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t, append([]kafkatest.Option{kafkatest.Topics(1, topic, topic+DLQSuffix)}, tc.cluster...)...)
			sc := SaramaConfig()
			if err := tc.sec(c).Apply(sc); err != nil {
				t.Fatal(err)
			}
			st, err := store.Open(store.Options{InMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			start := time.Now()
			ing, err := Start(Config{MailboxID: "refused@proxy-01", Brokers: c.Brokers, Topics: []string{topic}, Sarama: sc}, st)
			if err == nil {
				ing.Close()
				t.Fatal("Start succeeded against a broker that should refuse the client")
			}
			t.Logf("Start: %v", err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start error %q does not say %q", err, tc.want)
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("Start took %v to fail", took)
			}
		})
	}
}
