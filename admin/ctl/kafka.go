package ctl

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/internal/kafkasec"
)

// envKafka names the Kafka brokers namespace create checks topics against.
const envKafka = "PRISM_KAFKA_BROKERS"

// kafkaOptions are namespace create's view of Kafka: where the brokers are
// (flag, PRISM_KAFKA_BROKERS, else the config file prism dev writes, when
// prismctl calls that file's admin), how to reach them (prism runner's
// --kafka-tls* and --kafka-sasl* flags) and whether to create the topics
// that are missing.
type kafkaOptions struct {
	brokers    string
	sec        kafkasec.Flags
	create     bool
	skip       bool
	partitions int32
	replicas   int16
}

func (o *kafkaOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.brokers, "kafka-brokers", os.Getenv(envKafka), "Kafka brokers, host:port,..., to check the topics exist on, reached as --kafka-tls* and --kafka-sasl* say (env "+envKafka+"; default: the config file's)")
	fs.BoolVar(&o.create, "create-topic", false, "create the topics that do not exist yet (needs Kafka brokers)")
	fs.BoolVar(&o.skip, "skip-topic-check", false, "create the namespace without looking for its topics in Kafka")
	fs.Int32Var(&o.partitions, "partitions", 0, "partitions of a topic --create-topic creates (0: the brokers' num.partitions)")
	fs.Int16Var(&o.replicas, "replication-factor", 0, "replication factor of a topic --create-topic creates (0: the brokers' default.replication.factor)")
	o.sec.Register(fs)
}

// kafkaTimeout bounds each of the check's and the creation's calls to Kafka.
const kafkaTimeout = 3 * time.Second

// checkTopics makes sure the topics a new namespace consumes exist in Kafka,
// creating the missing ones when asked, before the namespace is created:
// a namespace on a topic nobody produces to (a typo) otherwise shows no
// error anywhere, only no events. Without brokers it says on stderr that
// nothing was checked. A missing topic is NotFound (exit 3).
func (g *globals) checkTopics(cmd *cobra.Command, topics []string) error {
	o := &g.kafka
	if o.skip {
		if o.create {
			return &usageError{cmd, errors.New("--skip-topic-check and --create-topic exclude each other")}
		}
		return nil
	}
	brokers := o.brokers
	if brokers == "" && g.usesConfigFile(cmd) {
		if c, ok, err := g.fileConfig(); err == nil && ok {
			brokers = c.KafkaBrokers
		}
	}
	addrs := splitList(brokers)
	if len(addrs) == 0 {
		if o.create {
			return &usageError{cmd, fmt.Errorf("--create-topic needs the Kafka brokers: --kafka-brokers host:port,... or %s", envKafka)}
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "prismctl: topics not checked: no Kafka brokers given (--kafka-brokers or %s)\n", envKafka)
		return nil
	}
	conf := sarama.NewConfig()
	conf.ClientID = "prismctl"
	// KIP-464: a topic created with -1 partitions or replicas gets the
	// brokers' defaults (Kafka 2.4 and later).
	conf.Version = sarama.V2_4_0_0
	// Looking a topic up must not create it on brokers that create topics
	// on first use: that would hide the very typo this check is for.
	conf.Metadata.AllowAutoTopicCreation = false
	conf.Metadata.Retry.Max = 1
	conf.Admin.Retry.Max = 1
	conf.Admin.Timeout = kafkaTimeout
	conf.Net.DialTimeout, conf.Net.ReadTimeout, conf.Net.WriteTimeout = kafkaTimeout, kafkaTimeout, kafkaTimeout
	sec, err := o.sec.Security()
	if err != nil {
		return &usageError{cmd, err}
	}
	if err := sec.Apply(conf); err != nil {
		return &usageError{cmd, err}
	}
	unreachable := func(err error) error {
		return describe(status.Errorf(codes.Unavailable, "checking topics on Kafka at %s (%s): %v%s (--skip-topic-check creates the namespace without)",
			brokers, kafkasec.Describe(conf), err, kafkasec.ClosedHint(err)))
	}
	admin, err := sarama.NewClusterAdmin(addrs, conf)
	if err != nil {
		return unreachable(err)
	}
	defer admin.Close()
	md, err := admin.DescribeTopics(topics)
	if err != nil {
		return unreachable(err)
	}
	var missing []string
	for _, t := range md {
		switch {
		case errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition):
			missing = append(missing, t.Name)
		case !errors.Is(t.Err, sarama.ErrNoError):
			return fmt.Errorf("topic %s on Kafka at %s: %w", t.Name, brokers, t.Err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if !o.create {
		return describe(status.Errorf(codes.NotFound, "topic %s does not exist on Kafka at %s: create it, or pass --create-topic [--partitions N], or --skip-topic-check to create the namespace anyway",
			strings.Join(missing, ", "), brokers))
	}
	partitions, replicas := o.partitions, o.replicas
	if partitions <= 0 {
		partitions = -1
	}
	if replicas <= 0 {
		replicas = -1
	}
	for _, t := range missing {
		err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: replicas}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s on Kafka at %s: %w", t, brokers, err)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "prismctl: created topic %s on Kafka at %s\n", t, brokers)
	}
	return nil
}

// splitList splits a comma-separated list, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return slices.Clip(out)
}
