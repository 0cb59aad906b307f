// Command adminbench measures the admin cluster's lease operations against
// etcd and Redis on the same machine, at the same client concurrency, and the
// cluster's failover time and heartbeat scale. It prints BENCH lines.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

type options struct {
	prism, etcd, redis string
	concurrency        int
	phase              time.Duration
	maxOps             int
	acquirePool        int
	kills              int
	scaleLeases        int
	scaleFor           time.Duration
	scaleXDS           bool
	scaleOneConn       bool
	only               string
	security           string
	handshakes         int
	sessions           int
	sessionLeases      int
	sessionTTL         time.Duration
	sessionKeepAlive   time.Duration
	sessionFor         time.Duration
	sessionSetup       time.Duration
	sessionXDS         bool
	sessionAdminArgs   []string
	sessionProfile     string
	sessionGrace       time.Duration
	failoverLeases     int
	failoverKills      int
	failoverTrace      bool
	bulk               int
	bulkReps           int
	overloadBound      float64
	overloadFor        time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.prism, "prism", "", "prism binary (required)")
	flag.StringVar(&o.etcd, "etcd", "/usr/bin/etcd", "etcd binary; empty skips the baseline")
	flag.StringVar(&o.redis, "redis", "/usr/bin/redis-server", "redis-server binary; empty skips the baseline")
	flag.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients in the latency runs")
	flag.DurationVar(&o.phase, "phase", 3*time.Second, "length of each acquire/heartbeat/release phase")
	flag.IntVar(&o.maxOps, "max-ops", 200000, "bound on operations per phase")
	flag.IntVar(&o.acquirePool, "acquire-pool", 1024, "namespaces created per client worker for each latency round (one acquire each)")
	flag.IntVar(&o.kills, "kills", 20, "leader kills in the failover run")
	flag.IntVar(&o.scaleLeases, "scale-leases", 10000, "leases in the heartbeat scale run")
	flag.DurationVar(&o.scaleFor, "scale-for", 10*time.Second, "length of the heartbeat scale run")
	flag.BoolVar(&o.scaleXDS, "scale-xds", true, "serve xDS during the scale run, as a production admin node does")
	flag.BoolVar(&o.scaleOneConn, "scale-one-conn", false, "plaintext scale run only: every proxy's heartbeats on one connection to the leader, "+
		"the layout of adminbench before cf6fda3, to compare with binaries measured in it (BENCHMARKS.md)")
	flag.StringVar(&o.only, "only", "", "run one part: latency, failover, scale, handshake, sessions, failover-sessions, overload, etcd, redis")
	flag.StringVar(&o.security, "security", modeBoth, "prism admin over plaintext (--insecure), mtls (figures suffixed _mtls), or both: "+
		"every part in plaintext plus the 3-node latency, the scale run and the handshake over mutual TLS, with mtls/plaintext ratios")
	flag.IntVar(&o.handshakes, "handshakes", 200, "fresh connections timed per mode in the handshake run")
	// 30 x 1,000: creating the namespace of each lease slows sharply past
	// about 31k on the admin today (37k of 101k in 5 minutes), so 100k and
	// the 1M do not fit a run (BENCHMARKS.md).
	flag.IntVar(&o.sessions, "sessions", 30, "sessions (sidecars) in the sessions run; more than 250 share proxies, up to 4 each")
	flag.IntVar(&o.sessionLeases, "session-leases", 1000, "leases each session holds in the sessions run")
	flag.DurationVar(&o.sessionTTL, "session-ttl", 15*time.Second, "ttl of the sessions run's sessions (the sidecar's default)")
	flag.DurationVar(&o.sessionKeepAlive, "session-keepalive", 5*time.Second, "time between a session's keepalives (the sidecar's default)")
	flag.DurationVar(&o.sessionFor, "session-for", 20*time.Second, "length of the timed keepalive window of the sessions run")
	flag.DurationVar(&o.sessionSetup, "session-setup", 2*time.Minute, "bound on the sessions run's setup: namespaces, registrations, grants")
	flag.BoolVar(&o.sessionXDS, "session-xds", false, "serve xDS during the sessions run")
	flag.Func("session-admin-arg", "a flag for the sessions and failover-sessions runs' prism admin nodes (repeat for several)", func(v string) error {
		o.sessionAdminArgs = append(o.sessionAdminArgs, v)
		return nil
	})
	flag.StringVar(&o.sessionProfile, "session-profile", "", "write a CPU profile of the leader over the sessions run's timed window to this file (starts the nodes with --enable-pprof)")
	flag.DurationVar(&o.sessionGrace, "session-grace", 0, "lease grace of the sessions run's namespaces (config.lease.grace; 0: the admin's default, 5s); a session expires ttl + grace after its last keepalive")
	flag.IntVar(&o.failoverLeases, "failover-leases", 100000, "leases held (in sessions of 1,000) in the failover-sessions run")
	flag.IntVar(&o.failoverKills, "failover-kills", 5, "leader kills in the failover-sessions run (each waits ttl + grace after the kill to count the leases held)")
	flag.BoolVar(&o.failoverTrace, "failover-trace", false, "start the failover-sessions run's nodes at --log-level info and print each kill's phases from their logs "+
		"(heartbeat timeouts, election, barrier, promotion)")
	flag.IntVar(&o.bulk, "bulk", 1000, "mailboxes of the one AcquireLeases the bulk grant times")
	flag.IntVar(&o.bulkReps, "bulk-reps", 10, "repetitions of the bulk grant")
	flag.Float64Var(&o.overloadBound, "overload-bound", 1000, "--max-renewals-per-second of the overload run's 3x admins (overload.go says why)")
	flag.DurationVar(&o.overloadFor, "overload-for", 30*time.Second, "length of the overload run's 3x load")
	flag.Parse()
	if o.prism == "" {
		log.Fatal("adminbench: -prism is required")
	}
	mtlsModes, err := modes(o.security)
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "adminbench-")
	if err != nil {
		log.Fatal(err)
	}
	runParts(o, dir, mtlsModes)
	_ = os.RemoveAll(dir)
}

// runParts runs the parts -only selects, each reporting its own failure.
func runParts(o options, dir string, mtlsModes []bool) {
	// One CA for the run, made when a part first runs over mTLS.
	var ca *certs
	certsFor := func(mtls bool) (*certs, error) {
		if !mtls {
			return nil, nil
		}
		if ca == nil {
			var err error
			if ca, err = newCerts(filepath.Join(dir, "pki")); err != nil {
				return nil, err
			}
		}
		return ca, nil
	}
	ctx := context.Background()
	run := func(part string, f func() error) {
		if o.only != "" && o.only != part {
			return
		}
		if err := f(); err != nil {
			log.Printf("adminbench %s: %v", part, err)
		}
	}
	run("latency", func() error {
		// acquire3 is the 3-node acquire p99 through the leader, per mode.
		var acquire3 [2]time.Duration
		for _, mtls := range mtlsModes {
			cs, err := certsFor(mtls)
			if err != nil {
				return err
			}
			sizes := []int{1, 3}
			if o.security == modeBoth && mtls {
				sizes = []int{3}
			}
			for _, size := range sizes {
				p99, err := prismLatency(ctx, o, filepath.Join(dir, fmt.Sprintf("lat%d%s", size, tlsSuffix(mtls))), size, cs)
				if err != nil {
					return err
				}
				if size == 3 {
					acquire3[b2i(mtls)] = p99
				}
			}
		}
		ratio("admin.acquire_p99_mtls_ratio", acquire3[0], acquire3[1])
		return nil
	})
	run("etcd", func() error { return etcdLatency(ctx, o, filepath.Join(dir, "etcd")) })
	run("redis", func() error { return redisLatency(ctx, o, filepath.Join(dir, "redis")) })
	run("failover", func() error {
		// Failover is one figure per run: over mTLS only when that is all
		// the run measures.
		cs, err := certsFor(o.security == modeMTLS)
		if err != nil {
			return err
		}
		return failover(ctx, o, filepath.Join(dir, "failover"), cs)
	})
	run("scale", func() error {
		var p99 [2]time.Duration
		for _, mtls := range mtlsModes {
			cs, err := certsFor(mtls)
			if err != nil {
				return err
			}
			if p99[b2i(mtls)], err = scale(ctx, o, filepath.Join(dir, "scale"+tlsSuffix(mtls)), cs); err != nil {
				return err
			}
		}
		ratio("admin.heartbeat_p99_10k_mtls_ratio", p99[0], p99[1])
		return nil
	})
	run("handshake", func() error { return handshake(ctx, o, filepath.Join(dir, "handshake"), mtlsModes, certsFor) })
	run("sessions", func() error {
		// Sidecars reach the admin over mTLS, one identity per proxy: the
		// sessions run is over mTLS unless the run is plaintext only. Its
		// figures carry no suffix, as the issue names them.
		cs, err := certsFor(o.security != modePlaintext)
		if err != nil {
			return err
		}
		return sessionsBench(ctx, o, filepath.Join(dir, "sessions"), cs)
	})
	run("failover-sessions", func() error {
		// Over mTLS like the sessions run: sidecars' identities.
		cs, err := certsFor(o.security != modePlaintext)
		if err != nil {
			return err
		}
		return failoverSessions(ctx, o, filepath.Join(dir, "failover-sessions"), cs)
	})
	run("overload", func() error {
		// Over mTLS like the sessions run: sidecars' identities.
		cs, err := certsFor(o.security != modePlaintext)
		if err != nil {
			return err
		}
		return overloadBench(ctx, o, filepath.Join(dir, "overload"), cs)
	})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func bench(name string, v float64, unit string) {
	fmt.Printf("BENCH %s %.3f %s\n", name, v, unit)
}

// recorder collects latencies from many goroutines.
type recorder struct {
	mu   sync.Mutex
	lat  []time.Duration
	errs atomic.Int64
}

func (r *recorder) add(d time.Duration) {
	r.mu.Lock()
	r.lat = append(r.lat, d)
	r.mu.Unlock()
}

func (r *recorder) pct(p float64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lat) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), r.lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return s[i]
}

func (r *recorder) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// phase runs op(worker, i) from `concurrency` workers until the phase time,
// maxOps, or the worker's own items run out (op returns false).
func phase(o options, op func(worker, i int) (ok, more bool)) (*recorder, float64) {
	r := &recorder{}
	deadline := time.Now().Add(o.phase)
	var issued atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline) && issued.Add(1) <= int64(o.maxOps); i++ {
				t0 := time.Now()
				ok, more := op(w, i)
				if ok {
					r.add(time.Since(t0))
				} else {
					r.errs.Add(1)
				}
				if !more {
					return
				}
			}
		}()
	}
	wg.Wait()
	return r, float64(r.n()) / time.Since(start).Seconds()
}

// report prints p50, p99 and ops/s of one phase under prefix_<metric><suffix>.
func report(prefix, op, suffix string, r *recorder, rate float64) {
	bench(fmt.Sprintf("%s.%s_p50_ms%s", prefix, op, suffix), ms(r.pct(0.50)), "ms")
	bench(fmt.Sprintf("%s.%s_p99_ms%s", prefix, op, suffix), ms(r.pct(0.99)), "ms")
	bench(fmt.Sprintf("%s.%s_ops_per_s%s", prefix, op, suffix), rate, "ops/s")
	if e := r.errs.Load(); e > 0 {
		fmt.Fprintf(os.Stderr, "# %s.%s%s: %d failed operations\n", prefix, op, suffix, e)
	}
}
