// Command mailboxbench measures the mailbox store (mailbox/store) at scale and, built with -tags libsqlite3,
// a SQLite baseline (one table, one index per queried header: sqlite.go) on the same items. It prints BENCH <name> <value> <unit> lines.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

type config struct {
	n          int
	batch      int
	queries    int
	queryTime  time.Duration
	retain     int
	dir        string
	skipSQLite bool
	sqliteRate int
	rebuild    bool
}

func main() {
	var c config
	flag.IntVar(&c.n, "n", 1_000_000, "items to load")
	flag.IntVar(&c.batch, "batch", 1000, "items per durable store Write")
	flag.IntVar(&c.queries, "queries", 2000, "queries per filter kind (at most)")
	flag.DurationVar(&c.queryTime, "query-time", 2*time.Second, "time per filter kind (at most)")
	flag.IntVar(&c.retain, "retain", 100_000, "oldest items to delete in the retention benchmark")
	flag.StringVar(&c.dir, "dir", "", "scratch directory (default: a new temp dir, removed afterwards)")
	flag.BoolVar(&c.skipSQLite, "skip-sqlite", false, "skip the SQLite baseline")
	flag.IntVar(&c.sqliteRate, "sqlite-rate-items", 200_000, "SQLite items loaded in 100-row transactions to measure its ingest rate; the rest are bulk-loaded to reach -n")
	flag.BoolVar(&c.rebuild, "rebuild", false, "measure only mailbox.rebuild_s_1m: a mailbox of -n events dropped by prism runner rebuild's code and re-ingested from Kafka until it answers -n events again")
	flag.Var(&payloadKind, "payload", "envelope payloads: json (audit events as services log them) or random (an encrypted body: incompressible)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
	}
	err := run(c)
	// Before log.Fatal, which skips deferred calls; a no-op without -cpuprofile.
	pprof.StopCPUProfile()
	if err != nil {
		log.Fatal(err)
	}
}

func bench(name string, value float64, unit string) {
	fmt.Printf("BENCH %s %.6g %s\n", name, value, unit)
}

func note(format string, a ...any) { fmt.Fprintf(os.Stderr, "# "+format+"\n", a...) }

func run(c config) error {
	dir := c.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "mailboxbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if c.rebuild {
		return benchRebuild(c, rebuildDir(dir))
	}
	queries := makeQueries(c)
	if err := benchStore(c, filepath.Join(dir, "badger"), queries); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := benchOpen(filepath.Join(dir, "open")); err != nil {
		return fmt.Errorf("open: %w", err)
	}
	if c.skipSQLite {
		return nil
	}
	sqliteDir := filepath.Join(dir, "sqlite")
	if err := os.Mkdir(sqliteDir, 0o700); err != nil {
		return err
	}
	return benchSQLite(c, filepath.Join(sqliteDir, "mailbox.db"), queries)
}

// query is one indexed lookup, expressed once and run on both engines.
type query struct {
	kind       string // topic, principal, correlation, trace, time_range
	value      string
	start, end int64 // time_range only: [start, end) in unix millis
}

var kinds = []string{"topic", "principal", "correlation", "trace", "time_range"}

func makeQueries(c config) map[string][]query {
	r := rand.New(rand.NewPCG(1, 2))
	qs := map[string][]query{}
	for range c.queries {
		h := headersOf(r.IntN(c.n))
		qs["topic"] = append(qs["topic"], query{kind: "topic", value: h.topic})
		qs["principal"] = append(qs["principal"], query{kind: "principal", value: h.principal})
		qs["correlation"] = append(qs["correlation"], query{kind: "correlation", value: h.corr})
		qs["trace"] = append(qs["trace"], query{kind: "trace", value: h.trace})
		qs["time_range"] = append(qs["time_range"], query{kind: "time_range", start: h.ts - 60_000, end: h.ts})
	}
	return qs
}

func (q query) filter() *mailboxv1.EventFilter {
	f := &mailboxv1.EventFilter{Limit: 100}
	switch q.kind {
	case "topic":
		f.Topics = []string{q.value}
	case "principal":
		f.Principals = []string{q.value}
	case "correlation":
		f.CorrelationId = q.value
	case "trace":
		f.TraceId = q.value
	case "time_range":
		f.StartTime = timestamppb.New(time.UnixMilli(q.start))
		f.EndTime = timestamppb.New(time.UnixMilli(q.end))
	}
	return f
}

// latencies runs do over qs, one at a time, for at most c.queryTime, and reports p50, p99 and queries/s under
// prefix (e.g. mailbox.query_topic). It returns the p99 in ms.
func latencies(c config, prefix string, qs []query, do func(query) (int, error)) (float64, error) {
	var lat []time.Duration
	var rows int
	start := time.Now()
	for _, q := range qs {
		t := time.Now()
		n, err := do(q)
		if err != nil {
			return 0, fmt.Errorf("%s %+v: %w", prefix, q, err)
		}
		lat = append(lat, time.Since(t))
		rows += n
		if time.Since(start) > c.queryTime {
			break
		}
	}
	elapsed := time.Since(start)
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	p99 := pct(0.99)
	bench(prefix+"_p50_ms", pct(0.50), "ms")
	bench(prefix+"_p99_ms", p99, "ms")
	bench(prefix+"_qps", float64(len(lat))/elapsed.Seconds(), "queries/s")
	note("%s: %d queries, %.1f rows per query", prefix, len(lat), float64(rows)/float64(len(lat)))
	return p99, nil
}

// warmUp runs the first queries of qs, at most 200 of them and for at most a second, unmeasured.
func warmUp(qs []query, do func(query) error) error {
	start := time.Now()
	for _, q := range qs[:min(len(qs), 200)] {
		if err := do(q); err != nil {
			return err
		}
		if time.Since(start) > time.Second {
			break
		}
	}
	return nil
}

func benchStore(c config, dir string, queries map[string][]query) error {
	ctx := context.Background()
	// MaxAge is far above the data's span so nothing ages out until the retention step asks with a late "now".
	const maxAge = 365 * 24 * time.Hour
	opts := store.Options{Dir: dir, MaxAge: maxAge, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	s, err := store.Open(opts)
	if err != nil {
		return err
	}
	var inWrite time.Duration
	cpu0 := cpuTime()
	var raw int64
	wall := time.Now()
	var written atomic.Int64
	stop := make(chan struct{})
	during := make(chan duringResult, 1)
	go func() { during <- queryDuring(ctx, s, &written, stop) }()
	err = forBatches(0, c.n, c.batch, func(batch []*mailboxv1.MailboxItem) error {
		for _, it := range batch {
			raw += int64(len(it.GetEnvelopeBlob()))
		}
		t := time.Now()
		res, err := s.Write(ctx, batch)
		inWrite += time.Since(t)
		if err == nil && res.Stored != len(batch) {
			err = fmt.Errorf("stored %d of %d", res.Stored, len(batch))
		}
		written.Add(int64(len(batch)))
		return err
	})
	close(stop)
	dr := <-during
	if err != nil {
		return err
	}
	if dr.err != nil {
		return fmt.Errorf("queries during the load: %w", dr.err)
	}
	if len(dr.lat) > 0 {
		slices.Sort(dr.lat)
		pct := func(p float64) float64 {
			return float64(dr.lat[min(len(dr.lat)-1, int(p*float64(len(dr.lat))))]) / float64(time.Millisecond)
		}
		bench("mailbox.query_p50_ms_during_ingest", pct(0.50), "ms")
		bench("mailbox.query_p99_ms_during_ingest", pct(0.99), "ms")
		note("store: %d queries during the load (%d/s of the five kinds in turn, over the newest %d items written)", len(dr.lat), duringRate, duringWindow)
	}
	note("store: loaded %d items in %v (%v inside Write, batches of %d, each synced)", c.n, time.Since(wall).Round(time.Millisecond), inWrite.Round(time.Millisecond), c.batch)
	bench("mailbox.store_write_events_per_s", float64(c.n)/inWrite.Seconds(), "events/s")
	// CPU per event is steadier than wall time on a shared machine; it includes generating the items and
	// Badger's background flushes and compactions.
	bench("mailbox.store_write_cpu_us_per_event", float64((cpuTime()-cpu0)/time.Microsecond)/float64(c.n), "us")

	if err := s.Close(); err != nil {
		return err
	}
	size, err := dirSize(dir)
	if err != nil {
		return err
	}
	// The target is disk bytes per event at or below the envelope's own bytes: printed side by side.
	bench("mailbox.disk_bytes_per_event", float64(size)/float64(c.n), "bytes")
	bench("mailbox.envelope_bytes_per_event", float64(raw)/float64(c.n), "bytes")
	note("store: %.0f bytes on disk per event for %.0f bytes of envelope (%.2fx), %s payloads", float64(size)/float64(c.n), float64(raw)/float64(c.n), float64(size)/float64(raw), payloadKind)
	t := time.Now()
	if s, err = store.Open(opts); err != nil {
		return err
	}
	defer s.Close()
	note("store: reopened %d items in %v", c.n, time.Since(t).Round(time.Millisecond))

	// Warm up as a serving runner would be: Badger's caches and the page cache hold what queries touch.
	for _, k := range kinds {
		if err := warmUp(queries[k], func(q query) error {
			_, err := s.Query(ctx, q.filter())
			return err
		}); err != nil {
			return err
		}
	}
	var worst float64
	for _, k := range kinds {
		p99, err := latencies(c, "mailbox.query_"+k, queries[k], func(q query) (int, error) {
			resp, err := s.Query(ctx, q.filter())
			return len(resp.GetItems()), err
		})
		if err != nil {
			return err
		}
		worst = max(worst, p99)
	}
	bench("mailbox.query_p99_ms", worst, "ms")

	// Retention: "now" is chosen so that exactly the items before item c.retain's timestamp are older than MaxAge.
	cutoff := tsOf(c.retain)
	want := 0
	for i := range c.n {
		if tsOf(i) < cutoff {
			want++
		}
	}
	t, cpu0 = time.Now(), cpuTime()
	res, err := s.RetainOnce(ctx, time.UnixMilli(cutoff).Add(maxAge))
	if err != nil {
		return err
	}
	took, cpu := time.Since(t), cpuTime()-cpu0
	if res.Deleted != want {
		return fmt.Errorf("retention deleted %d, want %d", res.Deleted, want)
	}
	note("store: retention deleted %d items (%d bytes) in %v", res.Deleted, res.DeletedBytes, took.Round(time.Millisecond))
	bench("mailbox.retention_100k_s", took.Seconds()*100_000/float64(res.Deleted), "s")
	bench("mailbox.retention_100k_cpu_s", cpu.Seconds()*100_000/float64(res.Deleted), "s")

	// The sweep after the pass removes the deleted items' keys (a tombstone each), as RunRetention does next.
	t, cpu0 = time.Now(), cpuTime()
	swept, err := s.Sweep(ctx)
	if err != nil {
		return err
	}
	took, cpu = time.Since(t), cpuTime()-cpu0
	if swept != want {
		return fmt.Errorf("sweep removed %d items, want %d", swept, want)
	}
	note("store: sweep removed the keys of %d items in %v", swept, took.Round(time.Millisecond))
	bench("mailbox.retention_sweep_100k_s", took.Seconds()*100_000/float64(swept), "s")
	bench("mailbox.retention_sweep_100k_cpu_s", cpu.Seconds()*100_000/float64(swept), "s")
	return nil
}

// dirSize is the bytes the files under dir occupy (allocated blocks, so preallocated but unwritten space of
// sparse files does not count).
func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n, err := allocated(path)
		total += n
		return err
	})
	return total, err
}

// Queries during the load: duringRate a second, the five kinds in turn, each about an item among the newest
// duringWindow written, as a mailbox's users query what just happened while it ingests.
const (
	duringRate   = 200
	duringWindow = 10_000
)

type duringResult struct {
	lat []time.Duration
	err error
}

// queryDuring queries s at duringRate until stop closes, about items below written, and returns the latencies.
func queryDuring(ctx context.Context, s *store.Store, written *atomic.Int64, stop <-chan struct{}) duringResult {
	var res duringResult
	r := rand.New(rand.NewPCG(3, 4))
	tick := time.NewTicker(time.Second / duringRate)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-stop:
			return res
		case <-tick.C:
		}
		w := int(written.Load())
		if w == 0 {
			continue
		}
		h := headersOf(w - 1 - r.IntN(min(w, duringWindow)))
		q := query{kind: kinds[n%len(kinds)]}
		switch q.kind {
		case "topic":
			q.value = h.topic
		case "principal":
			q.value = h.principal
		case "correlation":
			q.value = h.corr
		case "trace":
			q.value = h.trace
		case "time_range":
			q.start, q.end = h.ts-60_000, h.ts
		}
		t := time.Now()
		if _, err := s.Query(ctx, q.filter()); err != nil {
			res.err = err
			return res
		}
		res.lat = append(res.lat, time.Since(t))
	}
}
