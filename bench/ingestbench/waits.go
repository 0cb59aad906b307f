package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/exp/trace"

	"github.com/prism-mesh/prism/bench/internal/tracestack"
)

// printWaits reads the execution trace at path and prints where the run's goroutines spent their time, in ms per
// second of trace, summed over the goroutines of a kind (named by their root function): running, runnable (ready,
// waiting for a P), in a syscall, and blocked, by reason and by the innermost frame outside the runtime and sync. It also
// prints how often 0, 1, 2 ... goroutines ran at once, and when Badger's write goroutine (one per write of
// requests, doWrites) was alive: what the store's single writer leaves idle is what ingest end to end can gain
// without making a write cheaper.
func printWaits(path string, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return fmt.Errorf("read trace %s: %w", path, err)
	}
	type gor struct {
		kind, state string
		since       trace.Time
	}
	type key struct{ kind, state string }
	var (
		gors               = map[trace.GoID]*gor{}
		spent              = map[key]time.Duration{}
		atOnce             = map[int]time.Duration{}
		running            int
		badger             = map[trace.GoID]bool{}
		badgerIdle         time.Duration
		first, last        trace.Time
		sawBadger, started bool
	)
	for {
		ev, err := r.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read trace %s: %w", path, err)
		}
		t := ev.Time()
		if !started {
			first, last, started = t, t, true
		}
		atOnce[running] += t.Sub(last)
		if sawBadger && len(badger) == 0 {
			badgerIdle += t.Sub(last)
		}
		last = t
		if ev.Kind() != trace.EventStateTransition || ev.StateTransition().Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		st := ev.StateTransition()
		id := st.Resource.Goroutine()
		from, to := st.Goroutine()
		g := gors[id]
		if g == nil || from == trace.GoNotExist {
			g = &gor{since: t}
			gors[id] = g
			// A new goroutine's first transitions may carry no stack: name Badger's writes by their creator.
			if creator := tracestack.Funcs(ev.Stack()); from == trace.GoNotExist && len(creator) > 0 && strings.HasSuffix(creator[0], ".(*DB).doWrites") {
				g.kind = badgerWrite
			}
		}
		if fs := tracestack.Funcs(st.Stack); len(fs) > 0 && g.kind != badgerWrite {
			g.kind = fs[len(fs)-1]
		}
		if g.state != "" {
			spent[key{g.kind, g.state}] += t.Sub(g.since)
		}
		if from == trace.GoRunning {
			running--
		}
		if to == trace.GoRunning {
			running++
		}
		if g.kind == badgerWrite {
			sawBadger = true
			if to == trace.GoNotExist {
				delete(badger, id)
			} else {
				badger[id] = true
			}
		}
		g.state, g.since = to.String(), t
		if to == trace.GoWaiting {
			g.state = "blocked (" + st.Reason + ") in " + innermost(st.Stack)
		}
	}
	total := last.Sub(first)
	perS := func(d time.Duration) float64 { return 1000 * d.Seconds() / total.Seconds() }
	fmt.Fprintf(w, "# trace of %v; goroutines running at once, share of the time:", total.Round(time.Millisecond))
	for n := 0; n <= 3; n++ {
		fmt.Fprintf(w, " %d: %.0f%%", n, 100*atOnce[n].Seconds()/total.Seconds())
	}
	fmt.Fprintln(w)
	if sawBadger {
		fmt.Fprintf(w, "# Badger's write goroutine absent (no write in progress) %.0f ms/s\n", perS(badgerIdle))
	}
	byKind := map[string]map[string]time.Duration{}
	for k, d := range spent {
		if byKind[k.kind] == nil {
			byKind[k.kind] = map[string]time.Duration{}
		}
		byKind[k.kind][k.state] += d
	}
	var kinds []string
	for k, states := range byKind {
		if states["Running"]+states["Syscall"] >= total/100 {
			kinds = append(kinds, k)
		}
	}
	sort.Slice(kinds, func(i, j int) bool { return byKind[kinds[i]]["Running"] > byKind[kinds[j]]["Running"] })
	fmt.Fprintln(w, "# goroutine kinds running 10 ms/s or more, ms per second of trace summed over their goroutines (blocked: the 5 longest, 20 ms/s or more):")
	for _, k := range kinds {
		states := byKind[k]
		fmt.Fprintf(w, "#   %s: running %.0f, runnable %.0f, syscall %.0f\n", shortName(k),
			perS(states["Running"]), perS(states["Runnable"]), perS(states["Syscall"]))
		var blocked []string
		for s := range states {
			// A goroutine blocked since before the trace has no reason: it tells nothing.
			if strings.HasPrefix(s, "blocked") && !strings.HasPrefix(s, "blocked ()") && perS(states[s]) >= 20 {
				blocked = append(blocked, s)
			}
		}
		sort.Slice(blocked, func(i, j int) bool { return states[blocked[i]] > states[blocked[j]] })
		for _, s := range blocked[:min(len(blocked), 5)] {
			fmt.Fprintf(w, "#       %6.0f  %s\n", perS(states[s]), s)
		}
	}
	return nil
}

const badgerWrite = "badger/v4.(*DB).doWrites: a write"

// innermost is the innermost frame outside the runtime and sync, where a goroutine blocked.
func innermost(s trace.Stack) string {
	for _, f := range tracestack.Funcs(s) {
		if !strings.HasPrefix(f, "runtime.") && !strings.HasPrefix(f, "sync.") && !strings.HasPrefix(f, "internal/") {
			return shortName(f)
		}
	}
	return "?"
}

func shortName(f string) string {
	for _, p := range []string{"github.com/prism-mesh/prism/", "github.com/dgraph-io/", "github.com/IBM/", "github.com/twmb/franz-go/pkg/"} {
		f = strings.TrimPrefix(f, p)
	}
	return f
}
