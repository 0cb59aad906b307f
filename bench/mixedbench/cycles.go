package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"

	"github.com/prism-mesh/prism/bench/internal/tracestack"
)

// cycle is one request on an HTTP connection as the server's execution trace shows it: from the connection
// goroutine's wake after a network wait to its next network wait (reading the request, the handler, writing
// the answer, net/http's end of request). What happened before the wake (the packet's wait for the network
// poller, and for a thread to run it) and in the kernel (a thread waiting for a core while its goroutine
// "runs") is not in it.
type cycle struct {
	took, runnable, running, blocked time.Duration
	// waits are the cycle's waits over a millisecond: runnable (for a P) with what held the Ps when it became
	// runnable, or blocked with where, and which goroutine's action ended it.
	waits []string
}

// connGoroutine is the root function of the goroutine net/http serves a connection's requests on.
const connGoroutine = "net/http.(*conn).serve"

// readCycles reads an execution trace and returns its HTTP request cycles, sorted by length, and how long 0, 1,
// 2 ... goroutines were running at once (the Ps busy).
func readCycles(r io.Reader) ([]cycle, map[int]time.Duration, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, nil, fmt.Errorf("read trace: %w", err)
	}
	type gor struct {
		root, why, heldPs string
		since             trace.Time
		in                bool // in a request cycle
		cur               cycle
		started           trace.Time
	}
	var (
		gors    = map[trace.GoID]*gor{}
		onP     = map[trace.ProcID]trace.GoID{}
		atOnce  = map[int]time.Duration{}
		cycles  []cycle
		last    trace.Time
		started bool
	)
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read trace: %w", err)
		}
		t := ev.Time()
		if started {
			atOnce[len(onP)] += t.Sub(last)
		}
		last, started = t, true
		if ev.Kind() != trace.EventStateTransition || ev.StateTransition().Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		st := ev.StateTransition()
		id := st.Resource.Goroutine()
		from, to := st.Goroutine()
		g := gors[id]
		if g == nil {
			g = &gor{since: t}
			gors[id] = g
		}
		if fs := tracestack.Funcs(st.Stack); len(fs) > 0 {
			g.root = fs[len(fs)-1]
		}
		if d := t.Sub(g.since); g.in {
			switch from {
			case trace.GoRunnable:
				g.cur.runnable += d
				if d > time.Millisecond {
					g.cur.waits = append(g.cur.waits, fmt.Sprintf("runnable %.1f ms (on the Ps: %s)", ms(d), g.heldPs))
				}
			case trace.GoRunning:
				g.cur.running += d
			case trace.GoWaiting, trace.GoSyscall:
				g.cur.blocked += d
				if d > time.Millisecond {
					w := fmt.Sprintf("blocked %.1f ms %s", ms(d), g.why)
					if by := ev.Goroutine(); by != trace.NoGoroutine && by != id && gors[by] != nil {
						w += fmt.Sprintf(", woken by %s in %s", shortName(gors[by].root), strings.Join(inner(ev.Stack(), 3), " < "))
					}
					g.cur.waits = append(g.cur.waits, w)
				}
			}
		}
		if from == trace.GoRunning {
			for p, on := range onP {
				if on == id {
					delete(onP, p)
				}
			}
		}
		switch to {
		case trace.GoRunning:
			onP[ev.Proc()] = id
		case trace.GoRunnable:
			var held []string
			for _, on := range onP {
				if on != id && gors[on] != nil {
					held = append(held, shortName(gors[on].root))
				}
			}
			slices.Sort(held)
			g.heldPs = strings.Join(held, ", ")
		case trace.GoWaiting, trace.GoSyscall:
			g.why = "in " + strings.Join(inner(st.Stack, 4), " < ")
			if st.Reason != "" {
				g.why = "(" + st.Reason + ") " + g.why
			}
		}
		if strings.HasSuffix(g.root, connGoroutine) {
			switch {
			case !g.in && from == trace.GoWaiting && to == trace.GoRunnable:
				g.in, g.started, g.cur = true, t, cycle{}
			case g.in && to == trace.GoWaiting && st.Reason == "network":
				g.cur.took = t.Sub(g.started)
				cycles = append(cycles, g.cur)
				g.in = false
			}
		}
		g.since = t
	}
	// A request still being served when the trace stopped (its answer may already be with the client) counts up
	// to the trace's end.
	for _, g := range gors {
		if g.in && strings.HasSuffix(g.root, connGoroutine) {
			g.cur.took = last.Sub(g.started)
			cycles = append(cycles, g.cur)
		}
	}
	slices.SortFunc(cycles, func(a, b cycle) int { return int(a.took - b.took) })
	return cycles, atOnce, nil
}

// printCycles writes what readCycles found: the cycles' time by state and quantiles, the Ps busy, and the
// slowest cycles' waits.
func printCycles(w io.Writer, cycles []cycle, atOnce map[int]time.Duration, slowest int) {
	if len(cycles) == 0 {
		fmt.Fprintln(w, "# runner trace: no HTTP request cycle")
		return
	}
	var runnable, running, blocked, total time.Duration
	for _, c := range cycles {
		runnable += c.runnable
		running += c.running
		blocked += c.blocked
	}
	q := func(f float64) float64 { return ms(cycles[min(len(cycles)-1, int(f*float64(len(cycles))))].took) }
	fmt.Fprintf(w, "# runner trace: %d HTTP request cycles (wake to next network wait), runnable (waiting for a P) %.0f ms, running %.0f ms, blocked %.0f ms in all; p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
		len(cycles), ms(runnable), ms(running), ms(blocked), q(0.5), q(0.99), ms(cycles[len(cycles)-1].took))
	for _, d := range atOnce {
		total += d
	}
	var busy []string
	for n := 0; n <= slices.Max(slices.Collect(maps.Keys(atOnce))); n++ {
		busy = append(busy, fmt.Sprintf("%d: %.0f%%", n, 100*atOnce[n].Seconds()/total.Seconds()))
	}
	fmt.Fprintf(w, "# runner trace: goroutines running at once, share of the time: %s\n", strings.Join(busy, ", "))
	for _, c := range slices.Backward(cycles[max(0, len(cycles)-slowest):]) {
		fmt.Fprintf(w, "#   %.2f ms: runnable %.2f, running %.2f, blocked %.2f; %s\n", ms(c.took), ms(c.runnable), ms(c.running), ms(c.blocked), strings.Join(c.waits, "; "))
	}
}

// inner is a stack's n innermost frames outside the runtime, sync and internal packages.
func inner(s trace.Stack, n int) []string {
	var out []string
	for _, f := range tracestack.Funcs(s) {
		if len(out) == n {
			break
		}
		if !strings.HasPrefix(f, "runtime.") && !strings.HasPrefix(f, "internal/") {
			out = append(out, shortName(f))
		}
	}
	return out
}

func shortName(f string) string {
	return f[strings.LastIndex(f, "/")+1:]
}

// runnerTrace records an execution trace of the runner for d from its /debug/pprof, writes it to f, and prints
// the HTTP request cycles in it and the holds of Badger's DB lock that kept goroutines waiting. A CPU profile
// of the runner runs beside it, so the trace holds CPU samples (what a lock's holder ran); it is written to
// f's name plus ".cpu.pprof".
func runnerTrace(pprof string, d time.Duration, f *os.File) error {
	secs := max(1, int(d.Seconds()))
	profErr := make(chan error, 1)
	go func() { profErr <- fetchTo(fmt.Sprintf("%s/profile?seconds=%d", pprof, secs), f.Name()+".cpu.pprof") }()
	resp, err := http.Get(fmt.Sprintf("%s/trace?seconds=%d", pprof, secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/trace: %s", pprof, resp.Status)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		return fmt.Errorf("%s/trace: %w", pprof, err)
	}
	if err := <-profErr; err != nil {
		fmt.Fprintln(os.Stderr, "mixedbench: runner CPU profile:", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	cycles, atOnce, err := readCycles(f)
	if err != nil {
		return err
	}
	printCycles(os.Stderr, cycles, atOnce, 5)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	holds, err := readHolds(f, time.Millisecond, lockSites)
	if err != nil {
		return err
	}
	printHolds(os.Stderr, holds, 8)
	return nil
}

// fetchTo writes what a GET of url answers to the file name.
func fetchTo(url, name string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	out, err := os.Create(name)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, resp.Body)
	return errors.Join(err, out.Close())
}
