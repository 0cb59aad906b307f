// Package ingest consumes a mailbox's Kafka topics with an IBM/sarama consumer
// group and writes the envelopes to the mailbox store in durable batches.
//
// Delivery: at least once from Kafka, idempotent in the store by message_id.
// An offset is committed only after every record it covers is durably stored
// or produced to its dead-letter topic, so a crash at any moment loses nothing
// and a redelivery adds nothing. A record that cannot be stored (undecodable or
// invalid envelope, one that makes the decoder panic, or one the store keeps
// refusing) goes to "<topic>.dlq" with the reason in a header, so a poison
// record never blocks its partition. The DLQ producer's size limit is the DLQ
// topics' own max.message.bytes, and a record the DLQ still refuses as too
// large is dead-lettered as a reference without its value. A store write is
// retried StoreAttempts times, then record by record (see isolate); a store
// that fails as a whole, and a DLQ write that keeps failing, are retried with
// backoff without bound and reported as a stalled partition (log and metric),
// never committed past.
//
// Disk pressure is not a failure: while Config.Space says the store's disk is
// short (below its free-space watermark, or a write failed with ENOSPC), each
// claim holds its next batch back before writing it, nothing past it is
// committed, and the batch is written once space returns. The claim stops
// fetching meanwhile (its writer's queue is full), so no more than a batch
// waits in memory per partition.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	badger "github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Headers of a dead-lettered record. The value and key are the original ones.
const (
	HeaderReason          = "prism-dlq-reason"
	HeaderError           = "prism-dlq-error"
	HeaderSourceTopic     = "prism-dlq-source-topic"
	HeaderSourcePartition = "prism-dlq-source-partition"
	HeaderSourceOffset    = "prism-dlq-source-offset"
	HeaderMailbox         = "prism-mailbox-id"
	// HeaderTruncated marks a reference: the record was too large for the
	// dead-letter topic, so the value and the original headers were left out
	// (the key is cut to maxRefKeyBytes). The source topic, partition and
	// offset headers say where to read it.
	HeaderTruncated = "prism-dlq-truncated"
	// HeaderOriginalBytes is a reference's original key, value and header size.
	HeaderOriginalBytes = "prism-dlq-original-bytes"
)

// maxRefKeyBytes bounds the key a reference carries.
const maxRefKeyBytes = 1024

// recordBatchOverhead is what a broker adds to the records it measures
// against max.message.bytes (the v2 record batch header).
const recordBatchOverhead = 61

// reasonUnextractable covers an envelope that decoded and validated but could
// not be turned into an item; envelope.Process has no such case today, and the
// DLQ header must never be empty.
const reasonUnextractable envelope.Reason = "unextractable"

// reasonDecodePanic is a record that made the decoder panic: recovered at the
// record boundary so the one record, not the runner, pays for the bug.
const reasonDecodePanic envelope.Reason = "decode_panic"

// reasonStoreFailed is a record the store refused on its own, after its
// batch failed Config.StoreAttempts times (see isolate).
const reasonStoreFailed envelope.Reason = "store_failed"

// DLQSuffix is appended to a source topic to name its dead-letter topic
// when the mailbox names none (Config.DeadLetterTopic).
const DLQSuffix = ".dlq"

// deadLetterTopic is where a poison record of topic goes.
func (c *Config) deadLetterTopic(topic string) string {
	if c.DeadLetterTopic != "" {
		return c.DeadLetterTopic
	}
	return topic + DLQSuffix
}

// deadLetterTopics are the topics the poison records of c's topics go to.
func (c *Config) deadLetterTopics() []string {
	var out []string
	for _, t := range c.Topics {
		if d := c.deadLetterTopic(t); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// Writer is the part of the mailbox store ingest needs: a durable,
// message_id-idempotent batch write.
type Writer interface {
	Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error)
}

// Space is the store's disk as ingest sees it (a *diskfree.Guard).
type Space interface {
	// Wait returns nil once the disk has room for a write, or ctx's error.
	Wait(ctx context.Context) error
	// Err is non-nil, saying why, while the disk is short.
	Err() error
	// Full reports a write that failed for want of space.
	Full(cause error)
}

// Config of one mailbox's ingest.
type Config struct {
	MailboxID string   // also the consumer group id
	Brokers   []string // host:port of Kafka bootstrap brokers
	Topics    []string
	Mode      envelope.Mode // "" = strict
	// DeadLetterTopic receives the poison records of every topic; ""
	// sends each to its own topic with DLQSuffix appended.
	DeadLetterTopic string

	BatchSize int           // records per store write; default 2000
	BatchWait time.Duration // longest a partial batch waits for more records; default 100ms

	BackoffMin time.Duration // first retry delay of a failed store write or DLQ produce; default 100ms
	BackoffMax time.Duration // retry delay cap; default 10s
	// DrainTimeout bounds Close: the time given to flush and commit what was
	// fetched before the retries are abandoned (uncommitted records are then
	// redelivered on the next start). Default 10s.
	DrainTimeout time.Duration
	// LagInterval is how often each claim's consumer lag is reported even
	// while no batch completes, so a stuck partition shows a growing lag.
	// Default 5s.
	LagInterval time.Duration
	// Clock ticks the lag reports (default the real clock).
	Clock clock.WithTicker
	// StallAfter is the number of failed attempts of one store write or DLQ
	// produce after which its partition is reported stalled: an ERROR naming
	// the partition and offsets, prism_mailbox_ingest_stalled set to 1 and
	// prism_mailbox_ingest_stalls_total counted. The write is retried still
	// (with backoff capped at BackoffMax) and nothing past it is committed.
	// Default 10.
	StallAfter int
	// StoreAttempts bounds the attempts of one batch's store write before
	// its records are written one by one and those the store refuses alone
	// are dead-lettered (reason store_failed). Default 5.
	StoreAttempts int
	// Space, when set, holds store writes back while the store's disk is
	// short of space, and learns of writes that failed for want of it.
	Space Space
	// Governor, when set, holds store writes back and narrows decoding
	// while queries are slower than its target (see Governor).
	Governor *Governor

	Sarama  *sarama.Config // nil = SaramaConfig(); must keep auto-commit off
	Logger  *slog.Logger   // nil = slog.Default()
	Metrics *Metrics       // nil = metrics on a private registry
	// Kafka, when set, is the Kafka side this mailbox shares with the other
	// mailboxes of its runner (NewKafka): Brokers and Sarama are its, and
	// the dead-letter topics are checked once for all of them. Unset, Start
	// connects and checks on its own.
	Kafka *Kafka

	// Start is where a partition starts when the group's committed offset is behind it (or there is none): the
	// stored positions a copy seeded the mailbox with (docs/architecture.md#peer-recovery), since a new group
	// would start at the oldest offset and one committed behind would redeliver what the copy holds. A committed
	// offset past it wins: the mailbox stored that far itself.
	Start []Position

	// process turns a record's value into an item; tests replace it. nil = envelope.Process.
	process func(raw []byte, mode envelope.Mode, log *slog.Logger) (*mailboxv1.MailboxItem, error)
	// decodeRuns is how many goroutines decode a large batch; 0 = GOMAXPROCS. Tests set it.
	decodeRuns int
}

// SaramaConfig is the client configuration ingest uses by default: a new
// group starts at the oldest offset, offsets are committed only explicitly,
// and dead letters are acknowledged by all in-sync replicas.
func SaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "prism-runner"
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Enable = false
	c.Consumer.Return.Errors = true
	// Larger fetches and buffers keep a batch-sized backlog ready while the
	// previous batch is being synced to disk.
	c.Consumer.Fetch.Default = 4 << 20
	c.ChannelBufferSize = 4096
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Retry.Max = 5
	return c
}

func (c *Config) setDefaults() {
	if c.Mode == "" {
		c.Mode = envelope.Strict
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 2000
	}
	if c.BatchWait <= 0 {
		c.BatchWait = 100 * time.Millisecond
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = max(10*time.Second, c.BackoffMin)
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.LagInterval <= 0 {
		c.LagInterval = 5 * time.Second
	}
	if c.StallAfter <= 0 {
		c.StallAfter = 10
	}
	if c.StoreAttempts <= 0 {
		c.StoreAttempts = 5
	}
	if c.process == nil {
		c.process = envelope.Process
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Sarama == nil {
		c.Sarama = SaramaConfig()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(prometheus.NewRegistry())
	}
}

// Ingester consumes one mailbox's topics until Close.
type Ingester struct {
	cfg      Config
	w        Writer
	log      *slog.Logger
	client   sarama.Client
	group    sarama.ConsumerGroup
	producer sarama.SyncProducer

	// runCtx ends when Close starts: no new fetches or sessions.
	runCtx  context.Context
	stopRun context.CancelFunc
	// drainCtx ends when Close's drain timeout passes: flushes give up.
	drainCtx  context.Context
	stopDrain context.CancelFunc

	consuming atomic.Bool
	lag       lagSum
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// Start connects to Kafka, makes sure the dead-letter topics exist (best
// effort: brokers that auto-create topics need nothing) and starts consuming.
// With Config.Kafka set, the connection and the topic checks are the shared
// ones, and the mailbox's own client connects when its group first consumes.
func Start(cfg Config, w Writer) (*Ingester, error) {
	shared := cfg.Kafka
	if shared != nil {
		cfg.Brokers, cfg.Sarama = shared.brokers, shared.sarama
	}
	cfg.setDefaults()
	if cfg.MailboxID == "" || len(cfg.Brokers) == 0 || len(cfg.Topics) == 0 {
		return nil, fmt.Errorf("ingest: mailbox id, brokers and topics are required")
	}
	if cfg.Sarama.Consumer.Offsets.AutoCommit.Enable {
		return nil, fmt.Errorf("ingest %s: sarama auto-commit must be off (offsets follow durable writes)", cfg.MailboxID)
	}
	log := cfg.Logger.With("mailbox_id", cfg.MailboxID)
	// A copy: the DLQ limit below is this mailbox's, and callers share one config.
	sc := *cfg.Sarama
	cfg.Sarama = &sc
	k := shared
	if k == nil {
		// Alone, the mailbox's client (on sc, so it sees the limit set
		// below) checks the topics and then serves the group and producer.
		k = NewKafka(cfg.Brokers, &sc)
	}
	client, limit, limitErr, err := k.prepare(cfg.deadLetterTopics(), log)
	if err != nil {
		return nil, fmt.Errorf("ingest %s: kafka client (%s): %w%s", cfg.MailboxID, kafkasec.Describe(cfg.Sarama), err, kafkasec.ClosedHint(err))
	}
	if limitErr != nil {
		log.Warn("dead-letter topics' max.message.bytes unknown; larger records are dead-lettered as references",
			"err", limitErr, "producer_max_message_bytes", sc.Producer.MaxMessageBytes)
	} else {
		// The broker measures the record batch; sarama its records.
		sc.Producer.MaxMessageBytes = min(limit-recordBatchOverhead, int(sarama.MaxRequestSize)-1)
	}
	if shared != nil {
		// The shared client checked the cluster is reachable; this one
		// fetches metadata only for the topics it uses, when it uses them.
		sc.Metadata.Full = false
		if client, err = sarama.NewClient(cfg.Brokers, &sc); err != nil {
			return nil, fmt.Errorf("ingest %s: kafka client (%s): %w", cfg.MailboxID, kafkasec.Describe(cfg.Sarama), err)
		}
	}
	group, err := sarama.NewConsumerGroupFromClient(cfg.MailboxID, client)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("ingest %s: consumer group: %w", cfg.MailboxID, err)
	}
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		group.Close()
		client.Close()
		return nil, fmt.Errorf("ingest %s: dlq producer: %w", cfg.MailboxID, err)
	}
	i := &Ingester{cfg: cfg, w: w, log: log, client: client, group: group, producer: producer, done: make(chan struct{})}
	i.runCtx, i.stopRun = context.WithCancel(context.Background())
	i.drainCtx, i.stopDrain = context.WithCancel(context.Background())
	go i.logErrors()
	go i.run()
	log.Info("ingest started", "topics", cfg.Topics, "brokers", cfg.Brokers, "kafka_connection", kafkasec.Describe(cfg.Sarama), "validation", string(cfg.Mode))
	return i, nil
}

// Consuming reports whether the ingester is in an active consumer group
// session, which is what readiness means for a mailbox.
func (i *Ingester) Consuming() bool { return i.consuming.Load() }

// Close stops fetching, flushes and commits what was fetched (bounded by the
// drain timeout), leaves the group and closes the Kafka client.
func (i *Ingester) Close() error {
	i.closeOnce.Do(func() {
		i.stopRun()
		t := time.AfterFunc(i.cfg.DrainTimeout, i.stopDrain)
		<-i.done
		t.Stop()
		i.stopDrain()
		i.closeErr = errors.Join(i.producer.Close(), i.group.Close(), i.client.Close())
		if i.closeErr != nil {
			i.closeErr = fmt.Errorf("close ingest %s: %w", i.cfg.MailboxID, i.closeErr)
		}
		i.cfg.Metrics.forget(i.cfg.MailboxID)
		i.log.Info("ingest stopped")
	})
	return i.closeErr
}

func (i *Ingester) run() {
	defer close(i.done)
	delay := i.cfg.BackoffMin
	for {
		err := i.group.Consume(i.runCtx, i.cfg.Topics, &handler{i: i})
		if i.runCtx.Err() != nil || errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return
		}
		if err == nil {
			delay = i.cfg.BackoffMin
			continue
		}
		i.log.Error("consumer group session failed; retrying", "err", err, "retry_in", delay)
		if sleep(i.runCtx, delay) != nil {
			return
		}
		delay = min(2*delay, i.cfg.BackoffMax)
	}
}

func (i *Ingester) logErrors() {
	for err := range i.group.Errors() {
		i.log.Warn("consumer error", "err", err)
	}
}

// handler serves one consumer group session.
type handler struct {
	i       *Ingester
	commits *committer // set by Setup, before sarama starts the claims
}

func (h *handler) Setup(s sarama.ConsumerGroupSession) error {
	// Before the claims start consuming: each starts at its partition's marked offset, and marking only moves
	// an offset forward.
	for _, p := range h.i.cfg.Start {
		if slices.Contains(s.Claims()[p.Topic], p.Partition) {
			s.MarkOffset(p.Topic, p.Partition, p.Next, "")
		}
	}
	h.commits = startCommitter(s)
	h.i.lag.begin(s.Claims())
	h.i.consuming.Store(true)
	h.i.log.Info("consumer group session started", "generation", s.GenerationID(), "claims", s.Claims())
	return nil
}

// Cleanup commits once more: every flush asks for a commit already, but a
// rebalance is the last chance before the partitions move.
func (h *handler) Cleanup(s sarama.ConsumerGroupSession) error {
	h.commits.stop()
	s.Commit()
	h.i.consuming.Store(false)
	h.i.lag.end()
	h.i.log.Info("consumer group session ended", "generation", s.GenerationID())
	return nil
}

// committer commits a session's marked offsets in the background. A commit is
// a round trip to the group coordinator; done inline it would hold each claim's
// next batch back from the store, which then idles between groups. Requests
// made while a commit runs are coalesced into the next one. Only offsets of
// durable batches are ever marked, so a commit can never get ahead of the store.
type committer struct {
	req  chan struct{}
	done chan struct{}
}

func startCommitter(s sarama.ConsumerGroupSession) *committer {
	c := &committer{req: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for range c.req {
			s.Commit()
		}
	}()
	return c
}

func (c *committer) request() {
	select {
	case c.req <- struct{}{}:
	default: // one is already pending and will include this mark
	}
}

func (c *committer) stop() {
	close(c.req)
	<-c.done
}

// ConsumeClaim batches the claim's records by size and time. A full batch is decoded here and handed to the
// claim's writer goroutine, which stores it and marks its offsets for the session's committer, so the next batch
// is fetched and decoded while the previous one is being synced to disk; the writer takes batches in order and
// marks an offset only after the batch it ends is durable. When the claim is revoked or the ingester stops,
// sarama closes Messages(); the batch in hand is then flushed and the writer's backlog stored and marked before
// the partition is let go, and Cleanup commits.
func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	// next is the offset after the last durable (marked) record; negative (sarama's
	// OffsetOldest) until the first record shows where the partition starts.
	var next atomic.Int64
	next.Store(c.InitialOffset())
	stopLag, lagDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(lagDone); h.i.reportLag(c, &next, stopLag) }()
	// Wait for the reporter so no gauge is set after Close forgot the series.
	defer func() { close(stopLag); <-lagDone }()

	w := h.i.startWriter(s, c, h.commits, &next)
	batch := make([]*sarama.ConsumerMessage, 0, h.i.cfg.BatchSize)
	timer := time.NewTimer(h.i.cfg.BatchWait)
	timer.Stop()
	defer timer.Stop()
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		timer.Stop()
		if w.failed.Load() {
			return w.finish()
		}
		w.work <- h.i.decode(batch)
		batch = make([]*sarama.ConsumerMessage, 0, h.i.cfg.BatchSize)
		return nil
	}
	for {
		select {
		case msg, ok := <-c.Messages():
			if !ok {
				if err := flush(); err != nil {
					return err
				}
				return w.finish()
			}
			if next.Load() < 0 {
				next.Store(msg.Offset)
			}
			batch = append(batch, msg)
			if len(batch) == 1 {
				timer.Reset(h.i.cfg.BatchWait)
			}
			if len(batch) >= h.i.cfg.BatchSize {
				if err := flush(); err != nil {
					return err
				}
			}
		case <-timer.C:
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// reportLag sets the claim's lag at once and then every LagInterval until
// stop closes.
func (i *Ingester) reportLag(c sarama.ConsumerGroupClaim, next *atomic.Int64, stop <-chan struct{}) {
	t := i.cfg.Clock.NewTicker(i.cfg.LagInterval)
	defer t.Stop()
	for {
		if at, lag, ok := i.claimLag(c, next.Load()); ok {
			i.setLag(c, at, lag)
		}
		select {
		case <-stop:
			return
		case <-t.C():
		}
	}
}

// claimWriter stores a claim's decoded batches in order. Its queue holds one batch, so the claim decodes at most
// one batch ahead of the one being written.
type claimWriter struct {
	work   chan decoded
	done   chan struct{}
	failed atomic.Bool
	err    error // set before done closes
}

func (i *Ingester) startWriter(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim, commits *committer, next *atomic.Int64) *claimWriter {
	w := &claimWriter{work: make(chan decoded, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for d := range w.work {
			if w.err != nil {
				continue // uncommitted: redelivered after the restart
			}
			i.cfg.Governor.hold(i.runCtx)
			if err := i.flush(s, c, commits, d, next); err != nil {
				w.err = err
				w.failed.Store(true)
			}
		}
	}()
	return w
}

// finish waits for the queued batches and returns the error that stopped the writer, if any.
func (w *claimWriter) finish() error {
	close(w.work)
	<-w.done
	return w.err
}

// flush makes a decoded batch durable (items in the store, rejects in their
// DLQ) and only then marks its offsets and asks for a commit. It returns an error only
// when the drain deadline passed; the batch then stays uncommitted and is
// redelivered.
func (i *Ingester) flush(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim, commits *committer, d decoded, next *atomic.Int64) error {
	id := i.cfg.MailboxID
	m := i.cfg.Metrics
	at := position{topic: c.Topic(), partition: c.Partition(), first: d.batch[0].Offset, last: d.batch[len(d.batch)-1].Offset}
	dead := d.dead
	if len(d.items) > 0 {
		res, refused, err := i.store(at, d)
		if err != nil {
			return err
		}
		m.stored.WithLabelValues(id).Add(float64(res.Stored))
		m.duplicates.WithLabelValues(id).Add(float64(res.Duplicates))
		m.expired.WithLabelValues(id).Add(float64(res.Expired))
		dead = append(dead, refused...)
	}
	if len(dead) > 0 {
		if err := i.deadLetter(at, dead); err != nil {
			return err
		}
	}
	last := d.batch[len(d.batch)-1]
	s.MarkMessage(last, "")
	commits.request()
	next.Store(last.Offset + 1)
	i.setLag(c, last.Offset+1, max(0, c.HighWaterMarkOffset()-last.Offset-1))
	return nil
}

// errNoSpace ends a store write's retries: the disk is out of space, which
// a retry cannot cure, so the write waits for space instead.
var errNoSpace = errors.New("out of space")

// errGaveUp ends a write's bounded retries.
var errGaveUp = errors.New("gave up")

// store writes d's items durably, first waiting while the disk is short of
// space, and again whenever a write fails for want of it. A batch the store
// refuses StoreAttempts times is written record by record (isolate), and the
// records it refuses alone are returned to be dead-lettered.
func (i *Ingester) store(at position, d decoded) (store.WriteResult, []deadLetter, error) {
	from, limit := 1, i.cfg.StoreAttempts
	for {
		if err := i.awaitSpace(at); err != nil {
			return store.WriteResult{}, nil, err
		}
		res, err := i.write(at, d.items, from, limit)
		if errors.Is(err, errNoSpace) {
			from, limit = 1, i.cfg.StoreAttempts
			continue
		}
		if !errors.Is(err, errGaveUp) {
			return res, nil, err
		}
		i.log.Warn("store keeps refusing a batch; writing its records one by one", "topic", at.topic,
			"partition", at.partition, "first_offset", at.first, "last_offset", at.last, "attempts", limit, "err", err)
		res, dead, err := i.isolate(d)
		switch {
		case errors.Is(err, errNoSpace):
			i.unstall(at, "store", limit)
			from, limit = 1, i.cfg.StoreAttempts
		case err != nil:
			// The store fails, not the records: retried without bound, the
			// partition stalls (StallAfter) until the store recovers.
			i.log.Error("store fails whatever the record; retrying the batch", "topic", at.topic,
				"partition", at.partition, "first_offset", at.first, "last_offset", at.last, "err", err)
			from, limit = limit+1, 0
		default:
			i.unstall(at, "store", limit)
			return res, dead, nil
		}
	}
}

// write stores items, retried up to attempt limit (0: without bound)
// counting from attempt from.
func (i *Ingester) write(at position, items []*mailboxv1.MailboxItem, from, limit int) (store.WriteResult, error) {
	var res store.WriteResult
	err := i.retry("store", at, from, limit, func(ctx context.Context) error {
		r, err := i.writeOnce(ctx, items)
		res = r
		return err
	})
	return res, err
}

func (i *Ingester) writeOnce(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	end, _ := i.cfg.Governor.lane(ctx)
	start := time.Now()
	r, err := i.w.Write(ctx, items)
	i.cfg.Metrics.batchWrite.WithLabelValues(i.cfg.MailboxID).Observe(time.Since(start).Seconds())
	end()
	if err != nil && i.cfg.Space != nil && diskfree.IsNoSpace(err) {
		i.cfg.Space.Full(err)
		return r, fmt.Errorf("%w: %w", errNoSpace, err)
	}
	return r, err
}

// isolate writes a batch the store keeps refusing one record at a time and
// returns the records it refuses alone, to be dead-lettered. It returns an
// error instead when the failure is the store's rather than a record's: an
// error of the system underneath (an I/O error, a closed store, the drain
// deadline), or every record of a batch of several refused. Records stored
// before that are stored again with the batch, as duplicates.
func (i *Ingester) isolate(d decoded) (store.WriteResult, []deadLetter, error) {
	var total store.WriteResult
	var dead []deadLetter
	for j, it := range d.items {
		res, err := i.writeOnce(i.drainCtx, []*mailboxv1.MailboxItem{it})
		if err != nil {
			if errors.Is(err, errNoSpace) || storeFailure(err) || i.drainCtx.Err() != nil {
				return total, nil, err
			}
			dead = append(dead, deadLetter{msg: d.msgs[j], reason: reasonStoreFailed, err: err})
			continue
		}
		total.Stored += res.Stored
		total.Duplicates += res.Duplicates
		total.Expired += res.Expired
	}
	if len(d.items) > 1 && len(dead) == len(d.items) {
		return total, nil, fmt.Errorf("all %d records refused alone: %w", len(dead), dead[0].err)
	}
	return total, dead, nil
}

// storeFailure reports an error that says the store or its disk fails,
// whatever the record: an errno from the system (EIO, EROFS, ...), a
// closed store or a cancelled write.
func storeFailure(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno) || errors.Is(err, badger.ErrDBClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// awaitSpace holds the batch at back while the disk is short of space, until
// it has room or the ingester closes; closing, the batch is left uncommitted
// (redelivered on the next start), since the disk cannot take it.
func (i *Ingester) awaitSpace(at position) error {
	if i.cfg.Space == nil {
		return nil
	}
	short := i.cfg.Space.Err()
	if short == nil {
		return nil
	}
	m := i.cfg.Metrics
	part := strconv.Itoa(int(at.partition))
	where := []any{"topic", at.topic, "partition", at.partition, "first_offset", at.first, "last_offset", at.last}
	i.log.Warn("ingest paused: disk short of space; nothing committed past this batch", append(where, "reason", short.Error())...)
	m.paused.WithLabelValues(i.cfg.MailboxID, at.topic, part).Set(1)
	start := time.Now()
	err := i.cfg.Space.Wait(i.runCtx)
	m.paused.WithLabelValues(i.cfg.MailboxID, at.topic, part).Set(0)
	if err != nil {
		return fmt.Errorf("ingest %s: store write of %s/%d offsets %d-%d abandoned at close: disk short of space: %w",
			i.cfg.MailboxID, at.topic, at.partition, at.first, at.last, short)
	}
	i.log.Info("ingest resumed: disk has space again", append(where, "paused_for", time.Since(start))...)
	return nil
}

// deadLetter produces the rejected records to their DLQ topics, resending only
// the ones that failed, until all are acknowledged.
func (i *Ingester) deadLetter(at position, dead []deadLetter) error {
	pending := dead
	return i.retry("dlq", at, 1, 0, func(context.Context) error {
		var err error
		pending, err = i.produceDead(pending)
		return err
	})
}

// produceDead sends dead and returns the ones that failed for a reason worth a
// retry. A record refused as too large may only have overflowed a batch, so it
// is sent again alone; refused alone, it is sent as a reference, which a
// retry could not shrink further.
func (i *Ingester) produceDead(dead []deadLetter) ([]deadLetter, error) {
	msgs := make([]*sarama.ProducerMessage, len(dead))
	for j, d := range dead {
		msgs[j] = i.dlqMessage(d, j)
	}
	err := i.producer.SendMessages(msgs)
	if err == nil {
		i.countDead(dead, nil)
		return nil, nil
	}
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		return dead, err
	}
	var failed, refused []deadLetter
	var errs []error
	for _, pe := range perrs {
		d := dead[pe.Msg.Metadata.(int)]
		refused = append(refused, d)
		switch {
		case !tooLarge(pe.Err) || (d.ref && len(dead) == 1):
			failed = append(failed, d)
			errs = append(errs, pe)
			continue
		case len(dead) == 1:
			i.log.Warn("record too large for the dead-letter topic; dead-lettering a reference", "topic", d.msg.Topic,
				"partition", d.msg.Partition, "offset", d.msg.Offset, "bytes", recordBytes(d.msg), "err", pe.Err)
			d.ref = true
		}
		f, err := i.produceDead([]deadLetter{d})
		failed = append(failed, f...)
		errs = append(errs, err)
	}
	i.countDead(dead, refused)
	return failed, errors.Join(errs...)
}

// tooLarge reports an error that retrying the same record can never cure: the
// broker's MESSAGE_TOO_LARGE, or the producer's own refusal of the record
// (sarama's per-record configuration errors, the size above all).
func tooLarge(err error) bool {
	var ce sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.As(err, &ce)
}

func recordBytes(m *sarama.ConsumerMessage) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		if h != nil {
			n += len(h.Key) + len(h.Value)
		}
	}
	return n
}

// countDead counts and logs the records of sent that are not in failed.
func (i *Ingester) countDead(sent, failed []deadLetter) {
	bad := make(map[*sarama.ConsumerMessage]bool, len(failed))
	for _, f := range failed {
		bad[f.msg] = true
	}
	for _, d := range sent {
		if !bad[d.msg] {
			i.cfg.Metrics.deadLettered.WithLabelValues(i.cfg.MailboxID, string(d.reason)).Inc()
			i.log.Warn("record dead-lettered", "topic", d.msg.Topic, "partition", d.msg.Partition,
				"offset", d.msg.Offset, "reason", string(d.reason), "reference", d.ref, "err", d.err)
		}
	}
}

// dlqMessage is the dead letter of d: the original key, value and headers
// after prism's, or for a reference the headers that locate the record.
func (i *Ingester) dlqMessage(d deadLetter, idx int) *sarama.ProducerMessage {
	h := func(k, v string) sarama.RecordHeader { return sarama.RecordHeader{Key: []byte(k), Value: []byte(v)} }
	pm := &sarama.ProducerMessage{
		Topic: i.cfg.deadLetterTopic(d.msg.Topic),
		Headers: []sarama.RecordHeader{
			h(HeaderReason, string(d.reason)),
			h(HeaderError, d.err.Error()),
			h(HeaderSourceTopic, d.msg.Topic),
			h(HeaderSourcePartition, strconv.Itoa(int(d.msg.Partition))),
			h(HeaderSourceOffset, strconv.FormatInt(d.msg.Offset, 10)),
			h(HeaderMailbox, i.cfg.MailboxID),
		},
		Metadata: idx,
	}
	key := d.msg.Key
	if d.ref {
		pm.Headers = append(pm.Headers, h(HeaderTruncated, "too_large"), h(HeaderOriginalBytes, strconv.Itoa(recordBytes(d.msg))))
		key = key[:min(len(key), maxRefKeyBytes)]
	} else {
		pm.Value = sarama.ByteEncoder(d.msg.Value)
		pm.Headers = append(pm.Headers, derefHeaders(d.msg.Headers)...)
	}
	if key != nil {
		pm.Key = sarama.ByteEncoder(key)
	}
	return pm
}

func derefHeaders(hs []*sarama.RecordHeader) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, 0, len(hs))
	for _, h := range hs {
		if h != nil {
			out = append(out, *h)
		}
	}
	return out
}

// position is the records a write covers, for the logs of its retries.
type position struct {
	topic       string
	partition   int32
	first, last int64
}

// retry runs fn until it succeeds, backing off exponentially, until the
// drain deadline passes, or, when limit is above 0, until attempt limit
// failed (errGaveUp, the stall left for the caller to end: see unstall).
// Attempts are counted from from, so a caller going on with a write it gave
// up on keeps its count. Without a limit it never gives up on its own:
// skipping would lose the records, and committing past them would lose them
// for good. After StallAfter failed attempts the partition is reported
// stalled until fn succeeds, so an operator is alerted instead of the
// partition spinning quietly.
func (i *Ingester) retry(target string, at position, from, limit int, fn func(context.Context) error) error {
	m := i.cfg.Metrics
	part := strconv.Itoa(int(at.partition))
	where := []any{"target", target, "topic", at.topic, "partition", at.partition, "first_offset", at.first, "last_offset", at.last}
	delay := i.cfg.BackoffMin
	for attempt := from; ; attempt++ {
		err := fn(i.drainCtx)
		if errors.Is(err, errNoSpace) {
			if attempt > i.cfg.StallAfter {
				m.stalled.WithLabelValues(i.cfg.MailboxID, at.topic, part, target).Set(0)
			}
			return err
		}
		if err == nil {
			if attempt > i.cfg.StallAfter {
				m.stalled.WithLabelValues(i.cfg.MailboxID, at.topic, part, target).Set(0)
				i.log.Info("stalled partition moves again", append(where, "attempts", attempt)...)
			}
			return nil
		}
		m.retries.WithLabelValues(i.cfg.MailboxID, target).Inc()
		if attempt == limit {
			return fmt.Errorf("%w after %d attempts: %w", errGaveUp, attempt, err)
		}
		// A write given up on at StallAfter stalls at the first failure of its sequel.
		if attempt == i.cfg.StallAfter || (attempt == from && from == i.cfg.StallAfter+1) {
			m.stalled.WithLabelValues(i.cfg.MailboxID, at.topic, part, target).Set(1)
			m.stalls.WithLabelValues(i.cfg.MailboxID, target).Inc()
			i.log.Error("partition stalled: write keeps failing; retrying with backoff, nothing committed past it",
				append(where, "attempts", attempt, "err", err)...)
		}
		i.log.Error("ingest write failed; retrying", append(where, "attempt", attempt, "retry_in", delay, "err", err)...)
		if err := sleep(i.drainCtx, delay); err != nil {
			if attempt >= i.cfg.StallAfter {
				m.stalled.WithLabelValues(i.cfg.MailboxID, at.topic, part, target).Set(0)
			}
			return fmt.Errorf("ingest %s: %s write of %s/%d offsets %d-%d abandoned at drain deadline: %w",
				i.cfg.MailboxID, target, at.topic, at.partition, at.first, at.last, err)
		}
		delay = min(2*delay, i.cfg.BackoffMax)
	}
}

// unstall ends the stall a write given up on at attempt gaveUpAt reported,
// if it went past StallAfter.
func (i *Ingester) unstall(at position, target string, gaveUpAt int) {
	if gaveUpAt > i.cfg.StallAfter {
		i.cfg.Metrics.stalled.WithLabelValues(i.cfg.MailboxID, at.topic, strconv.Itoa(int(at.partition)), target).Set(0)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
