package main

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestSchedTimes(t *testing.T) {
	t.Parallel()
	spins := 0 // spin for 20 ms, so this process has run time to report
	for busy := time.Now().Add(20 * time.Millisecond); time.Now().Before(busy); {
		spins++
	}
	self := namedPID{"self", os.Getpid()}
	gone := namedPID{"gone", math.MaxInt32}
	before := schedTimes([]namedPID{self, gone})
	if spins == 0 || before.run[0] <= 0 || before.ready[0] < 0 {
		t.Errorf("this process: run %v s, ready %v s; want the time it just spun, and no negative wait", before.run[0], before.ready[0])
	}
	if !math.IsNaN(before.run[1]) || !math.IsNaN(before.ready[1]) {
		t.Errorf("a process that does not exist: run %v, ready %v; want NaN", before.run[1], before.ready[1])
	}
	after := schedTimes([]namedPID{self, gone})
	if got := after.since(before); !strings.HasPrefix(got, "self ") || !strings.Contains(got, "gone NaN / NaN") {
		t.Errorf("since = %q; want each process named with its figures, NaN for the one unreadable", got)
	}
}

func TestFreeAddrsAreDistinct(t *testing.T) {
	t.Parallel()
	for range 20 {
		addrs, err := freeAddrs(9)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, a := range addrs {
			if seen[a] || !strings.HasPrefix(a, "127.0.0.1:") {
				t.Fatalf("freeAddrs(9) = %v: want 9 distinct loopback addresses", addrs)
			}
			seen[a] = true
		}
		if len(seen) != 9 {
			t.Fatalf("freeAddrs(9) = %v: want 9", addrs)
		}
	}
}
