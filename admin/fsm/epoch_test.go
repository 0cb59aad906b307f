package fsm

import (
	"bytes"
	"errors"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func TestEpochAt(t *testing.T) {
	t.Parallel()
	const maxTerm, maxIndex = 1<<epochTermBits - 1, 1<<epochIndexBits - 1
	for _, tc := range []struct {
		name        string
		term, index uint64
		want        uint64
		wantErr     bool
	}{
		{name: "term 0 is the index", term: 0, index: 7, want: 7},
		{name: "term in the high bits", term: 3, index: 7, want: 3<<40 | 7},
		{name: "largest", term: maxTerm, index: maxIndex, want: 1<<64 - 1},
		{name: "index past its bits", term: 1, index: maxIndex + 1, wantErr: true},
		{name: "term past its bits", term: maxTerm + 1, index: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := epochAt(tc.term, tc.index)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("epochAt(%d, %d) = %d, %v; want %d, error %v", tc.term, tc.index, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestEpochOrder: epochs order like (term, index) pairs, so a grant in a
// later term is above every grant of earlier terms whatever its index.
func TestEpochOrder(t *testing.T) {
	t.Parallel()
	pairs := [][2]uint64{{1, 1}, {1, 2}, {1, 1<<epochIndexBits - 1}, {2, 1}, {2, 5}, {9, 3}, {1<<epochTermBits - 1, 1}}
	var prev uint64
	for _, p := range pairs {
		e, err := epochAt(p[0], p[1])
		if err != nil {
			t.Fatal(err)
		}
		if e <= prev {
			t.Fatalf("epoch of term %d index %d = %d, not above the previous %d", p[0], p[1], e, prev)
		}
		prev = e
	}
}

// TestEpochAfterLostLogTail replays what a node does after its log lost its
// tail: the FSM rebuilds from the surviving prefix and the next grant reuses
// a lost index, in a later term (a restart always elects in a new term). Its
// epoch must be above every epoch granted from the lost entries.
func TestEpochAfterLostLogTail(t *testing.T) {
	t.Parallel()
	cmds := []*adminv1.Command{
		c(0, registerRunner("proxy-01", "runner-a")),
		c(0, createNS(ns, "audit.events")),
	}
	const grants = 5
	for i := 0; i < grants; i++ {
		cmds = append(cmds, c(time.Duration(i)*time.Second, acquire(mailboxID(ns, "proxy-01"), "runner-a")))
	}

	before := newHarness(t)
	before.term = 4
	var highest uint64
	for _, cmd := range cmds {
		if r, ok := before.must(cmd).(*adminv1.AcquireLeaseResponse); ok {
			highest = max(highest, r.GetLease().GetEpoch())
		}
	}

	after := newHarness(t)
	after.term = 4
	for _, cmd := range cmds[:3] { // the surviving prefix: one grant
		after.must(cmd)
	}
	after.term = 5
	r := after.must(c(time.Minute, acquire(mailboxID(ns, "proxy-01"), "runner-a"))).(*adminv1.AcquireLeaseResponse)
	if !r.GetGranted() || after.index >= before.index {
		t.Fatalf("setup: granted %v at index %d, lost log ended at %d", r.GetGranted(), after.index, before.index)
	}
	if got := r.GetLease().GetEpoch(); got <= highest {
		t.Fatalf("grant at term 5 index %d has epoch %d, not above %d granted before the log was cut", after.index, got, highest)
	}
}

// TestEpochExhaustedRefusesGrant: past the epoch layout a grant fails and
// changes nothing, rather than handing out a wrapped, smaller epoch.
func TestEpochExhaustedRefusesGrant(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.must(c(0, registerRunner("proxy-01", "runner-a")))
	h.must(c(0, createNS(ns, "audit.events")))
	h.term = 1 << epochTermBits
	was := tables(t, h.f)
	res := h.apply(c(time.Second, acquire(mailboxID(ns, "proxy-01"), "runner-a")))
	if err, ok := res.(error); !ok || errors.Is(err, ErrInvalid) {
		t.Fatalf("acquire past the epoch space = %v, want an error that is not ErrInvalid", res)
	}
	if !bytes.Equal(tables(t, h.f), was) {
		t.Fatal("a refused grant changed the state")
	}
}
