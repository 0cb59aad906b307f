// Command xdsbench measures the xDS pipeline (issue 4) and prints
// BENCH <name> <value> <unit> lines:
//
//   - convergence: ControlPlane.Update with a moved lease (what Follow does
//     when the lease commit is applied) until a grpc-go xDS client's query
//     for the mailbox is answered by the new owner, p50/p99, at 10, 1,000 and
//     10,000 mailboxes (two real runners);
//   - push cost per lease change at 10,000 mailboxes: translation time (from
//     scratch and per change), bytes sent to one state-of-the-world and one
//     delta ADS client, process CPU per change;
//   - admin heap holding 10,000 mailboxes with 5 connected clients.
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
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/xds/translator"
	"github.com/prism-mesh/prism/xds/xdstest"
)

func main() {
	changes := flag.Int("changes", 100, "lease changes measured per size below 10,000")
	changes10k := flag.Int("changes-10k", 30, "lease changes measured at 10,000 mailboxes")
	flag.Parse()
	if err := run(*changes, *changes10k); err != nil {
		fmt.Fprintln(os.Stderr, "xdsbench:", err)
		os.Exit(1)
	}
}

func bench(name string, value float64, unit string) {
	fmt.Printf("BENCH %s %s %s\n", name, strconv.FormatFloat(math.Round(value*1000)/1000, 'f', -1, 64), unit)
}

func note(format string, args ...any) { fmt.Fprintf(os.Stderr, "# "+format+"\n", args...) }

func run(changes, changes10k int) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, size := range []struct {
		n      int
		label  string
		rounds int
	}{{10, "10", changes}, {1000, "1k", changes}, {10000, "10k", changes10k}} {
		p50, p99, err := convergence(log, size.n, size.rounds)
		if err != nil {
			return fmt.Errorf("convergence at %d: %w", size.n, err)
		}
		bench("xds.convergence_p50_ms_"+size.label, p50, "ms")
		bench("xds.convergence_p99_ms_"+size.label, p99, "ms")
	}
	return pushCost(log)
}

// convergence moves one lease per round between two real runners and times
// the route becoming usable by grpc-go's xDS client.
func convergence(log *slog.Logger, n, rounds int) (p50, p99 float64, err error) {
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return 0, 0, err
	}
	defer cp.Close()
	runners := make([]*xdstest.Runner, 2)
	for i := range runners {
		if runners[i], err = xdstest.StartRunner(xdstest.RunnerID(i)); err != nil {
			return 0, 0, err
		}
		defer runners[i].Close()
	}
	x := xdstest.Mesh(1, 2, n, cp.Addr)
	for i, r := range runners {
		x.Runners[i].Address = r.Addr
	}
	cp.Update(x)
	conn, err := xdstest.DialMailboxQuery(xdstest.Bootstrap(cp.Addr, fmt.Sprintf("bench-%d", n)))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if _, err := await(conn, x.Mailboxes[0].ID, x.Mailboxes[0].RunnerID, 60*time.Second); err != nil {
		return 0, 0, fmt.Errorf("initial routes: %w", err)
	}
	var samples []float64
	for round := range rounds {
		i := (round * 7919) % n
		to := xdstest.RunnerID(1)
		if x.Mailboxes[i].RunnerID == to {
			to = xdstest.RunnerID(0)
		}
		x = xdstest.MoveLease(x, x.Version+1, i, to)
		start := time.Now()
		cp.Update(x)
		if _, err := await(conn, x.Mailboxes[i].ID, to, 30*time.Second); err != nil {
			return 0, 0, fmt.Errorf("round %d: %w", round, err)
		}
		samples = append(samples, float64(time.Since(start).Microseconds())/1000)
	}
	slices.Sort(samples)
	note("convergence at %d mailboxes: %d lease moves, min %.2f ms, max %.2f ms", n, len(samples), samples[0], samples[len(samples)-1])
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

// pushCost measures one lease change at 10,000 mailboxes.
func pushCost(log *slog.Logger) error {
	const n, runners, rounds = 10000, 20, 10
	cp, err := xdstest.StartControlPlane(log, 0)
	if err != nil {
		return err
	}
	defer cp.Close()
	x := xdstest.Mesh(1, runners, n, cp.Addr)

	// From scratch (a new admin node), then per lease change as the updater
	// translates: unchanged routes are remembered.
	tr := translator.New()
	start := time.Now()
	if _, err := tr.Translate(x); err != nil {
		return err
	}
	bench("xds.translate_full_ms_10k", float64(time.Since(start).Microseconds())/1000, "ms")
	var translate time.Duration
	y := x
	for round := range rounds {
		y = xdstest.MoveLease(y, y.Version+1, (round*7919)%n, xdstest.RunnerID((round+3)%runners))
		start := time.Now()
		if _, err := tr.Translate(y); err != nil {
			return err
		}
		translate += time.Since(start)
	}
	bench("xds.translate_ms_per_change_10k", float64(translate.Microseconds())/1000/rounds, "ms")

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
	sotwRoutes, deltaRoutes := make(chan string, 64), make(chan string, 64)
	go func() {
		for {
			r, err := sotw.Next()
			if err != nil {
				return
			}
			if r.GetTypeUrl() == resource.RouteType {
				sotwRoutes <- r.GetVersionInfo()
			}
		}
	}()
	go func() {
		for {
			r, err := delta.Next()
			if err != nil {
				return
			}
			if r.GetTypeUrl() == resource.RouteType {
				deltaRoutes <- r.GetSystemVersionInfo()
			}
		}
	}()
	if err := both(sotwRoutes, deltaRoutes, "1"); err != nil {
		return err
	}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	bench("xds.admin_heap_mb_10k_5clients", float64(ms.HeapInuse)/(1<<20), "MB")

	before := map[string]float64{"sotw": bytesSent(cp.Registry, "sotw"), "delta": bytesSent(cp.Registry, "delta")}
	cpuBefore := cpuTime()
	for round := range rounds {
		i := (round * 7919) % n
		x = xdstest.MoveLease(x, x.Version+1, i, xdstest.RunnerID((round+1)%runners))
		cp.Update(x)
		if err := both(sotwRoutes, deltaRoutes, strconv.FormatUint(x.Version, 10)); err != nil {
			return err
		}
	}
	// Process CPU: the control plane's work, plus five raw clients that only
	// read the responses' bytes (they do not decode the resources).
	bench("xds.admin_cpu_ms_per_change_10k_5clients", float64((cpuTime()-cpuBefore).Microseconds())/1000/rounds, "ms")
	// Metrics count every client; only the first SotW and the delta client
	// are the per-client figures, so the extra SotW clients are subtracted.
	sotwBytes := (bytesSent(cp.Registry, "sotw") - before["sotw"]) / 4 / rounds
	deltaBytes := (bytesSent(cp.Registry, "delta") - before["delta"]) / rounds
	bench("xds.sotw_bytes_per_change_10k", sotwBytes, "bytes")
	bench("xds.delta_bytes_per_change_10k", deltaBytes, "bytes")
	res, err := translator.Translate(x)
	if err != nil {
		return err
	}
	note("route table at %d mailboxes: %d bytes, one resource; it dominates both figures", n, sizeOf(res))
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

// both waits until both clients have the route table at version.
func both(a, b chan string, version string) error {
	timeout := time.After(60 * time.Second)
	for _, ch := range []chan string{a, b} {
		for done := false; !done; {
			select {
			case v := <-ch:
				done = v == version
			case <-timeout:
				return fmt.Errorf("route table version %s not received", version)
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

func sizeOf(res *translator.Resources) int { return proto.Size(res.Routes[0]) }
