package ingest

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/prism-mesh/prism/internal/lazy"
)

// Kafka is what the mailboxes of one runner share of their Kafka side: one
// client, connected at the first Start that uses it, for the requests that
// are the same for every mailbox (the dead-letter topics made sure of and
// their max.message.bytes read, once per topic), so that starting a mailbox
// asks the cluster nothing once its topics were seen.
//
// Each mailbox's consumer group and dead-letter producer keep a client of
// their own (sarama: "consumer groups can only re-use but not share
// clients"): a sarama.Broker answers one request at a time, so a thousand
// groups on one client would queue every fetch, heartbeat and commit behind
// each other's long polls. That client is created without the full metadata
// fetch, so Start makes no request of its own; it connects when the group
// first consumes.
type Kafka struct {
	brokers []string
	sarama  *sarama.Config

	// client is connected by the first Start, and again by a later one
	// while connecting fails: the Starts that waited on a failing try take
	// its error rather than each trying again.
	client lazy.Value[sarama.Client]

	// dlqMu guards dlq and is held across the requests that fill it, so
	// concurrent Starts of mailboxes reading one topic ask once.
	dlqMu sync.Mutex
	dlq   map[string]*dlqTopic // by dead-letter topic name
}

// dlqTopic is what is known of one dead-letter topic. A check that failed
// leaves its part unknown, and a later Start asks again.
type dlqTopic struct {
	exists bool // created, or found existing
	limit  int  // its max.message.bytes; 0: not known yet
}

// NewKafka returns the Kafka side shared by the mailboxes of a runner, which
// all reach brokers with sc (nil = SaramaConfig()). It connects at the first
// Start given it; Close closes it after every ingester using it.
func NewKafka(brokers []string, sc *sarama.Config) *Kafka {
	if sc == nil {
		sc = SaramaConfig()
	}
	return &Kafka{brokers: brokers, sarama: sc, dlq: map[string]*dlqTopic{}}
}

// Close closes the shared client. The ingesters started with k must be
// closed first: their own clients stay theirs, but a Start after Close fails.
func (k *Kafka) Close() error {
	if err := k.client.Close(sarama.Client.Close); err != nil {
		return fmt.Errorf("close the runner's kafka client: %w", err)
	}
	return nil
}

// connect returns k's client, connecting it first if no Start did yet or
// the last try failed (lazy.Value's rule: a Start that waited on a failing
// try takes its error).
func (k *Kafka) connect() (sarama.Client, error) {
	c, err := k.client.Get(func() (sarama.Client, error) { return sarama.NewClient(k.brokers, k.sarama) })
	if errors.Is(err, lazy.ErrClosed) {
		return nil, fmt.Errorf("the runner's kafka client is %w", err)
	}
	return c, err
}

// prepare makes sure the dead-letter topics dlqs exist and returns the
// smallest of their max.message.bytes (limit), or why it is unknown
// (limitErr). What a check found is kept, so for topics a Start of another
// mailbox saw it asks nothing; what failed is asked again at the next Start.
// err is a client that cannot connect.
func (k *Kafka) prepare(dlqs []string, log *slog.Logger) (client sarama.Client, limit int, limitErr error, err error) {
	client, err = k.connect()
	if err != nil {
		return nil, 0, nil, err
	}
	k.dlqMu.Lock()
	defer k.dlqMu.Unlock()
	var create, describe []string
	for _, t := range dlqs {
		d := k.dlq[t]
		if d == nil {
			d = &dlqTopic{}
			k.dlq[t] = d
		}
		if !d.exists {
			create = append(create, t)
		}
		if d.limit == 0 {
			describe = append(describe, t)
		}
	}
	if len(create) > 0 {
		for _, t := range createDLQTopics(client, create, log) {
			k.dlq[t].exists = true
		}
	}
	if len(describe) > 0 {
		limits, err := dlqLimits(client, describe)
		for t, l := range limits {
			k.dlq[t].limit = l
		}
		if err != nil {
			return client, 0, err, nil
		}
	}
	for _, t := range dlqs {
		l := k.dlq[t].limit
		if limit == 0 || l < limit {
			limit = l
		}
	}
	return client, limit, nil, nil
}

// createDLQTopics creates the dead-letter topics dlqs (best effort: brokers
// that auto-create topics need nothing) and returns those that exist now.
func createDLQTopics(client sarama.Client, dlqs []string, log *slog.Logger) []string {
	broker, err := client.Controller()
	if err != nil {
		log.Warn("no controller to create dead-letter topics; relying on auto-creation", "err", err)
		return nil
	}
	req := &sarama.CreateTopicsRequest{Version: 2, TopicDetails: map[string]*sarama.TopicDetail{}, Timeout: 10 * time.Second}
	for _, t := range dlqs {
		req.TopicDetails[t] = &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: min(3, int16(len(client.Brokers())))}
	}
	resp, err := broker.CreateTopics(req)
	if err != nil {
		log.Warn("create dead-letter topics; relying on auto-creation", "err", err)
		return nil
	}
	var exist []string
	for _, t := range dlqs {
		e := resp.TopicErrors[t]
		switch {
		case e == nil: // not answered: asked again next time
			continue
		case e.Err == sarama.ErrNoError || e.Err == sarama.ErrTopicAlreadyExists:
			exist = append(exist, t)
			continue
		}
		log.Warn("create dead-letter topic; relying on auto-creation", "topic", t, "err", e)
	}
	return exist
}

// dlqLimits is the max.message.bytes of each of the dead-letter topics dlqs
// (each inherits the broker's message.max.bytes unless set): the largest
// record batch it accepts. A topic the answer leaves out or refuses is
// missing from limits and named in err.
func dlqLimits(client sarama.Client, dlqs []string) (limits map[string]int, err error) {
	broker, err := client.Controller()
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	req := &sarama.DescribeConfigsRequest{Version: 1}
	for _, t := range dlqs {
		req.Resources = append(req.Resources, &sarama.ConfigResource{
			Type: sarama.TopicResource, Name: t, ConfigNames: []string{"max.message.bytes"}})
	}
	resp, err := broker.DescribeConfigs(req)
	if err != nil {
		return nil, fmt.Errorf("describe configs: %w", err)
	}
	limits = map[string]int{}
	var errs []error
	for _, r := range resp.Resources {
		if r.ErrorCode != 0 {
			errs = append(errs, fmt.Errorf("describe %s: %w: %s", r.Name, sarama.KError(r.ErrorCode), r.ErrorMsg))
			continue
		}
		for _, e := range r.Configs {
			if e.Name != "max.message.bytes" {
				continue
			}
			v, err := strconv.Atoi(e.Value)
			if err != nil || v <= recordBatchOverhead {
				errs = append(errs, fmt.Errorf("%s max.message.bytes %q", r.Name, e.Value))
				continue
			}
			limits[r.Name] = v
		}
	}
	for _, t := range dlqs {
		if _, ok := limits[t]; !ok && len(errs) == 0 {
			errs = append(errs, fmt.Errorf("no max.message.bytes of %s in the answer", t))
		}
	}
	return limits, errors.Join(errs...)
}
