package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/mailbox/ingest"
)

// envKafkaSASLPassword holds the SASL password for containers that take it
// from a secret as an environment variable; a flag would show it in ps.
const envKafkaSASLPassword = "PRISM_KAFKA_SASL_PASSWORD"

// kafkaFlags are how the runner's consumer and dead-letter producer reach
// Kafka: TLS, SASL, both or neither.
type kafkaFlags struct {
	tls                bool
	ca, cert, key      string
	serverName         string
	insecureSkipVerify bool
	mechanism          string
	user               string
	passwordFile       string
}

func (k *kafkaFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&k.tls, "kafka-tls", false, "connect to Kafka over TLS (implied by the other --kafka-tls-* flags)")
	fs.StringVar(&k.ca, "kafka-tls-ca", "", "PEM bundle the brokers' certificates chain to (default: the system roots)")
	fs.StringVar(&k.cert, "kafka-tls-cert", "", "PEM client certificate for brokers that require one (ssl.client.auth=required); re-read on each new connection")
	fs.StringVar(&k.key, "kafka-tls-key", "", "PEM private key of --kafka-tls-cert")
	fs.StringVar(&k.serverName, "kafka-tls-server-name", "", "name the brokers' certificates must carry (default: each broker's host)")
	fs.BoolVar(&k.insecureSkipVerify, "kafka-tls-insecure-skip-verify", false, "accept any broker certificate: encrypted but unauthenticated, the SASL password goes to whoever answers (test brokers only)")
	fs.StringVar(&k.mechanism, "kafka-sasl-mechanism", "", "SASL mechanism: "+ingest.SASLScramSHA256+", "+ingest.SASLScramSHA512+" or "+ingest.SASLPlain+" (PLAIN only with TLS); empty: no SASL")
	fs.StringVar(&k.user, "kafka-sasl-user", "", "SASL user")
	fs.StringVar(&k.passwordFile, "kafka-sasl-password-file", "", "file holding the SASL password (or env "+envKafkaSASLPassword+")")
}

// security is the ingest connection the flags describe, reading the SASL
// password from its file or the environment.
func (k *kafkaFlags) security() (ingest.Security, error) {
	var sec ingest.Security
	if k.tls || k.ca != "" || k.cert != "" || k.key != "" || k.serverName != "" || k.insecureSkipVerify {
		sec.TLS = &ingest.TLS{CAFile: k.ca, CertFile: k.cert, KeyFile: k.key, ServerName: k.serverName, InsecureSkipVerify: k.insecureSkipVerify}
	}
	envPassword := os.Getenv(envKafkaSASLPassword)
	if k.mechanism == "" {
		if k.user != "" || k.passwordFile != "" || envPassword != "" {
			return sec, errors.New("--kafka-sasl-user, --kafka-sasl-password-file and " + envKafkaSASLPassword + " need --kafka-sasl-mechanism")
		}
		return sec, nil
	}
	password := envPassword
	switch {
	case k.passwordFile != "" && envPassword != "":
		return sec, errors.New("--kafka-sasl-password-file and " + envKafkaSASLPassword + " exclude each other")
	case k.passwordFile != "":
		b, err := os.ReadFile(k.passwordFile)
		if err != nil {
			return sec, fmt.Errorf("--kafka-sasl-password-file: %w", err)
		}
		// Secrets written by editors and `echo` end in a newline that is no part of the password.
		password = strings.TrimRight(string(b), "\r\n")
	}
	if k.user == "" || password == "" {
		return sec, errors.New("--kafka-sasl-mechanism needs --kafka-sasl-user and a password (--kafka-sasl-password-file or " + envKafkaSASLPassword + ")")
	}
	sec.SASL = &ingest.SASL{Mechanism: strings.ToUpper(k.mechanism), User: k.user, Password: password}
	return sec, nil
}

// saramaConfig is ingest's client configuration connecting as the flags say;
// it warns about a connection that exposes events or credentials.
func (k *kafkaFlags) saramaConfig(log *slog.Logger) (*sarama.Config, error) {
	sec, err := k.security()
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
