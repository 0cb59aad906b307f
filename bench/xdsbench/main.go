// Command xdsbench measures the xDS pipeline and prints
// BENCH <name> <value> <unit> lines:
//
//   - convergence: ControlPlane.Update with a proxy's runner at a new
//     address (what Follow does when the registration is applied) until a
//     grpc-go xDS client's query for a mailbox of that proxy is answered by
//     the new runner, p50/p99, at 10 and 1,000 proxies (two real runners);
//     beside it the admin's share, until a raw delta ADS client has the
//     new endpoints (xds.admin_push_*): the rest is grpc-go's. Lease
//     changes are not measured here: they are not in the
//     routing state and put nothing on the wire;
//   - push cost per runner move at 10 and 1,000 proxies: bytes sent to one
//     state-of-the-world and one delta ADS client, process CPU per change
//     with five raw clients (the admin's work: the clients only read
//     bytes); at 1,000 the translation of the whole state, which a runner
//     move does not cost (xds/cache patches it), and the admin heap.
//
// Then the figures at a million mailboxes (million.go): an admin FSM
// holding 1M leases on 1,000 proxies, built by applying commands straight
// to an fsm.FSM (through Raft it would take minutes), followed by the real
// pipeline with grpc-go's xDS client and a delta client connected: the ADS
// bytes per lease operation (xds.route_bytes_per_lease_change_1m), the
// largest response, the heap, a grant until its holder answers through
// grpc-go, a namespace moved until its new holder answers x-prism-namespace
// calls (beside grpc-go's RLS cache ages), and what route selection over
// 1,000 proxies' routes costs a grpc-go call (gateway.route_select_*).
//
// -cpuprofile writes a profile of the whole run. At 1,000 proxies most of
// it is grpc-go's client, not the admin: every EDS update hands its whole
// xDS config to each of the 1,000 cds children of the cluster manager,
// each child reports a new state, and each report rebuilds the cluster
// manager's picker over all 1,000 children and formats them into an
// Infof line that is built even when info logging is off (grpc-go v1.85,
// clustermanager's balancerStateAggregator.buildLocked): ~2,400 rebuilds
// per runner move, O(clusters²), hundreds of milliseconds to seconds.
//
// Everything runs in-process on 127.0.0.1; every loop is bounded in count
// and time.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/translator"
)

func main() {
	changes := flag.Int("changes", 100, "runner moves measured at 10 proxies")
	changes1k := flag.Int("changes-1k", 30, "runner moves measured at 1,000 proxies (each takes grpc-go's client seconds)")
	moves := flag.Bool("moves", true, "measure runner moves at 10 and 1,000 proxies")
	var mc millionConfig
	flag.IntVar(&mc.mailboxes, "mailboxes", 1_000_000, "mailboxes (namespaces, each leased) of the large state; 0 skips it")
	flag.IntVar(&mc.proxies, "proxies", 1000, "proxies of the large state")
	flag.IntVar(&mc.leaseOps, "lease-ops", 10_000, "lease operations whose xDS bytes are counted in the large state")
	flag.IntVar(&mc.samples, "samples", 500, "grants timed to served in the large state")
	flag.IntVar(&mc.aliasNamespaces, "alias-namespaces", 32, "namespaces moved per round (two rounds) in the large state")
	flag.IntVar(&mc.routeCalls, "route-calls", 5000, "calls per route timed for route selection in the large state")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	err := profiled(*cpuprofile, func() error {
		if *moves {
			if err := run(*changes, *changes1k); err != nil {
				return err
			}
		}
		if mc.mailboxes > 0 {
			return million(slog.New(slog.NewTextHandler(io.Discard, nil)), mc)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsbench:", err)
		os.Exit(1)
	}
}

// profiled runs f under a CPU profile written to path, if any.
func profiled(path string, f func() error) error {
	if path == "" {
		return f()
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer pprof.StopCPUProfile()
	return f()
}

func bench(name string, value float64, unit string) {
	fmt.Printf("BENCH %s %s %s\n", name, strconv.FormatFloat(math.Round(value*1000)/1000, 'f', -1, 64), unit)
}

func note(format string, args ...any) { fmt.Fprintf(os.Stderr, "# "+format+"\n", args...) }

func run(changes, changes1k int) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, size := range []struct {
		n      int
		label  string
		rounds int
	}{{10, "10_proxies", changes}, {1000, "1k_proxies", changes1k}} {
		c, err := convergence(log, size.n, size.rounds)
		if err != nil {
			return fmt.Errorf("convergence at %d: %w", size.n, err)
		}
		bench("xds.convergence_p50_ms_"+size.label, percentile(c.served, 0.50), "ms")
		bench("xds.convergence_p99_ms_"+size.label, percentile(c.served, 0.99), "ms")
		bench("xds.admin_push_p50_ms_"+size.label, percentile(c.pushed, 0.50), "ms")
		bench("xds.admin_push_p99_ms_"+size.label, percentile(c.pushed, 0.99), "ms")
	}
	for _, size := range []struct {
		n     int
		label string
	}{{10, "10_proxies"}, {1000, "1k_proxies"}} {
		if err := pushCost(log, size.n, size.label); err != nil {
			return fmt.Errorf("push cost at %d: %w", size.n, err)
		}
	}
	return nil
}

// samples are one size's convergence times, sorted, in milliseconds:
// pushed until a raw delta ADS client had the new endpoints (the admin's
// part), served until grpc-go's client routed to the new runner.
type samples struct{ pushed, served []float64 }

// convergence moves proxy 0's runner between two real runners, both
// holding its mailbox, and times the new endpoint reaching a raw delta
// client and becoming used by grpc-go's xDS client.
func convergence(log *slog.Logger, n, rounds int) (samples, error) {
	var out samples
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return out, err
	}
	defer cp.Close()
	mailbox := xdstest.MailboxID(0, n)
	runners := make([]*xdstest.Runner, 2)
	for i := range runners {
		if runners[i], err = xdstest.StartRunner(fmt.Sprintf("runner-%d", i)); err != nil {
			return out, err
		}
		defer runners[i].Close()
		runners[i].Hold(mailbox)
	}
	x := xdstest.MoveRunner(xdstest.Mesh(1, n, cp.Addr), 1, 0, runners[0].Addr)
	cp.Update(x)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	delta, err := xdstest.DialDelta(ctx, cp.Addr, fmt.Sprintf("bench-delta-%d", n))
	if err != nil {
		return out, err
	}
	defer delta.Close()
	eds := endpointVersions(delta)
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(cp.Addr, fmt.Sprintf("bench-%d", n)))
	if err != nil {
		return out, err
	}
	defer conn.Close()
	if _, err := await(conn, mailbox, runners[0].ID, 60*time.Second); err != nil {
		return out, fmt.Errorf("initial routes: %w", err)
	}
	if err := awaitVersion(eds, "1"); err != nil {
		return out, err
	}
	for round := range rounds {
		to := runners[(round+1)%2]
		x = xdstest.MoveRunner(x, x.Version+1, 0, to.Addr)
		start := time.Now()
		cp.Update(x)
		if err := awaitVersion(eds, strconv.FormatUint(x.Version, 10)); err != nil {
			return out, fmt.Errorf("round %d: %w", round, err)
		}
		out.pushed = append(out.pushed, ms(time.Since(start)))
		if _, err := await(conn, mailbox, to.ID, 30*time.Second); err != nil {
			return out, fmt.Errorf("round %d: %w", round, err)
		}
		out.served = append(out.served, ms(time.Since(start)))
	}
	slices.Sort(out.pushed)
	slices.Sort(out.served)
	note("convergence at %d proxies: %d runner moves, min %.2f ms, max %.2f ms (admin push min %.2f ms, max %.2f ms)",
		n, len(out.served), out.served[0], out.served[len(out.served)-1], out.pushed[0], out.pushed[len(out.pushed)-1])
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// endpointVersions reads c until it fails, handing on the version of every
// endpoints response.
func endpointVersions(c *xdstest.DeltaClient) <-chan string {
	out := make(chan string, 64)
	go func() {
		for {
			r, err := c.Next()
			if err != nil {
				return
			}
			if r.GetTypeUrl() == resource.EndpointType {
				out <- r.GetSystemVersionInfo()
			}
		}
	}()
	return out
}

// awaitVersion waits for endpoints at version on ch.
func awaitVersion(ch <-chan string, version string) error {
	timeout := time.After(60 * time.Second)
	for {
		select {
		case v := <-ch:
			if v == version {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("endpoints version %s not received", version)
		}
	}
}

// await queries until runner answers for mailbox.
func await(conn *grpc.ClientConn, mailbox, runner string, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	for tries := 1; ; tries++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := xdstest.WhoAnswers(ctx, conn, mailbox)
		cancel()
		if err == nil && got == runner {
			return tries, nil
		}
		if time.Now().After(deadline) {
			return tries, fmt.Errorf("%s still answered by %q (%v) after %v", mailbox, got, err, limit)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func percentile(sorted []float64, p float64) float64 {
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// pushCost measures runner moves at n proxies.
func pushCost(log *slog.Logger, n int, label string) error {
	const rounds = 10
	// The figures are the 1,000-proxy ones.
	at1k := n == 1000
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return err
	}
	defer cp.Close()
	x := xdstest.Mesh(1, n, cp.Addr)

	if at1k {
		// What every change other than a runner move costs (a proxy
		// joining or leaving, an admin node moving): O(proxies).
		start := time.Now()
		for range rounds {
			if _, err := translator.Translate(x); err != nil {
				return err
			}
		}
		bench("xds.translate_ms_1k_proxies", ms(time.Since(start))/rounds, "ms")
	}

	cp.Update(x)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sotw, err := xdstest.DialSotW(ctx, cp.Addr, "bench-sotw")
	if err != nil {
		return err
	}
	defer sotw.Close()
	delta, err := xdstest.DialDelta(ctx, cp.Addr, "bench-delta")
	if err != nil {
		return err
	}
	defer delta.Close()
	// Three more clients, as grpc-go gateways would be.
	for i := range 3 {
		c, err := xdstest.DialSotW(ctx, cp.Addr, fmt.Sprintf("bench-extra-%d", i))
		if err != nil {
			return err
		}
		defer c.Close()
		go drain(c)
	}
	sotwEDS := make(chan string, 64)
	go func() {
		for {
			r, err := sotw.Next()
			if err != nil {
				return
			}
			if r.GetTypeUrl() == resource.EndpointType {
				sotwEDS <- r.GetVersionInfo()
			}
		}
	}()
	deltaEDS := endpointVersions(delta)
	if err := both(sotwEDS, deltaEDS, "1"); err != nil {
		return err
	}

	if at1k {
		runtime.GC()
		var mem runtime.MemStats
		runtime.ReadMemStats(&mem)
		bench("xds.admin_heap_mb_1k_proxies_5clients", float64(mem.HeapInuse)/(1<<20), "MB")
	}

	before := map[string]float64{"sotw": bytesSent(cp.Registry, "sotw"), "delta": bytesSent(cp.Registry, "delta")}
	cpuBefore := cpuTime()
	for round := range rounds {
		x = xdstest.MoveRunner(x, x.Version+1, (round*7919)%n, fmt.Sprintf("127.0.1.%d:8982", round+1))
		cp.Update(x)
		if err := both(sotwEDS, deltaEDS, strconv.FormatUint(x.Version, 10)); err != nil {
			return err
		}
	}
	// Process CPU: the control plane's work, plus five raw clients that only
	// read the responses' bytes (they do not decode the resources).
	bench("xds.admin_cpu_ms_per_runner_move_"+label+"_5clients", ms(cpuTime()-cpuBefore)/rounds, "ms")
	// Metrics count every client; only the first SotW and the delta client
	// are the per-client figures, so the extra SotW clients are subtracted.
	sotwBytes := (bytesSent(cp.Registry, "sotw") - before["sotw"]) / 4 / rounds
	deltaBytes := (bytesSent(cp.Registry, "delta") - before["delta"]) / rounds
	suffix := "_" + label
	if at1k {
		suffix = "" // the xds.eds_bytes_per_runner_move
	}
	bench("xds.eds_bytes_per_runner_move_sotw"+suffix, sotwBytes, "bytes")
	bench("xds.eds_bytes_per_runner_move"+suffix, deltaBytes, "bytes")
	return nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func drain(c *xdstest.SotWClient) {
	for {
		if _, err := c.Next(); err != nil {
			return
		}
	}
}

// both waits until both clients have endpoints at version.
func both(a, b <-chan string, version string) error {
	timeout := time.After(60 * time.Second)
	for _, ch := range []<-chan string{a, b} {
		for done := false; !done; {
			select {
			case v := <-ch:
				done = v == version
			case <-timeout:
				return fmt.Errorf("endpoints version %s not received", version)
			}
		}
	}
	return nil
}

func bytesSent(reg *prometheus.Registry, protocol string) float64 {
	families, _ := reg.Gather()
	total := 0.0
	for _, f := range families {
		if f.GetName() != "prism_xds_push_bytes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "protocol" && l.GetValue() == protocol {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
