// Command ingestbench measures a mailbox's ingest end to end: envelopes are
// pre-produced into an in-process kfake broker, then one ingester (IBM/sarama
// consumer group over loopback TCP) consumes them into a Badger store on disk
// in durable batches, committing offsets after each, until all are stored.
// It prints `BENCH mailbox.ingest_events_per_s <v> events/s`; with -discard the
// items are dropped instead of stored and it prints
// `BENCH mailbox.kafka_decode_events_per_s <v> events/s`: the Kafka side alone
// (fetch, sarama's decoding, CRC and decompression, the claims' batching and
// envelope decoding), from the first batch handed over to the last, so the
// group join does not weigh on a run that lasts a second.
//
// The envelopes are the demo generator's: a trace id per run of about 10
// events, as tracing makes them; -unique-traces gives every event a trace of
// its own, the worst case for the trace index (a posting block per event).
// They are produced round-robin over the partitions, so a claim's batch holds
// every fourth event and a trace's events are spread over four batches;
// -by-trace keys them by trace id instead, a trace on one partition.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

var (
	profile, traceOut, blockProfile string
	discard, uniqueTraces, byTrace  bool
	maxProcessing                   time.Duration
)

func main() {
	n := flag.Int("n", 200_000, "envelopes to ingest")
	size := flag.Int("size", 1024, "approximate envelope size in bytes")
	partitions := flag.Int("partitions", 4, "partitions of the topic")
	batch := flag.Int("batch", 0, "records per durable write (0: ingest default)")
	fetch := flag.Int("fetch", 0, "sarama Consumer.Fetch.Default bytes (0: ingest default)")
	buffer := flag.Int("buffer", 0, "sarama ChannelBufferSize (0: ingest default)")
	flag.BoolVar(&discard, "discard", false, "drop items instead of storing them (measures Kafka consumption and decoding alone: mailbox.kafka_decode_events_per_s)")
	flag.BoolVar(&uniqueTraces, "unique-traces", false, "give every envelope a trace id of its own (the worst case for the trace index) instead of a trace per run of 5-15 envelopes")
	flag.BoolVar(&byTrace, "by-trace", false, "key the records by trace id and partition them by its hash (a trace's events in order on one partition) instead of round-robin")
	maxProc := flag.Duration("max-processing", 0, "sarama Consumer.MaxProcessingTime (0: ingest default)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the ingest phase here")
	flag.StringVar(&traceOut, "trace", "", "write an execution trace of the ingest phase here (go tool trace) and print where its goroutines waited")
	flag.StringVar(&blockProfile, "blockprofile", "", "write a block profile of the ingest phase here (every blocking event is sampled)")
	flag.Parse()
	profile, maxProcessing = *cpuprofile, *maxProc
	if err := run(*n, *size, *partitions, *batch, *fetch, *buffer); err != nil {
		fmt.Fprintln(os.Stderr, "ingestbench:", err)
		os.Exit(1)
	}
}

func run(n, size, partitions, batch, fetch, buffer int) error {
	const topic = "bench.events"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topic, topic+ingest.DLQSuffix))
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	start := time.Now()
	bytes, err := preProduce(brokers, topic, n, size)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "# produced %d envelopes (%d bytes each) in %v\n", n, bytes/int64(n), time.Since(start).Round(time.Millisecond))

	dir, err := os.MkdirTemp("", "ingestbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := store.Open(store.Options{Dir: dir, Logger: quiet})
	if err != nil {
		return err
	}
	defer func() {
		if st != nil {
			_ = st.Close()
		}
	}()

	cfg := ingest.SaramaConfig()
	if fetch > 0 {
		cfg.Consumer.Fetch.Default = int32(fetch)
	}
	if maxProcessing > 0 {
		cfg.Consumer.MaxProcessingTime = maxProcessing
	}
	if buffer > 0 {
		cfg.ChannelBufferSize = buffer
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	stopTrace := func() error { return nil }
	if traceOut != "" {
		f, err := os.Create(traceOut)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return err
		}
		stopTrace = func() error {
			trace.Stop()
			return f.Close()
		}
		defer func() { _ = stopTrace() }()
	}
	if blockProfile != "" {
		runtime.SetBlockProfileRate(1)
		defer func() {
			runtime.SetBlockProfileRate(0)
			if err := writeProfile("block", blockProfile); err != nil {
				fmt.Fprintln(os.Stderr, "ingestbench: block profile:", err)
			}
		}()
	}
	start = time.Now()
	cpuStart := cpuTime()
	w := &countingWriter{}
	if !discard {
		w.store = st
	}
	ing, err := ingest.Start(ingest.Config{MailboxID: "bench@proxy-01", Brokers: brokers, Topics: []string{topic},
		BatchSize: batch, Sarama: cfg, Logger: quiet}, w)
	if err != nil {
		return err
	}
	var firstStored time.Duration
	var firstCount int64
	deadline := time.Now().Add(10 * time.Minute)
	for {
		got := w.written.Load()
		if got > 0 && firstStored == 0 {
			firstStored, firstCount = time.Since(start), got
		}
		if got >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d written after 10 minutes", got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpuStart
	if traceOut != "" {
		// The trace covers the ingest alone, not the drain and group leave of Close.
		err := stopTrace()
		stopTrace = func() error { return nil }
		if err != nil {
			return err
		}
		if err := printWaits(traceOut, os.Stderr); err != nil {
			return err
		}
	}
	if err := ing.Close(); err != nil {
		return err
	}
	if !discard {
		// Closed before counting: Badger's tables then hold every key, the last memtable flushed.
		err := st.Close()
		st = nil
		if err != nil {
			return err
		}
		if keys, err := tableKeys(dir); err != nil {
			fmt.Fprintln(os.Stderr, "ingestbench: count keys:", err)
		} else {
			fmt.Fprintf(os.Stderr, "# %.2f Badger keys per event (the items, their message ids, posting blocks; read from the tables after the run)\n",
				float64(keys)/float64(n))
		}
	}
	fmt.Fprintf(os.Stderr, "# ingested %d in %v (first batch stored after %v: group join and first fetch)\n",
		n, elapsed.Round(time.Millisecond), firstStored.Round(time.Millisecond))
	if calls := w.calls.Load(); calls > 0 {
		busy := time.Duration(w.busy.Load())
		fmt.Fprintf(os.Stderr, "# %d store writes, %v mean; claims spent %.0f%% of the run in Write, summed over claims "+
			"(writes are serialized, so 100%% or more means the store is the limit)\n",
			calls, (busy / time.Duration(calls)).Round(time.Microsecond), 100*busy.Seconds()/elapsed.Seconds())
	}
	// On a shared machine the wall clock swings with the neighbours' load; the CPU per event does much less.
	fmt.Fprintf(os.Stderr, "# process CPU %.2f µs per event (the in-process kfake broker's share included), %.2f cores busy\n",
		float64(cpu.Microseconds())/float64(n), cpu.Seconds()/elapsed.Seconds())
	if discard {
		steady := elapsed - firstStored
		fmt.Fprintf(os.Stderr, "# %.0f events/s over the whole run, group join included\n", float64(n)/elapsed.Seconds())
		fmt.Printf("BENCH mailbox.kafka_decode_events_per_s %.0f events/s\n", float64(int64(n)-firstCount)/steady.Seconds())
		fmt.Printf("BENCH mailbox.kafka_decode_mib_per_s %.1f MiB/s\n", float64(bytes)*float64(int64(n)-firstCount)/float64(n)/steady.Seconds()/(1<<20))
		return nil
	}
	fmt.Printf("BENCH mailbox.ingest_events_per_s %.0f events/s\n", float64(n)/elapsed.Seconds())
	fmt.Printf("BENCH mailbox.ingest_mib_per_s %.1f MiB/s\n", float64(bytes)/elapsed.Seconds()/(1<<20))
	return nil
}

// preProduce writes n demo envelopes padded to about size bytes, round-robin
// over the partitions (by their trace id's hash with -by-trace), and returns the
// bytes produced.
func preProduce(brokers []string, topic string, n, size int) (int64, error) {
	partitioner := kgo.RoundRobinPartitioner()
	if byTrace {
		partitioner = kgo.StickyKeyPartitioner(nil)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(partitioner), kgo.MaxBufferedRecords(20_000))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	probe := demo.New(demo.Options{PayloadSize: 1})
	_, b := probe.NextBytes(topic)
	gen := demo.New(demo.Options{Seed: 1, IDPrefix: "bench", PayloadSize: max(1, size-len(b)), UniqueTraces: uniqueTraces})
	ctx := context.Background()
	var total int64
	errs := make(chan error, 1)
	for range n {
		env := gen.Next(topic)
		v, err := proto.Marshal(env)
		if err != nil {
			return 0, err
		}
		key := env.GetMetadata().GetMessageId()
		if byTrace {
			key = env.GetObservability().GetTraceId()
		}
		total += int64(len(v))
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	select {
	case err := <-errs:
		return 0, fmt.Errorf("produce: %w", err)
	default:
	}
	return total, nil
}

// countingWriter writes to store (or drops the items when store is nil) and
// counts the items written, duplicates and expired items included, so the benchmark knows when
// everything has passed through.
type countingWriter struct {
	store   *store.Store
	written atomic.Int64
	busy    atomic.Int64 // nanoseconds spent inside store writes
	calls   atomic.Int64
}

func (c *countingWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	res := store.WriteResult{Stored: len(items)}
	if c.store != nil {
		start := time.Now()
		var err error
		res, err = c.store.Write(ctx, items)
		c.busy.Add(int64(time.Since(start)))
		c.calls.Add(1)
		if err != nil {
			return res, err
		}
	}
	c.written.Add(int64(res.Stored + res.Duplicates + res.Expired))
	return res, nil
}

// tableKeys opens the closed store's database read-only and returns how many keys its tables hold, versions
// included: what the ingest wrote (nothing was overwritten but the store's counters, once per write group).
func tableKeys(dir string) (int64, error) {
	db, err := badger.Open(badger.DefaultOptions(dir).WithReadOnly(true).WithLogger(nil).WithValueLogFileSize(128 << 20))
	if err != nil {
		return 0, err
	}
	var keys int64
	for _, t := range db.Tables() {
		keys += int64(t.KeyCount)
	}
	return keys, db.Close()
}

// writeProfile writes the named runtime profile to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpuTime is the CPU time (user and system) this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
