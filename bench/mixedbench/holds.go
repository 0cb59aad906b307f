package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"

	"github.com/prism-mesh/prism/bench/internal/tracestack"
)

// A hold is a lock held for writing as the goroutines it kept waiting saw it: from the first one's block on the
// lock to the unlock that woke them, with what the unlocking goroutine (the holder) did meanwhile. The hold
// began before its first waiter came, so its length is a lower bound.
type hold struct {
	from, to trace.Time
	site     string   // where the waiters blocked, e.g. badger/v4.(*DB).getMemTables
	waiters  int      // goroutines woken
	unlock   []string // the holder's stack at the unlock, innermost first
	// The holder's time in the window by state, and in the runtime's ranges.
	running, runnable, syscall, blocked time.Duration
	assist, sweep, gcMark, stw          time.Duration
	// syscalls are the holder's system calls over 1 ms in the window, with where.
	syscalls []string
	// samples are the holder's CPU samples in the window by innermost function (the trace has them when a CPU
	// profile ran beside it).
	samples map[string]int
}

// lockSites are the frames a lock waiter's stack must hold for its wait to count: Badger's DB lock, whose
// readers are every iterator and Get.
var lockSites = []string{"dgraph-io/badger/v4.(*DB)."}

// interval is a span of a goroutine's time in some state or range.
type interval struct {
	from, to trace.Time
	what     string // the state, or the range's name
	where    string // for a syscall or a wait: the innermost frames
}

type sample struct {
	at   trace.Time
	leaf string
}

// readHolds reads an execution trace and returns the write holds of the locks taken in functions named by sites
// (substrings) that kept goroutines waiting over minWait, longest first.
func readHolds(r io.Reader, minWait time.Duration, sites []string) ([]hold, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	type gor struct {
		state        trace.GoState
		since        trace.Time
		where, site  string
		ranges       map[string]trace.Time // open ranges by name
		intervals    []interval
		samples      []sample
		blockedSince trace.Time
	}
	type wake struct {
		g        trace.GoID
		from, to trace.Time
		site     string
		waker    trace.GoID
		stack    []string
	}
	var (
		gors   = map[trace.GoID]*gor{}
		procOn = map[trace.ProcID]trace.GoID{}
		global []interval // GC mark phases and stops of the world
		open   = map[string]trace.Time{}
		wakes  []wake
	)
	get := func(id trace.GoID) *gor {
		g := gors[id]
		if g == nil {
			g = &gor{ranges: map[string]trace.Time{}}
			gors[id] = g
		}
		return g
	}
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		t := ev.Time()
		switch ev.Kind() {
		case trace.EventStackSample:
			if id := ev.Goroutine(); id != trace.NoGoroutine {
				if fs := tracestack.Funcs(ev.Stack()); len(fs) > 0 {
					get(id).samples = append(get(id).samples, sample{t, shortName(fs[0])})
				}
			}
		case trace.EventRangeBegin, trace.EventRangeActive, trace.EventRangeEnd:
			rg := ev.Range()
			name := rg.Name
			if strings.HasPrefix(name, "stop-the-world") {
				name = "stop-the-world"
			}
			var g *gor
			switch rg.Scope.Kind {
			case trace.ResourceGoroutine:
				g = get(rg.Scope.Goroutine())
			case trace.ResourceProc:
				// A sweep is the work of the goroutine on the P (an allocation sweeping before it allocates).
				id, ok := procOn[rg.Scope.Proc()]
				if !ok {
					continue
				}
				g = get(id)
			}
			begin := ev.Kind() != trace.EventRangeEnd
			switch {
			case name == "stop-the-world" || rg.Scope.Kind == trace.ResourceNone:
				if begin {
					if _, ok := open[name]; !ok {
						open[name] = t
					}
				} else if s, ok := open[name]; ok {
					global = append(global, interval{from: s, to: t, what: name})
					delete(open, name)
				}
			case g != nil:
				if begin {
					if _, ok := g.ranges[name]; !ok {
						g.ranges[name] = t
					}
				} else if s, ok := g.ranges[name]; ok {
					g.intervals = append(g.intervals, interval{from: s, to: t, what: name})
					delete(g.ranges, name)
				}
			}
		case trace.EventStateTransition:
			st := ev.StateTransition()
			if st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			id := st.Resource.Goroutine()
			from, to := st.Goroutine()
			g := get(id)
			if g.state != trace.GoUndetermined || from != trace.GoUndetermined {
				g.intervals = append(g.intervals, interval{from: g.since, to: t, what: from.String(), where: g.where})
			}
			if from == trace.GoRunning {
				for p, on := range procOn {
					if on == id {
						delete(procOn, p)
					}
				}
			}
			fs := tracestack.Funcs(st.Stack)
			switch to {
			case trace.GoRunning:
				procOn[ev.Proc()] = id
			case trace.GoWaiting, trace.GoSyscall:
				g.where = strings.Join(inner(st.Stack, 3), " < ")
				g.site, g.blockedSince = lockSite(fs, sites), t
			}
			if from == trace.GoWaiting && to == trace.GoRunnable && g.site != "" && t.Sub(g.blockedSince) >= minWait {
				wakes = append(wakes, wake{g: id, from: g.blockedSince, to: t, site: g.site, waker: ev.Goroutine(), stack: inner(ev.Stack(), 6)})
			}
			if to != trace.GoWaiting && to != trace.GoSyscall {
				g.where, g.site = "", ""
			}
			g.state, g.since = to, t
		}
	}
	// The waiters one unlock woke are one hold: woken by the same goroutine, within 100 µs of each other or, when
	// the unlocker was preempted between two wakes, the later one already waiting when the earlier one woke.
	slices.SortFunc(wakes, func(a, b wake) int { return int(a.to - b.to) })
	var holds []hold
	var holders []trace.GoID
	for _, w := range wakes {
		if n := len(holds); n > 0 && holders[n-1] == w.waker && (w.to.Sub(holds[n-1].to) < 100*time.Microsecond || w.from < holds[n-1].to) {
			h := &holds[n-1]
			h.from, h.to, h.waiters = min(h.from, w.from), max(h.to, w.to), h.waiters+1
			continue
		}
		holds = append(holds, hold{from: w.from, to: w.to, site: w.site, waiters: 1, unlock: w.stack})
		holders = append(holders, w.waker)
	}
	for i := range holds {
		h := &holds[i]
		g := gors[holders[i]]
		if g == nil {
			continue
		}
		h.samples = map[string]int{}
		for _, iv := range g.intervals {
			d := overlap(h.from, h.to, iv.from, iv.to)
			if d <= 0 {
				continue
			}
			switch iv.what {
			case trace.GoRunning.String():
				h.running += d
			case trace.GoRunnable.String():
				h.runnable += d
			case trace.GoSyscall.String():
				h.syscall += d
				if d > time.Millisecond {
					h.syscalls = append(h.syscalls, fmt.Sprintf("%.1f ms in %s", ms(d), iv.where))
				}
			case trace.GoWaiting.String():
				h.blocked += d
			case "GC mark assist":
				h.assist += d
			case "GC incremental sweep":
				h.sweep += d
			}
		}
		for _, iv := range global {
			d := overlap(h.from, h.to, iv.from, iv.to)
			switch iv.what {
			case "stop-the-world":
				h.stw += d
			case "GC concurrent mark phase":
				h.gcMark += d
			}
		}
		for _, s := range g.samples {
			if s.at >= h.from && s.at <= h.to {
				h.samples[s.leaf]++
			}
		}
	}
	slices.SortFunc(holds, func(a, b hold) int { return int(b.to.Sub(b.from) - a.to.Sub(a.from)) })
	return holds, nil
}

// lockSite is the frame of a sites lock a blocked goroutine's stack (innermost first) waits in, "" if none: the
// first frame past the runtime's and sync's, if it is one of sites.
func lockSite(fs, sites []string) string {
	inSync := false
	for _, f := range fs {
		if strings.HasPrefix(f, "runtime.") || strings.HasPrefix(f, "internal/") {
			continue
		}
		if strings.HasPrefix(f, "sync.") {
			inSync = true
			continue
		}
		if !inSync {
			return ""
		}
		for _, s := range sites {
			if strings.Contains(f, s) {
				return shortName(f)
			}
		}
		return ""
	}
	return ""
}

func overlap(from, to, a, b trace.Time) time.Duration {
	lo, hi := max(from, a), min(to, b)
	if hi <= lo {
		return 0
	}
	return hi.Sub(lo)
}

// printHolds writes the holds: how many and their time, and the longest with what their holder did.
func printHolds(w io.Writer, holds []hold, longest int) {
	if len(holds) == 0 {
		fmt.Fprintln(w, "# runner trace: no goroutine waited on Badger's DB lock")
		return
	}
	var total time.Duration
	for _, h := range holds {
		total += h.to.Sub(h.from)
	}
	fmt.Fprintf(w, "# runner trace: %d holds of Badger's DB lock kept readers waiting, %.0f ms in all (from the first waiter to the unlock); the longest, with what the holder did meanwhile:\n", len(holds), ms(total))
	for _, h := range holds[:min(longest, len(holds))] {
		fmt.Fprintf(w, "#   %.2f ms, %d waiting in %s, unlocked in %s: holder running %.1f, runnable %.1f, in syscalls %.1f, blocked %.1f; GC mark assist %.1f, sweep %.1f; GC marking %.1f, world stopped %.1f",
			ms(h.to.Sub(h.from)), h.waiters, h.site, strings.Join(h.unlock, " < "), ms(h.running), ms(h.runnable), ms(h.syscall), ms(h.blocked), ms(h.assist), ms(h.sweep), ms(h.gcMark), ms(h.stw))
		if len(h.syscalls) > 0 {
			fmt.Fprintf(w, "; syscalls: %s", strings.Join(h.syscalls, ", "))
		}
		if len(h.samples) > 0 {
			leaves := slices.SortedFunc(maps.Keys(h.samples), func(a, b string) int { return h.samples[b] - h.samples[a] })
			var parts []string
			for _, l := range leaves[:min(4, len(leaves))] {
				parts = append(parts, fmt.Sprintf("%s %d", l, h.samples[l]))
			}
			fmt.Fprintf(w, "; CPU samples: %s", strings.Join(parts, ", "))
		}
		fmt.Fprintln(w)
	}
}
