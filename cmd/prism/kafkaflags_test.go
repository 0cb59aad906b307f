package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/mailbox/ingest"
)

func parseKafkaFlags(t *testing.T, args ...string) *kafkaFlags {
	t.Helper()
	var k kafkaFlags
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	k.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &k
}

// TestKafkaFlagsSecurity: the flags and the password environment variable
// give the ingest connection they describe, and contradictions or missing
// credentials are refused.
func TestKafkaFlagsSecurity(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     string // PRISM_KAFKA_SASL_PASSWORD
		want    ingest.Security
		wantErr string
	}{
		{name: "plaintext"},
		{name: "tls", args: []string{"--kafka-tls"}, want: ingest.Security{TLS: &ingest.TLS{}}},
		{name: "a tls file implies tls", args: []string{"--kafka-tls-ca=ca.pem", "--kafka-tls-server-name=kafka"},
			want: ingest.Security{TLS: &ingest.TLS{CAFile: "ca.pem", ServerName: "kafka"}}},
		{name: "scram, password from a file", args: []string{"--kafka-tls", "--kafka-sasl-mechanism=scram-sha-512", "--kafka-sasl-user=runner", "--kafka-sasl-password-file=" + pwFile},
			want: ingest.Security{TLS: &ingest.TLS{}, SASL: &ingest.SASL{Mechanism: ingest.SASLScramSHA512, User: "runner", Password: "from-file"}}},
		{name: "scram, password from the environment", args: []string{"--kafka-sasl-mechanism=SCRAM-SHA-256", "--kafka-sasl-user=runner"}, env: "from-env",
			want: ingest.Security{SASL: &ingest.SASL{Mechanism: ingest.SASLScramSHA256, User: "runner", Password: "from-env"}}},
		{name: "both password sources", args: []string{"--kafka-sasl-mechanism=PLAIN", "--kafka-sasl-user=runner", "--kafka-sasl-password-file=" + pwFile}, env: "from-env",
			wantErr: "exclude each other"},
		{name: "no password", args: []string{"--kafka-sasl-mechanism=PLAIN", "--kafka-sasl-user=runner"}, wantErr: "a password"},
		{name: "no user", args: []string{"--kafka-sasl-mechanism=PLAIN"}, env: "pw", wantErr: "--kafka-sasl-user"},
		{name: "missing password file", args: []string{"--kafka-sasl-mechanism=PLAIN", "--kafka-sasl-user=u", "--kafka-sasl-password-file=/nonexistent"},
			wantErr: "--kafka-sasl-password-file"},
		{name: "credentials without a mechanism", args: []string{"--kafka-sasl-user=runner"}, wantErr: "need --kafka-sasl-mechanism"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envKafkaSASLPassword, tc.env)
			sec, err := parseKafkaFlags(t, tc.args...).security()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("security() = %+v, %v; want an error saying %q", sec, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sec, tc.want) {
				t.Fatalf("security() = %+v %+v, want %+v %+v", sec.TLS, sec.SASL, tc.want.TLS, tc.want.SASL)
			}
		})
	}
}

// TestKafkaFlagsConnect: the flags an operator passes for a broker with TLS
// and SCRAM give a client that connects to it.
func TestKafkaFlagsConnect(t *testing.T) {
	c := kafkatest.Start(t, kafkatest.Topics(1, "t"), kafkatest.TLS(), kafkatest.SASL(kafkatest.ScramSHA256, "runner", "s3cret"))
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envKafkaSASLPassword, "")
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
