package kafkasec_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// TestKgoOptsRefuseAsApplyDoes: a franz-go client is refused exactly the
// configurations a sarama client is, for the same reason.
func TestKgoOptsRefuseAsApplyDoes(t *testing.T) {
	t.Parallel()
	for _, sec := range []kafkasec.Security{
		{},
		{SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLScramSHA512, User: "u", Password: "p"}},
		{SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLPlain, User: "u", Password: "p"}},
		{SASL: &kafkasec.SASL{Mechanism: "GSSAPI", User: "u", Password: "p"}},
		{SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLScramSHA256, User: "u"}},
		{TLS: &kafkasec.TLS{CAFile: "/nonexistent/ca.pem"}},
		{TLS: &kafkasec.TLS{CertFile: "c.pem"}},
	} {
		applyErr := sec.Apply(sarama.NewConfig())
		_, kgoErr := sec.KgoOpts()
		if (applyErr == nil) != (kgoErr == nil) || (applyErr != nil && applyErr.Error() != kgoErr.Error()) {
			t.Errorf("%+v: Apply says %v, KgoOpts %v", sec, applyErr, kgoErr)
		}
	}
}

// TestKgoOptsReachASecuredBroker: with KgoOpts a franz-go client produces to
// a broker that requires a client certificate and SCRAM, and without them
// it cannot.
func TestKgoOptsReachASecuredBroker(t *testing.T) {
	t.Parallel()
	kafka := kafkatest.Start(t, kafkatest.Topics(1, "audit"), kafkatest.MutualTLS(), kafkatest.SASL(kafkatest.ScramSHA256, "admin", "secret"))
	sec := kafkasec.Security{
		TLS:  &kafkasec.TLS{CAFile: kafka.TLS.CA, CertFile: kafka.TLS.ClientCert, KeyFile: kafka.TLS.ClientKey},
		SASL: &kafkasec.SASL{Mechanism: kafkasec.SASLScramSHA256, User: "admin", Password: "secret"},
	}
	produce := func(opts []kgo.Opt) error {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(kafka.Brokers...), kgo.RequestRetries(0)}, opts...)...)
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return cl.ProduceSync(ctx, &kgo.Record{Topic: "audit", Value: []byte("x")}).FirstErr()
	}
	opts, err := sec.KgoOpts()
	if err != nil {
		t.Fatal(err)
	}
	if err := produce(opts); err != nil {
		t.Fatalf("produce with KgoOpts: %v", err)
	}
	if err := produce(nil); err == nil {
		t.Fatal("a plaintext client produced to a broker that requires TLS and SCRAM")
	}
}
