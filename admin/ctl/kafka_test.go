package ctl

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// startKafka is a one-broker kfake holding audit.events that, like prism
// dev's, creates a topic on first use: looking a topic up must not.
func startKafka(t *testing.T) string {
	t.Helper()
	k, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "audit.events", "audit.dlq"), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return strings.Join(k.ListenAddrs(), ",")
}

// partitions is how many partitions topic has on brokers; 0: no such topic.
func partitions(t *testing.T, brokers, topic string) int {
	t.Helper()
	conf := sarama.NewConfig()
	conf.Metadata.AllowAutoTopicCreation = false
	admin, err := sarama.NewClusterAdmin(strings.Split(brokers, ","), conf)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	md, err := admin.DescribeTopics([]string{topic})
	if err != nil {
		t.Fatal(err)
	}
	if md[0].Err != sarama.ErrNoError {
		return 0
	}
	return len(md[0].Partitions)
}

// namespace create looks its topics up in Kafka: a missing one is refused
// (exit 3, nothing created) unless --create-topic creates it; without
// brokers it says nothing was checked. Names break the rule the message
// states.
func TestNamespaceCreateChecksTopics(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	brokers := startKafka(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	withKafka := func(args ...string) []string {
		return append(append(slices.Clone(op), args...), "--kafka-brokers", brokers)
	}
	cases := []struct {
		name    string
		args    []string
		code    int
		want    string // printed
		created bool   // the namespace exists after
	}{
		{"topic exists", withKafka("namespace", "create", "ok-1", "--topic", "audit.events", "--dead-letter-topic", "audit.dlq"), 0, "ok-1", true},
		{"topic missing", withKafka("namespace", "create", "typo-1", "--topic", "audit.evnts"), exitNotFound,
			"topic audit.evnts does not exist on Kafka at " + brokers + ": create it, or pass --create-topic", false},
		{"dead letter topic missing", withKafka("namespace", "create", "typo-2", "--topic", "audit.events", "--dead-letter-topic", "nope.dlq"), exitNotFound,
			"topic nope.dlq does not exist", false},
		{"created when asked", withKafka("namespace", "create", "new-1", "--topic", "new.events", "--create-topic", "--partitions", "2"), 0,
			"created topic new.events on Kafka at " + brokers, true},
		{"no brokers", append(slices.Clone(op), "namespace", "create", "unchecked-1", "--topic", "whatever"), 0,
			"topics not checked: no Kafka brokers given (--kafka-brokers or PRISM_KAFKA_BROKERS)", true},
		{"skipped", withKafka("namespace", "create", "skipped-1", "--topic", "later.events", "--skip-topic-check"), 0, "skipped-1", true},
		{"create without brokers", append(slices.Clone(op), "namespace", "create", "x-1", "--topic", "t", "--create-topic"), exitUsage, "--create-topic needs the Kafka brokers", false},
		{"kafka down", append(slices.Clone(op), "namespace", "create", "x-2", "--topic", "t", "--kafka-brokers", "127.0.0.1:1"), exitUnavailable, "checking topics on Kafka at 127.0.0.1:1", false},
		{"name with a space", append(slices.Clone(op), "namespace", "create", "audit logs", "--topic", "t"), exitUsage, mesh.NamespaceRule, false},
		{"name with '@'", append(slices.Clone(op), "namespace", "create", "audit@p", "--topic", "t"), exitUsage, mesh.NamespaceRule, false},
		{"name too long", append(slices.Clone(op), "namespace", "create", strings.Repeat("a", 254), "--topic", "t"), exitUsage, mesh.NamespaceRule, false},
	}
	for _, tc := range cases {
		out, err := prismctl(t, tc.args...)
		var stderr bytes.Buffer
		if code := exit(err, &stderr); code != tc.code || !strings.Contains(out+stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, printed\n%s%s\nwant exit %d and %q", tc.name, code, out, stderr.String(), tc.code, tc.want)
		}
		ns := tc.args[slices.Index(tc.args, "create")+1]
		_, err = prismctl(t, append(slices.Clone(op), "namespace", "get", ns)...)
		if created := err == nil; created != tc.created {
			t.Errorf("%s: namespace %s created %v, want %v (%v)", tc.name, ns, created, tc.created, err)
		}
	}
	for topic, want := range map[string]int{"audit.evnts": 0, "nope.dlq": 0, "new.events": 2} {
		if got := partitions(t, brokers, topic); got != want {
			t.Errorf("topic %s has %d partitions, want %d (0: none)", topic, got, want)
		}
	}
}

// The brokers come from PRISM_KAFKA_BROKERS, else from the config file when
// prismctl calls that file's admin with its identity.
func TestTopicCheckBrokersFromEnvAndConfig(t *testing.T) {
	a := startAdmin(t)
	brokers := startKafka(t)
	f := a.pki.Files(identity.Operator, "dev")
	path := filepath.Join(t.TempDir(), "prismctl.yaml")
	if err := client.WriteConfig(path, client.FileConfig{Admin: a.addr, CACert: f.CA, Cert: f.Cert, Key: f.Key, KafkaBrokers: brokers}); err != nil {
		t.Fatal(err)
	}
	for _, env := range []string{envAdmin, envCACert, envCert, envKey, envInsecure, envKafka} {
		t.Setenv(env, "")
	}
	t.Setenv(client.EnvConfig, path)
	missing := []string{"--timeout", "20s", "namespace", "create", "typo", "--topic", "audit.evnts"}
	cases := []struct {
		name  string
		env   map[string]string
		extra []string
		want  string
	}{
		{"config file", nil, nil, "does not exist on Kafka at " + brokers},
		{"config file, its admin named", nil, []string{"--admin", a.addr}, "does not exist on Kafka at " + brokers},
		{"env", map[string]string{envKafka: brokers, client.EnvConfig: "/nonexistent"}, a.as(identity.Operator, "ops"), "does not exist on Kafka at " + brokers},
		{"another identity: not the file's brokers", nil, a.as(identity.Operator, "ops"), "topics not checked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out, err := prismctl(t, append(slices.Clone(tc.extra), missing...)...)
			var stderr bytes.Buffer
			exit(err, &stderr)
			if !strings.Contains(out+stderr.String(), tc.want) {
				t.Errorf("printed\n%s%s\nwant %q", out, stderr.String(), tc.want)
			}
			if err == nil {
				if _, err := prismctl(t, append(slices.Clone(a.as(identity.Operator, "ops")), "namespace", "delete", "typo")...); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// namespace create reaches brokers that require TLS and SASL the way prism
// runner does (the same --kafka-tls* and --kafka-sasl* flags), and a client
// the brokers refuse fails within the check's timeout saying how it
// connected and what to check, not just EOF.
func TestNamespaceCreateChecksTopicsOverTLS(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	k := kafkatest.Start(t, kafkatest.Topics(1, "audit.events"), kafkatest.TLS(), kafkatest.SASL(kafkatest.ScramSHA256, "ops", "s3cret"))
	brokers := strings.Join(k.Brokers, ",")
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrongPW := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrongPW, []byte("guess\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sasl := []string{"--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "ops", "--kafka-sasl-password-file", pw}
	cases := []struct {
		name    string
		flags   []string
		topic   string
		code    int
		want    string // printed
		created bool
	}{
		{"tls with its ca, scram", append([]string{"--kafka-tls-ca", k.TLS.CA}, sasl...), "audit.events", 0, "tls-ok", true},
		{"topic missing over tls", append([]string{"--kafka-tls-ca", k.TLS.CA}, sasl...), "audit.evnts", exitNotFound,
			"topic audit.evnts does not exist on Kafka at " + brokers, false},
		{"plaintext client", sasl, "audit.events", exitUnavailable,
			"checking topics on Kafka at " + brokers + ` (plaintext, sasl SCRAM-SHA-256 as "ops"): kafka: client has run out of available brokers to talk to: EOF (the broker closed the connection: check the SASL mechanism, user and password, and whether its listener expects TLS)`, false},
		{"tls without the ca", append([]string{"--kafka-tls"}, sasl...), "audit.events", exitUnavailable, "x509: certificate signed by unknown authority", false},
		{"wrong password", []string{"--kafka-tls-ca", k.TLS.CA, "--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "ops", "--kafka-sasl-password-file", wrongPW},
			"audit.events", exitUnavailable, `(tls, sasl SCRAM-SHA-256 as "ops")`, false},
		{"plain without tls", []string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "ops", "--kafka-sasl-password-file", pw}, "audit.events", exitUsage, "in clear", false},
		{"missing ca file", []string{"--kafka-tls-ca", "/nonexistent/ca.pem"}, "audit.events", exitUsage, "kafka tls ca", false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := fmt.Sprintf("tls-%d", i)
			if tc.created {
				ns = "tls-ok"
			}
			args := append(append(a.as(identity.Operator, "ops"), "--timeout", "20s", "namespace", "create", ns, "--topic", tc.topic, "--kafka-brokers", brokers), tc.flags...)
			start := time.Now()
			out, err := prismctl(t, args...)
			took := time.Since(start)
			var stderr bytes.Buffer
			if code := exit(err, &stderr); code != tc.code || !strings.Contains(out+stderr.String(), tc.want) {
				t.Errorf("exit %d, printed\n%s%s\nwant exit %d and %q", code, out, stderr.String(), tc.code, tc.want)
			}
			// Each call to Kafka is bounded by kafkaTimeout, tried twice.
			if limit := 4 * kafkaTimeout; took > limit {
				t.Errorf("took %v, want under %v", took, limit)
			}
			_, err = prismctl(t, append(a.as(identity.Operator, "ops"), "namespace", "get", ns)...)
			if created := err == nil; created != tc.created {
				t.Errorf("namespace %s created %v, want %v (%v)", ns, created, tc.created, err)
			}
		})
	}
}

// namespace create sends --retention-max-age, --retention-max-size and
// --dead-letter-topic in the namespace's config, and refuses values no
// mailbox could use without creating anything.
func TestNamespaceCreateRetentionAndDeadLetterTopic(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	create := func(ns string, args ...string) []string {
		return append(append(slices.Clone(op), "namespace", "create", ns, "--topic", "orders.events", "--skip-topic-check"), args...)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // printed by create, or for a success by namespace get -o json
	}{
		{"all three", create("kept-1", "--retention-max-age", "36h", "--retention-max-size", "10MiB", "--dead-letter-topic", "orders.poison"), 0,
			`"dead_letter_topic":"orders.poison","lease":{},"retention":{"max_age":"129600s","max_size_bytes":10485760}`},
		{"age alone", create("kept-2", "--retention-max-age", "90m"), 0, `"retention":{"max_age":"5400s"}`},
		{"size alone", create("kept-3", "--retention-max-size", "1GB"), 0, `"retention":{"max_size_bytes":1000000000}`},
		{"negative age", create("bad-1", "--retention-max-age", "-1h"), exitUsage, "--retention-max-age: must not be negative, got -1h0m0s"},
		{"size that is no size", create("bad-2", "--retention-max-size", "lots"), exitUsage, "--retention-max-size: "},
		{"replicas", create("kept-4", "--replicas", "3"), 0, `"replicas":3`},
		{"replicas past the cap", create("bad-4", "--replicas", "6"), exitUsage, "--replicas: 6 copies, at most 5"},
		{"dead letters consumed again", create("bad-3", "--dead-letter-topic", "orders.events"), exitUsage,
			`--dead-letter-topic: "orders.events" is also a --topic: its dead letters would be consumed again`},
	} {
		out, err := prismctl(t, tc.args...)
		var stderr bytes.Buffer
		if code := exit(err, &stderr); code != tc.code || (tc.code != 0 && !strings.Contains(out+stderr.String(), tc.want)) {
			t.Errorf("%s: exit %d, printed\n%s%s\nwant exit %d and %q", tc.name, code, out, stderr.String(), tc.code, tc.want)
		}
		ns := tc.args[slices.Index(tc.args, "create")+1]
		got, err := prismctl(t, append(slices.Clone(op), "namespace", "get", ns, "-o", "json")...)
		switch {
		case tc.code != 0 && err == nil:
			t.Errorf("%s: namespace %s created", tc.name, ns)
		case tc.code == 0 && (err != nil || !strings.Contains(strings.Join(strings.Fields(got), ""), tc.want)):
			t.Errorf("%s: namespace get = %s (%v), want it holding %s", tc.name, got, err, tc.want)
		}
	}
}
