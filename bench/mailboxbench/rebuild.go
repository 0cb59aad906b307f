package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// benchRebuild measures mailbox.rebuild_s_1m: a mailbox of c.n events whose store is dropped by
// runner.Rebuild, what `prism runner rebuild` runs, and reopened by a runner, from the rebuild's start until the
// mailbox answers c.n events again (GetStats' total_events, as a client asks). The events are produced to an
// in-process kfake broker first; the mailbox's first store is written directly (the same items, durable batches)
// and its consumer group has no offsets, so the rebuild's group reset finds none to delete: on a real broker that
// is one more request.
func benchRebuild(c config, dir string) error {
	const topic, id = "audit.events", "audit-logs@bench"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic, topic+ingest.DLQSuffix))
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	start := time.Now()
	if err := produce(brokers, topic, c.n); err != nil {
		return err
	}
	note("produced %d envelopes to %s in %v", c.n, topic, time.Since(start).Round(time.Millisecond))

	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start = time.Now()
	db, err := store.OpenDB(store.DBOptions{Dir: runner.StoreDir(dir), Logger: quiet})
	if err != nil {
		return err
	}
	st, err := db.Open(store.Options{ID: id, Logger: quiet})
	if err != nil {
		return errors.Join(err, db.Close())
	}
	ctx := context.Background()
	if err := forBatches(0, c.n, c.batch, func(b []*mailboxv1.MailboxItem) error {
		_, err := st.Write(ctx, b)
		return err
	}); err != nil {
		return errors.Join(err, st.Close(), db.Close())
	}
	if err := errors.Join(st.Close(), db.Close()); err != nil {
		return err
	}
	size, _ := dirSize(runner.StoreDir(dir))
	note("first store: %d events written directly in %v, %d MiB on disk", c.n, time.Since(start).Round(time.Millisecond), size>>20)

	start = time.Now()
	if _, err := runner.Rebuild(runner.RebuildConfig{DataDir: dir, Brokers: brokers, Logger: quiet}, []string{id}); err != nil {
		return err
	}
	dropped := time.Since(start)
	r, err := runner.New(runner.Config{DataDir: dir, Brokers: brokers, Logger: quiet})
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Open(runner.MailboxConfig{ID: id, Topics: []string{topic}}); err != nil {
		return err
	}
	var total int64
	for total < int64(c.n) {
		time.Sleep(100 * time.Millisecond)
		s, err := r.Stats(ctx, id)
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		total = s.GetTotalEvents()
	}
	took := time.Since(start)
	if total != int64(c.n) {
		return fmt.Errorf("rebuilt mailbox answers %d events, want %d", total, c.n)
	}
	note("rebuild: store dropped and group reset in %v, %d events re-ingested from Kafka in %v (%.0f events/s)",
		dropped.Round(time.Millisecond), c.n, (took - dropped).Round(time.Millisecond), float64(c.n)/(took-dropped).Seconds())
	name := "mailbox.rebuild_s_1m"
	if c.n != 1_000_000 {
		name = fmt.Sprintf("mailbox.rebuild_s_%d", c.n)
	}
	bench(name, took.Seconds(), "s")
	return nil
}

// produce writes envelopes 0..n-1 (itemOf's) to topic, keyed by message id, across its partitions.
func produce(brokers []string, topic string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.MaxBufferedRecords(20_000))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx := context.Background()
	errs := make(chan error, 1)
	for i := range n {
		it := itemOf(i)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(it.GetMessageId()), Value: it.GetEnvelopeBlob()}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-errs:
		return fmt.Errorf("produce: %w", err)
	default:
		return nil
	}
}

// rebuildDir is the runner data directory under the scratch dir.
func rebuildDir(dir string) string { return filepath.Join(dir, "runner") }
