package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/lease"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"
)

// The gate lets max renewals through at once; the rest are served in
// arrival order while the oldest is younger than staleAfter, and after that
// by urgency: the session whose expiry is nearest first, with its newest
// waiter, its urgency then moving to that arrival + ttl. One whose caller
// gives up leaves the queue without taking a turn.
func TestRenewalGateOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		age   time.Duration // how long the waiters have waited when a turn frees
		order []int         // waiters in the order they get a turn
	}{
		{"young queue: oldest first", 50 * time.Millisecond, []int{0, 1, 2, 3}},
		// Session 2 is due first: its newest (2), then, its urgency moved
		// 10 s on, session 3's (3), session 1's (0), session 2's older (1).
		{"stale queue: most urgent first", 2 * time.Second, []int{2, 3, 0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clk := clocktesting.NewFakeClock(t0)
			l := lease.New(lease.Config{Clock: clk})
			for id, in := range map[uint64]time.Duration{1: 10 * time.Second, 2: 2 * time.Second, 3: 5 * time.Second, 4: time.Second} {
				l.SessionOpened(&adminv1.Session{Id: id, ProxyId: "p", Ttl: durationpb.New(10 * time.Second), ExpiresAt: timestamppb.New(t0.Add(in))})
			}
			g := newRenewalGate(Admission{MaxRenewalsInFlight: 1, ShedAfterRenewalWait: time.Second}, clk)
			c := ctx(t)
			first, err := g.enter(c, l.ReceiveKeepAlive(1))
			if err != nil {
				t.Fatal(err)
			}
			type turn struct {
				i     int
				leave func()
			}
			turns := make(chan turn, 5)
			gaveUp := make(chan error, 1)
			giveUp, cancel := context.WithCancel(c)
			for i, id := range []uint64{1, 2, 2, 3, 4} {
				wc := c
				if id == 4 {
					wc = giveUp
				}
				go func() {
					leave, err := g.enter(wc, l.ReceiveKeepAlive(id))
					if err != nil {
						gaveUp <- err
						return
					}
					turns <- turn{i, leave}
				}()
				awaitState(t, "the renewal to wait", func() bool { _, n := g.oldestWait(clk.Now()); return n == i+1 })
				clk.Step(time.Millisecond)
			}
			cancel()
			if err := <-gaveUp; !errors.Is(err, context.Canceled) {
				t.Fatalf("a waiter that gave up: %v", err)
			}
			if _, n := g.oldestWait(clk.Now()); n != 4 {
				t.Fatalf("%d waiting after one gave up, want 4", n)
			}
			clk.Step(tc.age)
			if d, _ := g.oldestWait(clk.Now()); d != tc.age+5*time.Millisecond {
				t.Fatalf("oldest waited %s, want %s", d, tc.age+5*time.Millisecond)
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
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.waiting.Len() != 0 || len(g.keys) != 0 || g.urgent.Len() != 0 || g.busy != 0 {
				t.Fatalf("left behind: %d waiting, %d keys, %d urgent, %d busy", g.waiting.Len(), len(g.keys), g.urgent.Len(), g.busy)
			}
		})
	}
}

// MaxRenewalsPerSecond paces the renewals let through.
func TestRenewalGateRate(t *testing.T) {
	t.Parallel()
	g := newRenewalGate(Admission{MaxRenewalsInFlight: 64, MaxRenewalsPerSecond: 100, ShedAfterRenewalWait: time.Second}, clocktesting.NewFakeClock(time.Now()))
	l := lease.New(lease.Config{})
	c := ctx(t)
	start := time.Now()
	for range 21 {
		leave, err := g.enter(c, l.ReceiveHeartbeat("a@p"))
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
		leave, err := g.enter(dc, l.ReceiveHeartbeat("a@p"))
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
