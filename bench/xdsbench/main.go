// Command xdsbench measures the xDS pipeline (issue 4) and prints
// BENCH <name> <value> <unit> lines:
//
//   - convergence: ControlPlane.Update with a proxy's runner at a new
//     address (what Follow does when the registration is applied) until a
//     grpc-go xDS client's query for a mailbox of that proxy is answered by
//     the new runner, p50/p99, at 10 and 1,000 proxies (two real runners).
//     Lease changes are not measured here: since issue 13 they are not in
//     the routing state and put nothing on the wire;
//   - push cost per runner move at 1,000 proxies: translation time (from
//     scratch, which every change costs), bytes sent to one
//     state-of-the-world and one delta ADS client, process CPU per change;
//   - admin heap holding 1,000 proxies with 5 connected clients.
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
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/xds/translator"
	"github.com/prism-mesh/prism/xds/xdstest"
)

func main() {
	changes := flag.Int("changes", 100, "runner moves measured per size")
	flag.Parse()
	if err := run(*changes); err != nil {
		fmt.Fprintln(os.Stderr, "xdsbench:", err)
		os.Exit(1)
	}
}

func bench(name string, value float64, unit string) {
	fmt.Printf("BENCH %s %s %s\n", name, strconv.FormatFloat(math.Round(value*1000)/1000, 'f', -1, 64), unit)
}

func note(format string, args ...any) { fmt.Fprintf(os.Stderr, "# "+format+"\n", args...) }

func run(changes int) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, size := range []struct {
		n      int
		label  string
		rounds int
	}{{10, "10_proxies", changes}, {1000, "1k_proxies", changes}} {
		p50, p99, err := convergence(log, size.n, size.rounds)
		if err != nil {
			return fmt.Errorf("convergence at %d: %w", size.n, err)
		}
		bench("xds.convergence_p50_ms_"+size.label, p50, "ms")
		bench("xds.convergence_p99_ms_"+size.label, p99, "ms")
	}
	return pushCost(log)
}

// convergence moves proxy 0's runner between two real runners, both
// holding its mailbox, and times the new endpoint becoming used by
// grpc-go's xDS client.
func convergence(log *slog.Logger, n, rounds int) (p50, p99 float64, err error) {
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return 0, 0, err
	}
	defer cp.Close()
	mailbox := xdstest.MailboxID(0, n)
	runners := make([]*xdstest.Runner, 2)
	for i := range runners {
		if runners[i], err = xdstest.StartRunner(fmt.Sprintf("runner-%d", i)); err != nil {
			return 0, 0, err
		}
		defer runners[i].Close()
		runners[i].Hold(mailbox)
	}
	x := xdstest.MoveRunner(xdstest.Mesh(1, n, cp.Addr), 1, 0, runners[0].Addr)
	cp.Update(x)
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(cp.Addr, fmt.Sprintf("bench-%d", n)))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if _, err := await(conn, mailbox, runners[0].ID, 60*time.Second); err != nil {
		return 0, 0, fmt.Errorf("initial routes: %w", err)
	}
	var samples []float64
	for round := range rounds {
		to := runners[(round+1)%2]
		x = xdstest.MoveRunner(x, x.Version+1, 0, to.Addr)
		start := time.Now()
		cp.Update(x)
		if _, err := await(conn, mailbox, to.ID, 30*time.Second); err != nil {
			return 0, 0, fmt.Errorf("round %d: %w", round, err)
		}
		samples = append(samples, float64(time.Since(start).Microseconds())/1000)
	}
	slices.Sort(samples)
	note("convergence at %d proxies: %d runner moves, min %.2f ms, max %.2f ms", n, len(samples), samples[0], samples[len(samples)-1])
	return percentile(samples, 0.50), percentile(samples, 0.99), nil
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

// pushCost measures one runner move at 1,000 proxies.
func pushCost(log *slog.Logger) error {
	const n, rounds = 1000, 10
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return err
	}
	defer cp.Close()
	x := xdstest.Mesh(1, n, cp.Addr)

	// Every change translates the whole state: it is O(proxies).
	start := time.Now()
	for range rounds {
		if _, err := translator.Translate(x); err != nil {
			return err
		}
	}
	bench("xds.translate_ms_1k_proxies", float64(time.Since(start).Microseconds())/1000/rounds, "ms")

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
	sotwEDS, deltaEDS := make(chan string, 64), make(chan string, 64)
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
	go func() {
		for {
			r, err := delta.Next()
			if err != nil {
				return
			}
			if r.GetTypeUrl() == resource.EndpointType {
				deltaEDS <- r.GetSystemVersionInfo()
			}
		}
	}()
	if err := both(sotwEDS, deltaEDS, "1"); err != nil {
		return err
	}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	bench("xds.admin_heap_mb_1k_proxies_5clients", float64(ms.HeapInuse)/(1<<20), "MB")

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
	bench("xds.admin_cpu_ms_per_runner_move_1k_proxies_5clients", float64((cpuTime()-cpuBefore).Microseconds())/1000/rounds, "ms")
	// Metrics count every client; only the first SotW and the delta client
	// are the per-client figures, so the extra SotW clients are subtracted.
	sotwBytes := (bytesSent(cp.Registry, "sotw") - before["sotw"]) / 4 / rounds
	deltaBytes := (bytesSent(cp.Registry, "delta") - before["delta"]) / rounds
	bench("xds.eds_bytes_per_runner_move_sotw", sotwBytes, "bytes")
	bench("xds.eds_bytes_per_runner_move", deltaBytes, "bytes")
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
func both(a, b chan string, version string) error {
	timeout := time.After(60 * time.Second)
	for _, ch := range []chan string{a, b} {
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
