package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/IBM/sarama"
	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

func parseKafkaFlags(t *testing.T, args ...string) *kafkaFlags {
	t.Helper()
	var k kafkaFlags
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	k.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &k
}

// TestKafkaFlagsConnect: the flags an operator passes for a broker with TLS
// and SCRAM give a client that connects to it.
func TestKafkaFlagsConnect(t *testing.T) {
	c := kafkatest.Start(t, kafkatest.Topics(1, "t"), kafkatest.TLS(), kafkatest.SASL(kafkatest.ScramSHA256, "runner", "s3cret"))
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(kafkasec.EnvSASLPassword, "")
	k := parseKafkaFlags(t, "--kafka-tls-ca="+c.TLS.CA, "--kafka-sasl-mechanism=SCRAM-SHA-256", "--kafka-sasl-user=runner",
		"--kafka-sasl-password-file="+pwFile)
	sc, err := k.saramaConfig(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sarama.NewClient(c.Brokers, sc)
	if err != nil {
		t.Fatalf("connect with the flags' config: %v", err)
	}
	defer cl.Close()
	if topics, err := cl.Topics(); err != nil || !reflect.DeepEqual(topics, []string{"t"}) {
		t.Fatalf("topics %v (err %v), want [t]", topics, err)
	}
}
