package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"
)

// Leadership is the node's view of who leads (raftnode.Node).
type Leadership interface {
	Leadership() (raftnode.Leadership, <-chan struct{})
}

// Config configures a Publisher.
type Config struct {
	// Brokers are the Kafka seed brokers; required.
	Brokers []string
	// Topic is where events go (default DefaultTopic). Every event goes to
	// its partition 0, so the topic's order is the log's.
	Topic string
	// Namespace names the events' namespace (default Namespace).
	Namespace string
	// Backlog bounds the changes held for publishing (default 100,000).
	// Past it the oldest is dropped and counted
	// (prism_admin_audit_dropped_total): publishing never holds up Raft.
	Backlog int
	// FollowerPoll is how often a follower reads the topic's tail to drop
	// what the leader has published (default 2 s).
	FollowerPoll time.Duration
	// Retry is the wait after a failed produce or tail read (default 500 ms).
	Retry    time.Duration
	Clock    clock.Clock
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Kafka adds client options (TLS, SASL) to the seed brokers'.
	Kafka []kgo.Opt
}

// maxBatch bounds the events of one produce.
const maxBatch = 500

// Publisher is the FSM's CommitObserver that publishes, on the leader only,
// each change with an index past the last one in the topic. Every node
// queues what its FSM applies, so a new leader holds the changes its
// predecessor may not have published; it reads the last published index
// from the topic's tail (the last record's message_id) and resumes after it.
// A change published twice (the old leader's produce landing after the new
// leader's tail read) carries the same message_id and is stored once.
type Publisher struct {
	cfg    Config
	client *kgo.Client
	m      metrics

	mu        sync.Mutex
	pending   []fsm.Commit // in index order
	published uint64       // the topic holds every change up to here
	dropped   uint64       // highest index dropped from a full backlog
	wake      chan struct{}
}

// New returns a Publisher; Run publishes.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("audit: no Kafka brokers")
	}
	if cfg.Backlog < 0 {
		return nil, fmt.Errorf("audit: backlog %d is negative", cfg.Backlog)
	}
	cfg.Topic = cmp.Or(cfg.Topic, DefaultTopic)
	cfg.Namespace = cmp.Or(cfg.Namespace, Namespace)
	cfg.Backlog = cmp.Or(cfg.Backlog, 100_000)
	cfg.FollowerPoll = cmp.Or(cfg.FollowerPoll, 2*time.Second)
	cfg.Retry = cmp.Or(cfg.Retry, 500*time.Millisecond)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowAutoTopicCreation(),
		kgo.ProducerLinger(0),
	}, cfg.Kafka...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("audit: kafka client for %s: %w", cfg.Topic, err)
	}
	p := &Publisher{cfg: cfg, client: client, m: newMetrics(cfg.Registry), wake: make(chan struct{}, 1)}
	return p, nil
}

// Close releases the Kafka client.
func (p *Publisher) Close() { p.client.Close() }

// Committed queues c (fsm.CommitObserver). It never blocks on Kafka: a full
// backlog drops its oldest change.
func (p *Publisher) Committed(c fsm.Commit) {
	p.mu.Lock()
	if c.Index <= p.published {
		p.mu.Unlock()
		return
	}
	if len(p.pending) >= p.cfg.Backlog {
		p.dropped = p.pending[0].Index
		p.pending = p.pending[1:]
		p.m.dropped.Inc()
	}
	p.pending = append(p.pending, c)
	p.m.backlog.Set(float64(len(p.pending)))
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Published is the highest index this node knows the topic holds.
func (p *Publisher) Published() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published
}

// Run publishes while node leads, until ctx ends. ensure, when not nil, is
// called once per leadership before publishing: the server creates the
// $admin namespace on the topic with it.
func (p *Publisher) Run(ctx context.Context, node Leadership, ensure func(ctx context.Context) error) {
	log := p.cfg.Logger.With("topic", p.cfg.Topic)
	var resumedTerm uint64
	for ctx.Err() == nil {
		lead, changed := node.Leadership()
		if !lead.IsLeader {
			resumedTerm = 0
			p.follow(ctx, changed, log)
			continue
		}
		if resumedTerm != lead.Term {
			if err := p.resume(ctx, log.With("term", lead.Term), ensure); err != nil {
				log.Warn("audit: read the topic's tail to resume", "term", lead.Term, "err", err)
				p.sleep(ctx, changed, p.cfg.Retry)
				continue
			}
			resumedTerm = lead.Term
		}
		batch, last := p.next()
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
			case <-changed:
			case <-p.wake:
			}
			continue
		}
		if err := p.produce(ctx, batch); err != nil {
			p.m.errors.Inc()
			log.Warn("audit: publish", "events", len(batch), "first_index", batch[0].Index, "err", err)
			p.sleep(ctx, changed, p.cfg.Retry)
			continue
		}
		p.ack(last)
	}
}

// resume learns the last published index from the topic and, once, has the
// $admin namespace made.
func (p *Publisher) resume(ctx context.Context, log *slog.Logger, ensure func(ctx context.Context) error) error {
	tail, err := p.tail(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	dropped := p.dropped
	p.trimLocked(tail)
	backlog := len(p.pending)
	p.mu.Unlock()
	if dropped > tail {
		log.Error("audit: changes dropped from the full backlog before any leader published them", "published_index", tail,
			"dropped_up_to", dropped)
	}
	log.Info("audit: publishing", "published_index", tail, "backlog", backlog)
	if ensure != nil {
		if err := ensure(ctx); err != nil {
			log.Warn("audit: ensure namespace", "namespace", p.cfg.Namespace, "err", err)
		}
	}
	return nil
}

// follow waits for leadership, reading the topic's tail now and then so
// the backlog holds only what the leader has not published.
func (p *Publisher) follow(ctx context.Context, changed <-chan struct{}, log *slog.Logger) {
	t := p.cfg.Clock.NewTimer(p.cfg.FollowerPoll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-changed:
		return
	case <-t.C():
	}
	tail, err := p.tail(ctx)
	if err != nil {
		log.Debug("audit: follower tail read", "err", err)
		return
	}
	p.mu.Lock()
	p.trimLocked(tail)
	p.mu.Unlock()
}

func (p *Publisher) sleep(ctx context.Context, changed <-chan struct{}, d time.Duration) {
	t := p.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-changed:
	case <-t.C():
	}
}

// trimLocked drops what the topic holds up to tail.
func (p *Publisher) trimLocked(tail uint64) {
	if tail > p.published {
		p.published = tail
		p.m.published.Set(float64(tail))
	}
	i := 0
	for i < len(p.pending) && p.pending[i].Index <= p.published {
		i++
	}
	p.pending = p.pending[i:]
	p.m.backlog.Set(float64(len(p.pending)))
}

// next is the next batch of events and the index it publishes up to (the
// changes the trail leaves out among them included).
func (p *Publisher) next() ([]Event, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var batch []Event
	var last uint64
	for _, c := range p.pending {
		if len(batch) == maxBatch {
			break
		}
		ev, ok, err := eventOf(c, p.cfg.Namespace)
		if err != nil {
			p.cfg.Logger.Error("audit: event", "index", c.Index, "err", err)
		}
		last = c.Index
		if ok {
			batch = append(batch, ev)
		}
	}
	if len(batch) == 0 && last > 0 {
		// Nothing to publish up to last: the topic's tail stays where it
		// is, which is safe, as a resume only re-skips these.
		p.trimLocked(last)
	}
	return batch, last
}

func (p *Publisher) ack(last uint64) {
	p.mu.Lock()
	p.trimLocked(last)
	p.mu.Unlock()
}

func (p *Publisher) produce(ctx context.Context, batch []Event) error {
	recs := make([]*kgo.Record, len(batch))
	for i, ev := range batch {
		b, err := proto.Marshal(ev.Envelope)
		if err != nil {
			return fmt.Errorf("marshal event %d: %w", ev.Index, err)
		}
		recs[i] = &kgo.Record{Topic: p.cfg.Topic, Partition: 0, Key: []byte(ev.Envelope.GetMetadata().GetMessageId()), Value: b}
	}
	if err := p.client.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce to %s: %w", p.cfg.Topic, err)
	}
	now := p.cfg.Clock.Now()
	for _, ev := range batch {
		p.m.lag.Observe(now.Sub(ev.Envelope.GetMetadata().GetPublishedAt().AsTime()).Seconds())
	}
	p.m.events.Add(float64(len(batch)))
	return nil
}

// tail is the index of the last event in the topic's partition 0, 0 when
// it is empty or does not exist yet.
func (p *Publisher) tail(ctx context.Context) (uint64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = p.cfg.Topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition = 0
	rp.Timestamp = -1 // the end
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		return 0, fmt.Errorf("list offsets of %s: %w", p.cfg.Topic, err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return 0, fmt.Errorf("list offsets of %s: malformed answer", p.cfg.Topic)
	}
	part := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return 0, nil
		}
		return 0, fmt.Errorf("list offsets of %s: %w", p.cfg.Topic, err)
	}
	if part.Offset <= 0 {
		return 0, nil
	}
	return p.readAt(ctx, part.Offset-1)
}

// readAt reads the index of the record at offset of partition 0.
func (p *Publisher) readAt(ctx context.Context, offset int64) (uint64, error) {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{p.cfg.Topic: {0: kgo.NewOffset().At(offset)}}),
	}, p.cfg.Kafka...)
	c, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("tail consumer of %s: %w", p.cfg.Topic, err)
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		fs := c.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return 0, fmt.Errorf("read %s at offset %d: %w", p.cfg.Topic, offset, err)
		}
		var rec *kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			if rec == nil || r.Offset > rec.Offset {
				rec = r
			}
		})
		if rec == nil {
			continue
		}
		env := &envelopev1.PrismEnvelope{}
		if err := proto.Unmarshal(rec.Value, env); err != nil {
			return 0, fmt.Errorf("%s at offset %d is no envelope: %w", p.cfg.Topic, rec.Offset, err)
		}
		idx, err := strconv.ParseUint(env.GetMetadata().GetMessageId(), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s at offset %d: message_id %q is no raft index", p.cfg.Topic, rec.Offset, env.GetMetadata().GetMessageId())
		}
		return idx, nil
	}
}
