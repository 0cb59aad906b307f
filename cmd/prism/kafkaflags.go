package main

import (
	"log/slog"

	"github.com/IBM/sarama"

	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/mailbox/ingest"
)

// kafkaFlags are how the runner's consumer and dead-letter producer reach
// Kafka: TLS, SASL, both or neither.
type kafkaFlags struct{ kafkasec.Flags }

// saramaConfig is ingest's client configuration connecting as the flags say;
// it warns about a connection that exposes events or credentials.
func (k *kafkaFlags) saramaConfig(log *slog.Logger) (*sarama.Config, error) {
	sec, err := k.Security()
	if err != nil {
		return nil, err
	}
	sc := ingest.SaramaConfig()
	if err := sec.Apply(sc); err != nil {
		return nil, err
	}
	switch {
	case sec.TLS == nil:
		log.Warn("kafka connection is plaintext: events cross the network unencrypted (--kafka-tls)", "sasl", sec.SASL != nil)
	case sec.TLS.InsecureSkipVerify:
		log.Warn("kafka brokers' certificates are not verified (--kafka-tls-insecure-skip-verify): anyone on the path can pose as a broker")
	}
	return sc, nil
}
