// Command mixedbench measures queries while a mailbox ingests: a
// `prism runner` process with its `prism sidecar`, one `prism admin` node and
// a `prism gateway` routed by the admin's xDS (plaintext, on loopback) drain a
// backlog pre-produced into an in-process kfake broker once the namespace's
// lease is granted, while a paced loop sends indexed HTTP queries and another
// asks for stats, half of each directly to the runner and half through the
// gateway; the runner's peak RSS under its --memory-budget is followed from
// /proc. After the drain the same loop runs again, over HTTP and over gRPC,
// against the full store, then a loop at -after-qps (1,000/s) over both. It
// prints BENCH lines, each loop's whole and, with the gateway, its _direct and
// _gateway halves. -in-process runs the runner inside this process instead
// (mailbox/runner, no sidecar, no gateway), where -cpuprofile, -blockprofile,
// -mutexprofile and -trace record the ingest phase.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/bench/internal/payload"
	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/runner"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

const topic = "bench.events"

type options struct {
	n, size, partitions int
	payload             payload.Kind
	inProcess, gateway  bool
	budget, prism, dir  string
	qps, statsQPS       float64
	afterQPS            float64
	after, timeout      time.Duration
	cpu, block, mutex   string
	trace               string
	traceFor            time.Duration
	target              time.Duration
	// runnerEnv and runnerArgs are added to the runner process's environment and flags.
	runnerEnv, runnerArgs repeated
}

// repeated is a flag given any number of times, its values in order.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, " ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	var o options
	o.payload = payload.JSON
	flag.IntVar(&o.n, "n", 1_000_000, "envelopes in the backlog")
	flag.IntVar(&o.size, "size", 1024, "approximate envelope size in bytes")
	flag.Var(&o.payload, "payload", "envelope payloads: json (audit events as services log them) or random (encrypted-looking, incompressible)")
	flag.BoolVar(&o.inProcess, "in-process", false, "run the runner in this process (no sidecar, no admin, no budget), as the profiles need")
	flag.StringVar(&o.budget, "memory-budget", "1GiB", "the runner process's --memory-budget (empty: none given, so the product default)")
	flag.StringVar(&o.dir, "dir", "", "scratch directory for the stores and the processes' logs, kept (default: a new temp dir, removed afterwards)")
	flag.StringVar(&o.prism, "prism", "", "the prism binary (default: built from this checkout)")
	flag.IntVar(&o.partitions, "partitions", 3, "partitions of the topic")
	flag.Float64Var(&o.qps, "qps", 200, "queries per second during and after ingest (0: ingest alone)")
	flag.Float64Var(&o.statsQPS, "stats-qps", 20, "stats requests per second during ingest")
	flag.BoolVar(&o.gateway, "gateway", true, "start a prism gateway too and send half of every loop's requests through it (not with -in-process)")
	flag.DurationVar(&o.after, "after", 10*time.Second, "how long each query loop runs after the drain (HTTP, then gRPC at -qps, then both at -after-qps); 0 skips them")
	flag.Float64Var(&o.afterQPS, "after-qps", 1000, "queries per second of the last loop after the drain, half over HTTP and half over gRPC (0 skips it)")
	flag.DurationVar(&o.timeout, "query-timeout", 10*time.Second, "how long after it was due a request is given up (it counts at that latency)")
	flag.StringVar(&o.cpu, "cpuprofile", "", "write a CPU profile of the ingest phase here")
	flag.StringVar(&o.block, "blockprofile", "", "write a block profile of the ingest phase here")
	flag.StringVar(&o.mutex, "mutexprofile", "", "write a mutex profile of the ingest phase here")
	flag.StringVar(&o.trace, "trace", "", "write an execution trace of part of the ingest phase here: the runner's (it serves --enable-pprof), or with -in-process this process's; the runner's HTTP request cycles in it, and the holds of Badger's DB lock that kept its goroutines waiting (with what the holder did, from the trace and a CPU profile beside it, kept as <file>.cpu.pprof), are summed up on stderr")
	flag.DurationVar(&o.target, "query-latency-target", 10*time.Millisecond, "the runner's query latency target, which ingest gives way to (negative: never)")
	flag.DurationVar(&o.traceFor, "trace-for", 3*time.Second, "length of the trace, started 5 s into ingest")
	flag.Var(&o.runnerEnv, "runner-env", "NAME=VALUE added to the runner process's environment, e.g. GODEBUG=gctrace=1 (its output is in the runner's log, kept with -dir) or GOGC=200; repeatable")
	flag.Var(&o.runnerArgs, "runner-arg", "a flag added to the runner process's command line, e.g. --block-profile-rate=10000; repeatable")
	flag.Parse()
	if o.inProcess {
		o.gateway = false
	}
	if o.inProcess && (len(o.runnerEnv) > 0 || len(o.runnerArgs) > 0) {
		fmt.Fprintln(os.Stderr, "mixedbench: -runner-env and -runner-arg are for a runner process, not -in-process")
		os.Exit(2)
	}
	for _, kv := range o.runnerEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			fmt.Fprintf(os.Stderr, "mixedbench: -runner-env %q: want NAME=VALUE\n", kv)
			os.Exit(2)
		}
	}
	if !o.inProcess && (o.cpu != "" || o.block != "" || o.mutex != "") {
		fmt.Fprintln(os.Stderr, "mixedbench: the profiles record this process: they need -in-process")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "mixedbench:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), topic, topic+ingest.DLQSuffix))
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	start := time.Now()
	total, err := preProduce(cluster.ListenAddrs(), o.n, o.size, o.payload)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "# produced %d envelopes (%d bytes each, %s payloads) on %d partitions in %v\n", o.n, total/int64(o.n), o.payload, o.partitions, time.Since(start).Round(time.Millisecond))

	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "mixedbench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	t, err := startTarget(o, cluster.ListenAddrs(), dir)
	if err != nil {
		return err
	}
	failed := true
	defer func() { t.close(failed) }()
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: maxInFlight}} // per host: a lane's

	stopProfiles, err := startProfiles(o, t.pprof)
	if err != nil {
		return err
	}
	sched0 := readMetrics()
	os0 := schedTimes(t.pids)
	start = t.opened
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if t.pid != 0 {
		mem := followRSS(ctx, t.pid)
		defer func() {
			if failed {
				return
			}
			mem.report(o.budget)
			if n := t.fences(); n > 0 {
				fmt.Fprintf(os.Stderr, "# WARNING: the sidecar fenced the runner %d times (its control API unanswered past --runner-dead-after): queries failed and ingest restarted meanwhile, so this run's figures are the machine's, not the runner's\n", n)
			}
		}()
	}
	doors, closeDoors, err := t.doors()
	if err != nil {
		return err
	}
	defer closeDoors()
	var (
		wg   sync.WaitGroup
		qlat = newSplit(doors)
		slat = newSplit(doors)
		pool idPool
	)
	qctx, qcancel := context.WithCancel(ctx)
	if o.qps > 0 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			pace(qctx, o.qps, len(doors), 0, o.timeout, func(ctx context.Context, i int, due time.Time) {
				d := doors[i%len(doors)]
				qlat.time(d, due, func() error { return httpQuery(ctx, cl, d.base, &pool) })
			})
		}()
		go func() {
			defer wg.Done()
			pace(qctx, o.statsQPS, len(doors), 0, o.timeout, func(ctx context.Context, i int, due time.Time) {
				d := doors[i%len(doors)]
				slat.time(d, due, func() error { return fetch(ctx, cl, d.base+"/stats", nil) })
			})
		}()
	}
	deadline := time.Now().Add(30 * time.Minute)
	for {
		n, err := t.stored()
		if err != nil {
			qcancel()
			return err
		}
		if n >= int64(o.n) {
			break
		}
		if time.Now().After(deadline) {
			qcancel()
			return fmt.Errorf("only %d of %d stored after 30 minutes", n, o.n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)
	qcancel()
	wg.Wait()
	sched1 := readMetrics()
	os1 := schedTimes(t.pids)
	stopProfiles()
	if t.pid != 0 {
		fmt.Fprintf(os.Stderr, "# namespace created to its mailbox open at the runner (lease granted): %v\n", t.opened.Sub(t.created).Round(time.Millisecond))
		if !t.routed.IsZero() {
			fmt.Fprintf(os.Stderr, "# the gateway routed the mailbox %v after its open (the queries during ingest started then, half of them through it)\n", t.routed.Sub(t.opened).Round(time.Millisecond))
		}
	}
	beside := "nothing"
	if o.qps > 0 {
		beside = fmt.Sprintf("%.0f queries/s and %.0f stats/s", o.qps, o.statsQPS)
	}
	fmt.Fprintf(os.Stderr, "# drained %d in %v from the mailbox's open with %s beside\n", o.n, elapsed.Round(time.Millisecond), beside)
	who := "the load generator"
	if o.inProcess {
		who = "the runner and the load generator"
	}
	fmt.Fprintf(os.Stderr, "# runtime of this process (%s) during ingest: scheduler latency p50 %.3f ms p99 %.3f ms max %.1f ms; GC %.1f%% of CPU\n", who,
		1e3*sched1.schedQuantile(sched0, 0.5), 1e3*sched1.schedQuantile(sched0, 0.99), 1e3*sched1.schedQuantile(sched0, 1), 100*sched1.gcShare(sched0))
	fmt.Fprintf(os.Stderr, "# during ingest, per process, threads on a core / threads waiting in the kernel's run queue for one, on average (%d cores): %s\n",
		runtime.NumCPU(), os1.since(os0))
	suffix := "_with_queries"
	if o.qps == 0 {
		suffix = ""
	}
	fmt.Printf("BENCH mixed.ingest_events_per_s%s %.0f events/s\n", suffix, float64(o.n)/elapsed.Seconds())
	if held, writes, ok := heldBack(cl, t.metrics); ok {
		fmt.Fprintf(os.Stderr, "# ingest gave way to queries (target %v): %d store writes held back, %.1f s held in all (summed over partitions) in a %.1f s drain\n",
			o.target, writes, held, elapsed.Seconds())
	}
	if o.qps == 0 {
		failed = false
		return nil
	}
	qlat.report("mixed.query_p%s_ms_during_ingest", doors)
	slat.report("mixed.stats_p%s_ms_during_ingest", doors)
	if o.after > 0 {
		afterLoops(ctx, o, cl, doors, &pool, t.pids)
	}
	failed = false
	return nil
}

// afterLoops queries the drained store: for o.after over HTTP, then over gRPC, at -qps; then for o.after at
// -after-qps, half over each, every loop spread evenly over the doors.
func afterLoops(ctx context.Context, o options, cl *http.Client, doors []door, pool *idPool, pids []namedPID) {
	type protocol func(ctx context.Context, d door) error
	overHTTP := func(ctx context.Context, d door) error { return httpQuery(ctx, cl, d.base, pool) }
	overGRPC := func(ctx context.Context, d door) error { return grpcQuery(ctx, d.qc, mailboxID, pool) }
	loop := func(rate float64, protocols ...protocol) (*split, *paced) {
		s := newSplit(doors)
		lctx, cancel := context.WithTimeout(ctx, o.after)
		defer cancel()
		p := pace(lctx, rate, len(doors), int(rate*o.after.Seconds()), o.timeout, func(ctx context.Context, i int, due time.Time) {
			d := doors[i%len(doors)]
			q := protocols[i/len(doors)%len(protocols)]
			s.time(d, due, func() error { return q(ctx, d) })
		})
		return s, p
	}
	s, _ := loop(o.qps, overHTTP)
	s.report(fmt.Sprintf("mixed.query_p%%s_ms_after_%dk_http", o.n/1000), doors)
	s, _ = loop(o.qps, overGRPC)
	s.report(fmt.Sprintf("mixed.query_p%%s_ms_after_%dk_grpc", o.n/1000), doors)
	if o.afterQPS <= 0 {
		return
	}
	name := fmt.Sprintf("mixed.query_p%%s_ms_%.0fqps_after", o.afterQPS)
	cpu0 := cpuTimes(pids)
	answers0 := httpAnswers.Load()
	bytes0 := httpBytes.Load()
	began := time.Now()
	s, p := loop(o.afterQPS, overHTTP, overGRPC)
	took := time.Since(began)
	fmt.Fprintf(os.Stderr, "# %s, half HTTP/JSON and half gRPC, over %v: %v\n", fmt.Sprintf(name, "*"), o.after, p)
	if n := httpAnswers.Load() - answers0; n > 0 {
		fmt.Fprintf(os.Stderr, "# %s: HTTP answers of %.0f KiB on average\n", fmt.Sprintf(name, "*"), float64(httpBytes.Load()-bytes0)/float64(n)/1024)
	}
	fmt.Fprintf(os.Stderr, "# %s: CPU seconds used in the %.1f s from its start to its last answer (%d cores): %s\n",
		fmt.Sprintf(name, "*"), took.Seconds(), runtime.NumCPU(), cpuTimes(pids).since(cpu0))
	for _, w := range p.warnings(int(o.afterQPS * o.after.Seconds())) {
		fmt.Fprintf(os.Stderr, "# WARNING: %s did not keep its rate: %s\n", fmt.Sprintf(name, "*"), w)
	}
	s.report(name, doors)
}

// target is the runner under test, opened on the backlog.
type target struct {
	base, metrics, queryAddr, mailbox string
	// gatewayBase and gatewayGRPC are prism gateway's URL of the mailbox and gRPC address, empty without one.
	gatewayBase, gatewayGRPC string
	// pid is the runner process's, 0 in process.
	pid int
	// created is when the namespace was created (process mode), opened when its mailbox answered or, in
	// process, when it was opened.
	created, opened time.Time
	// pids are the processes whose CPU the 1,000 queries/s loop reports: this one, and in process mode the
	// mesh's.
	pids []namedPID
	// routed is when the gateway first answered for the mailbox (zero without one).
	routed time.Time
	// pprof is the runner process's /debug/pprof URL, when it serves one (-trace).
	pprof  string
	stored func() (int64, error)
	close  func(failed bool)
	// fences is how many times the runner was fenced so far (process mode; nil in process).
	fences func() int
}

// doors are the ways to the mailbox's queries the target has: the runner, and the gateway if one runs.
func (t *target) doors() (_ []door, closeAll func(), err error) {
	var conns []*grpc.ClientConn
	closeAll = func() {
		for _, c := range conns {
			c.Close()
		}
	}
	var doors []door
	for _, d := range []struct{ name, base, grpcAddr string }{{"direct", t.base, t.queryAddr}, {"gateway", t.gatewayBase, t.gatewayGRPC}} {
		if d.base == "" {
			continue
		}
		conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("%s: %w", d.name, err)
		}
		conns = append(conns, conn)
		doors = append(doors, door{name: d.name, base: d.base, qc: mailboxv1.NewMailboxQueryClient(conn)})
	}
	return doors, closeAll, nil
}

func startTarget(o options, brokers []string, dir string) (*target, error) {
	if o.inProcess {
		return startInProcess(o, brokers, dir)
	}
	m, err := startProcs(o, brokers, dir)
	if err != nil {
		return nil, err
	}
	cl := &http.Client{Timeout: 5 * time.Second}
	rp := m.runner
	t := &target{base: m.queryURL(), metrics: "http://" + m.httpAddr + "/metrics", queryAddr: m.queryAddr, mailbox: mailboxID,
		gatewayBase: m.gatewayURL(), gatewayGRPC: m.gatewayGRPC, routed: m.gatewayRouted, pid: rp.cmd.Process.Pid,
		pids: append([]namedPID{{"load generator", os.Getpid()}}, m.pids()...), created: m.created, opened: m.leaseOpened, close: m.close, fences: m.fences}
	if o.trace != "" {
		t.pprof = "http://" + m.httpAddr + "/debug/pprof"
	}
	// Progress is read from /metrics, not the stats API: the governor hears query and stats latencies, and the
	// bench's own polls must not make ingest give way.
	t.stored = func() (int64, error) {
		m, err := scrape(cl, t.metrics)
		if err != nil && rp.alive() {
			return 0, nil // a slow answer under load: ask again
		}
		return int64(m["prism_mailbox_stored_events"]), err
	}
	return t, nil
}

// startInProcess runs mailbox/runner here: ingest, store and both query servers on loopback, no sidecar and no
// TLS, and opens the mailbox.
func startInProcess(o options, brokers []string, dir string) (*target, error) {
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := runner.New(runner.Config{DataDir: dir, Brokers: brokers, Logger: quiet, QueryLatencyTarget: o.target})
	if err != nil {
		return nil, err
	}
	qlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.Close()
		return nil, err
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.Close()
		return nil, err
	}
	r.Serve(qlis, hlis)
	t := &target{base: "http://" + qlis.Addr().String() + "/v1/mailboxes/" + url.PathEscape(mailboxID), metrics: "http://" + hlis.Addr().String() + "/metrics",
		queryAddr: qlis.Addr().String(), mailbox: mailboxID, opened: time.Now(), close: func(bool) { r.Close() },
		pids: []namedPID{{"runner and load generator", os.Getpid()}}}
	t.stored = func() (int64, error) {
		st, err := r.Stats(context.Background(), mailboxID)
		return st.GetTotalEvents(), err
	}
	if err := r.Open(runner.MailboxConfig{ID: mailboxID, Topics: []string{topic}}); err != nil {
		r.Close()
		return nil, err
	}
	return t, nil
}

// heldBack reads the runner's ingest governor counters from its /metrics: seconds store writes waited for
// queries, and how many.
func heldBack(cl *http.Client, metricsURL string) (float64, int, bool) {
	m, err := scrape(cl, metricsURL)
	if err != nil {
		return 0, 0, false
	}
	held, found := m["prism_mailbox_ingest_held_back_seconds_total"]
	return held, int(m["prism_mailbox_ingest_held_back_writes_total"]), found
}

// scrape reads a Prometheus text exposition: each metric's value, summed over its label sets.
func scrape(cl *http.Client, url string) (map[string]float64, error) {
	resp, err := cl.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			// Label values may hold spaces: the value is after the last one.
			name, v = name[:i], sc.Text()[strings.LastIndexByte(sc.Text(), ' ')+1:]
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] += f
		}
	}
	return out, sc.Err()
}

// startProfiles starts the profiles and the trace o asks for: this process's, or with runnerPprof (a runner
// process's /debug/pprof) the runner's trace.
func startProfiles(o options, runnerPprof string) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	if o.cpu != "" {
		f, err := os.Create(o.cpu)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	for _, p := range []struct {
		file, name string
		on, off    func()
	}{
		{o.block, "block", func() { runtime.SetBlockProfileRate(int(10 * time.Microsecond)) }, func() { runtime.SetBlockProfileRate(0) }},
		{o.mutex, "mutex", func() { runtime.SetMutexProfileFraction(5) }, func() { runtime.SetMutexProfileFraction(0) }},
	} {
		if p.file == "" {
			continue
		}
		p.on()
		stops = append(stops, func() {
			if err := writeProfile(p.name, p.file); err != nil {
				fmt.Fprintln(os.Stderr, "mixedbench:", err)
			}
			p.off()
		})
	}
	if o.trace != "" {
		f, err := os.Create(o.trace)
		if err != nil {
			return nil, err
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer f.Close()
			time.Sleep(5 * time.Second)
			if runnerPprof != "" {
				if err := runnerTrace(runnerPprof, o.traceFor, f); err != nil {
					fmt.Fprintln(os.Stderr, "mixedbench: trace:", err)
				}
				return
			}
			if err := trace.Start(f); err != nil {
				fmt.Fprintln(os.Stderr, "mixedbench: trace:", err)
				return
			}
			time.Sleep(o.traceFor)
			trace.Stop()
		}()
		stops = append(stops, func() { <-done })
	}
	return stop, nil
}

func writeProfile(name, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return errors.Join(pprof.Lookup(name).WriteTo(f, 0), f.Close())
}

// runtimeSample is what runtime/metrics says about the scheduler and the GC.
type runtimeSample struct {
	sched           *metrics.Float64Histogram
	gcCPU, totalCPU float64
}

func readMetrics() runtimeSample {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}}
	metrics.Read(s)
	return runtimeSample{sched: s[0].Value.Float64Histogram(), gcCPU: s[1].Value.Float64(), totalCPU: s[2].Value.Float64()}
}

func (s runtimeSample) gcShare(before runtimeSample) float64 {
	return (s.gcCPU - before.gcCPU) / (s.totalCPU - before.totalCPU)
}

// schedQuantile is the q quantile of the scheduler latencies observed since
// before (the upper bound of the bucket it falls in).
func (s runtimeSample) schedQuantile(before runtimeSample, q float64) float64 {
	counts := make([]uint64, len(s.sched.Counts))
	var total uint64
	for i, c := range s.sched.Counts {
		counts[i] = c - before.sched.Counts[i]
		total += counts[i]
	}
	if total == 0 {
		return math.NaN()
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= max(want, 1) {
			return s.sched.Buckets[i+1]
		}
	}
	return math.Inf(1)
}

// preProduce writes n demo envelopes padded to about size bytes, their payloads of kind, round-robin over the
// partitions, and returns the bytes produced.
func preProduce(brokers []string, n, size int, kind payload.Kind) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.MaxBufferedRecords(20_000))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	probe := demo.New(demo.Options{PayloadSize: 1})
	_, b := probe.NextBytes(topic)
	payloadSize := max(1, size-len(b))
	gen := demo.New(demo.Options{Seed: 1, IDPrefix: "bench", PayloadSize: payloadSize})
	r := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	var total int64
	var produceErr atomic.Pointer[error]
	for range n {
		// The demo's payloads are random bytes, a third of them marked encrypted: -payload random as it is.
		env := gen.Next(topic)
		if kind == payload.JSON {
			env.Payload.Value = kind.Make(r, payloadSize)
			env.Metadata.ContentType = "application/json"
			env.Security.Encryption = nil
		}
		v, err := proto.Marshal(env)
		if err != nil {
			return 0, err
		}
		total += int64(len(v))
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(env.GetMetadata().GetMessageId()), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				produceErr.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	if err := produceErr.Load(); err != nil {
		return 0, fmt.Errorf("produce: %w", *err)
	}
	return total, nil
}
