package control

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// While stores open and consumers start or stop, the stats of the whole
// runner (the sidecar's probe, bounded by a timeout) and readiness answer
// at once with the state from before each slow call, instead of waiting
// for it: a runner opening hundreds of stores is busy, not dead.
func TestStatsDoNotWaitForSlowCalls(t *testing.T) {
	t.Parallel()
	s, h, _ := newServer(t)
	ctx := context.Background()
	for _, id := range []string{"active@p", "activating@p", "draining@p"} {
		if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"active@p", "draining@p"} {
		if _, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: id, Epoch: 1, ValidFor: vf}); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	h.mu.Lock()
	h.gates = map[string]chan struct{}{"prepare opening@p": release, "open activating@p 2": release, "drain draining@p": release}
	h.mu.Unlock()
	calls := make(chan error, 3)
	go func() {
		_, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "opening@p", Config: cfg})
		calls <- err
	}()
	go func() {
		_, err := s.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "activating@p", Epoch: 2, ValidFor: vf})
		calls <- err
	}()
	go func() {
		_, err := s.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{"draining@p"}})
		calls <- err
	}()
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range []string{"opening@p", "activating@p", "draining@p"} {
			if e, ok := s.mailboxes[id]; !ok || !e.pub.Load().busy {
				return false
			}
		}
		return true
	})

	type answer struct {
		resp *runnerv1.GetStatsResponse
		err  error
	}
	stats := make(chan answer, 1)
	go func() {
		resp, err := s.GetStats(ctx, &runnerv1.GetStatsRequest{})
		stats <- answer{resp, err}
	}()
	var got answer
	select {
	case got = <-stats:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("GetStats waited for the slow calls")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	want := map[string]struct {
		state     runnerv1.MailboxState
		epoch     uint64
		consuming bool
	}{
		"active@p":     {runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, 1, true},
		"activating@p": {runnerv1.MailboxState_MAILBOX_STATE_OPEN, 0, false},
		"draining@p":   {runnerv1.MailboxState_MAILBOX_STATE_ACTIVE, 1, false},
		"opening@p":    {runnerv1.MailboxState_MAILBOX_STATE_OPEN, 0, false},
	}
	if len(got.resp.GetMailboxes()) != len(want) {
		t.Fatalf("stats of %d mailboxes, want %d: %v", len(got.resp.GetMailboxes()), len(want), got.resp)
	}
	for _, st := range got.resp.GetMailboxes() {
		w, ok := want[st.GetMailboxId()]
		if !ok || st.GetState() != w.state || st.GetEpoch() != w.epoch || st.GetConsuming() != w.consuming {
			t.Errorf("%s while busy: %v, want %+v", st.GetMailboxId(), st, w)
		}
	}
	if st := stateOf(t, s, "opening@p"); st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_OPEN {
		t.Errorf("opening@p on its own: %v, want open", st)
	}
	err := s.Ready()
	for _, id := range []string{"opening@p busy", "activating@p busy", "draining@p busy"} {
		if err == nil || !strings.Contains(err.Error(), id) {
			t.Errorf("Ready() = %v, want it to name %q", err, id)
		}
	}

	close(release)
	for range 3 {
		if err := <-calls; err != nil {
			t.Fatal(err)
		}
	}
	for id, w := range map[string]runnerv1.MailboxState{"opening@p": runnerv1.MailboxState_MAILBOX_STATE_OPEN, "activating@p": runnerv1.MailboxState_MAILBOX_STATE_ACTIVE} {
		if st := stateOf(t, s, id); st.GetState() != w || st.GetValidFor() == nil && w == runnerv1.MailboxState_MAILBOX_STATE_ACTIVE {
			t.Errorf("%s after its call: %v, want %v", id, st, w)
		}
	}
	if st := stateOf(t, s, "draining@p"); !st.GetDrained() {
		t.Errorf("draining@p after its drain: %v, want drained", st)
	}
}

// The probe of the whole runner reads each mailbox's published lifecycle
// and the runner's record of all of them once: it takes no mailbox's lock
// and asks the runner nothing per mailbox. With a thousand mailboxes, half
// of them opening and the rest locked by transitions in progress (as an
// ExtendMailboxes walks them), it answers within a small bound, where
// waiting for any one lock would hang it.
func TestStatsOfManyBusyMailboxesReadTheRunnerOnce(t *testing.T) {
	t.Parallel()
	const half = 500
	s, h, _ := newServer(t)
	ctx := context.Background()
	active := func(i int) string { return fmt.Sprintf("active-%03d@p", i) }
	opening := func(i int) string { return fmt.Sprintf("opening-%03d@p", i) }
	for i := range half {
		if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: active(i), Config: cfg, Epoch: 1, ValidFor: vf}); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	h.mu.Lock()
	h.gates = map[string]chan struct{}{}
	for i := range half {
		h.gates["prepare "+opening(i)] = release
	}
	h.mu.Unlock()
	var opens sync.WaitGroup
	for i := range half {
		opens.Go(func() {
			if _, err := s.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: opening(i), Config: cfg}); err != nil {
				t.Error(err)
			}
		})
	}
	defer opens.Wait()
	defer close(release)
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.mailboxes) == 2*half
	})
	s.mu.Lock()
	var held []*entry
	for i := range half {
		held = append(held, s.mailboxes[active(i)])
	}
	s.mu.Unlock()
	for _, e := range held {
		e.mu.Lock()
	}
	h.mu.Lock()
	h.reads.one, h.reads.all = 0, 0
	h.mu.Unlock()

	type answer struct {
		resp  *runnerv1.GetStatsResponse
		err   error
		took  time.Duration
		ready error
	}
	answered := make(chan answer, 1)
	go func() {
		start := time.Now()
		resp, err := s.GetStats(ctx, &runnerv1.GetStatsRequest{})
		answered <- answer{resp, err, time.Since(start), s.Ready()}
	}()
	var got answer
	select {
	case got = <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("GetStats waited for a mailbox's lock")
	}
	for _, e := range held {
		e.mu.Unlock()
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	t.Logf("GetStats of %d mailboxes, %d of them opening and %d locked: %v", 2*half, half, half, got.took)
	// A few milliseconds here; a bound far above that, below the
	// sidecar's 500 ms probe timeout, for a loaded machine under -race.
	if got.took > 400*time.Millisecond {
		t.Errorf("GetStats took %v, want well under the sidecar's probe timeout", got.took)
	}
	h.mu.Lock()
	reads := h.reads
	h.mu.Unlock()
	if reads.one != 0 || reads.all != 2 {
		t.Errorf("GetStats and Ready read the runner %d times per mailbox and %d times in all, want 0 and once each", reads.one, reads.all)
	}
	if n := len(got.resp.GetMailboxes()); n != 2*half {
		t.Fatalf("stats of %d mailboxes, want %d", n, 2*half)
	}
	for _, st := range got.resp.GetMailboxes() {
		wantActive := strings.HasPrefix(st.GetMailboxId(), "active-")
		if wantActive != (st.GetState() == runnerv1.MailboxState_MAILBOX_STATE_ACTIVE) || wantActive != st.GetConsuming() ||
			wantActive != (st.GetValidFor() != nil) || !wantActive && st.GetState() != runnerv1.MailboxState_MAILBOX_STATE_OPEN {
			t.Fatalf("%s: %v", st.GetMailboxId(), st)
		}
	}
	if got.ready == nil || !strings.Contains(got.ready.Error(), opening(0)+" busy") || strings.Contains(got.ready.Error(), "active-") {
		t.Errorf("Ready() = %v, want the opening mailboxes busy and the active ones not named", got.ready)
	}
}
