package server

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The gate lets max renewals through at once; the rest are served oldest
// first while the oldest is younger than lifoAfter and newest first after,
// and one whose caller gives up leaves the queue without taking a turn.
func TestRenewalGateOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		age   time.Duration // how long the waiters have waited when a turn frees
		order []int         // waiters in the order they get a turn
	}{
		{"young queue: oldest first", 50 * time.Millisecond, []int{0, 2, 3}},
		{"stale queue: newest first", 2 * time.Second, []int{3, 2, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			g := newRenewalGate(Admission{MaxRenewalsInFlight: 1, ShedAfterRenewalWait: time.Second}, clk)
			c := ctx(t)
			first, err := g.enter(c, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			type turn struct {
				i     int
				leave func()
			}
			turns := make(chan turn, 4)
			gaveUp := make(chan error, 1)
			cancels := make([]context.CancelFunc, 4)
			for i := range 4 {
				wc, cancel := context.WithCancel(c)
				cancels[i] = cancel
				go func() {
					leave, err := g.enter(wc, clk.Now())
					if err != nil {
						gaveUp <- err
						return
					}
					turns <- turn{i, leave}
				}()
				awaitState(t, "the renewal to wait", func() bool { _, n := g.oldestWait(clk.Now()); return n == i+1 })
				clk.Step(time.Millisecond)
			}
			cancels[1]()
			if err := <-gaveUp; !errors.Is(err, context.Canceled) {
				t.Fatalf("a waiter that gave up: %v", err)
			}
			if _, n := g.oldestWait(clk.Now()); n != 3 {
				t.Fatalf("%d waiting after one gave up, want 3", n)
			}
			clk.Step(tc.age)
			if d, _ := g.oldestWait(clk.Now()); d != tc.age+4*time.Millisecond {
				t.Fatalf("oldest waited %s, want %s", d, tc.age+4*time.Millisecond)
			}
			first()
			first() // a second leave is a no-op: one turn is handed on
			for _, want := range tc.order {
				tr := <-turns
				if tr.i != want {
					t.Fatalf("turn went to waiter %d, want %d", tr.i, want)
				}
				select {
				case tr := <-turns:
					t.Fatalf("waiter %d got a turn while %d held the only one", tr.i, want)
				default:
				}
				tr.leave()
			}
			if d, n := g.oldestWait(clk.Now()); n != 0 || d != 0 {
				t.Fatalf("%d still waiting (oldest %s)", n, d)
			}
			for _, cancel := range cancels {
				cancel()
			}
		})
	}
}

// MaxRenewalsPerSecond paces the renewals let through.
func TestRenewalGateRate(t *testing.T) {
	t.Parallel()
	g := newRenewalGate(Admission{MaxRenewalsInFlight: 64, MaxRenewalsPerSecond: 100, ShedAfterRenewalWait: time.Second}, clocktesting.NewFakeClock(time.Now()))
	c := ctx(t)
	start := time.Now()
	for range 21 {
		leave, err := g.enter(c, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		leave()
	}
	// A burst of one, then one every 10 ms.
	if took := time.Since(start); took < 190*time.Millisecond {
		t.Fatalf("21 renewals at 100/s took %s, want >= 200 ms", took)
	}
	// A caller whose deadline comes before its turn at the rate hears its
	// deadline (not a refusal of the gate's own), and gives the turn back.
	for range 100 {
		dc, cancel := context.WithTimeout(c, time.Millisecond)
		leave, err := g.enter(dc, time.Now())
		cancel()
		if err == nil {
			leave()
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a renewal past its deadline at the rate: %v, want DeadlineExceeded", err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy != 0 {
		t.Fatalf("%d turns still taken", g.busy)
	}
}
