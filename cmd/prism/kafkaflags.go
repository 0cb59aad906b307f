package main

import (
	"log/slog"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/mailbox/ingest"
)

// kafkaFlags are how the runner's consumer and dead-letter producer, and the
// admin's audit publisher, reach Kafka: TLS, SASL, both or neither.
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
	warnInsecure(log, sec)
	return sc, nil
}

// kgoOpts are the franz-go options connecting as the flags say, for the
// admin's audit publisher; used says whether a publisher runs, so an admin
// without one warns about nothing.
func (k *kafkaFlags) kgoOpts(log *slog.Logger, used bool) ([]kgo.Opt, error) {
	sec, err := k.Security()
	if err != nil {
		return nil, err
	}
	opts, err := sec.KgoOpts()
	if err != nil {
		return nil, err
	}
	if used {
		warnInsecure(log, sec)
	}
	return opts, nil
}

// warnInsecure warns about a connection that exposes events or credentials.
func warnInsecure(log *slog.Logger, sec kafkasec.Security) {
	switch {
	case sec.TLS == nil:
		log.Warn("kafka connection is plaintext: events cross the network unencrypted (--kafka-tls)", "sasl", sec.SASL != nil)
	case sec.TLS.InsecureSkipVerify:
		log.Warn("kafka brokers' certificates are not verified (--kafka-tls-insecure-skip-verify): anyone on the path can pose as a broker")
	}
}
