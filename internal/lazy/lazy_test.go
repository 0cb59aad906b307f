package lazy

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/testwait"
)

// outcome is what one try of opener's open does.
type outcome int

const (
	opens outcome = iota
	fails
	panics
)

// opener's open counts its tries and does what outcomes says of each in
// turn: try n opens value n or fails with "try n". hold, if set, is
// received from before the first try answers.
type opener struct {
	outcomes []outcome
	hold     chan struct{}
	entered  chan struct{} // closed as the first try begins

	mu    sync.Mutex
	tries int
}

func newOpener(outcomes ...outcome) *opener {
	return &opener{outcomes: outcomes, hold: make(chan struct{}), entered: make(chan struct{})}
}

func (o *opener) open() (int, error) {
	o.mu.Lock()
	o.tries++
	n := o.tries
	o.mu.Unlock()
	if n == 1 {
		close(o.entered)
		<-o.hold
	}
	switch o.outcomes[min(n, len(o.outcomes))-1] {
	case fails:
		return 0, fmt.Errorf("try %d", n)
	case panics:
		panic(fmt.Sprintf("try %d", n))
	}
	return n, nil
}

func (o *opener) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tries
}

// result is one Get's answer, as the tests compare it.
type result struct {
	v   int
	err string
}

func get(l *Value[int], o *opener) (r result) {
	defer func() {
		if p := recover(); p != nil {
			r = result{err: fmt.Sprint("panic: ", p)}
		}
	}()
	v, err := l.Get(o.open)
	if err != nil {
		return result{err: err.Error()}
	}
	return result{v: v}
}

// awaitParked waits until n goroutines wait for a Value's lock in fn (Get
// or Close): one parked on a sync.Mutex has read the tries counter already,
// so what it is answered does not depend on when the scheduler ran it. It
// counts every goroutine of the process, which is why no test here runs in
// parallel.
func awaitParked(t *testing.T, n int, fn string) {
	t.Helper()
	frame := "internal/lazy.(*Value[...])." + fn + "("
	testwait.For(t, 10*time.Second, fmt.Sprintf("%d callers of %s waiting for the lock", n, fn), func() (bool, string) {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		got := 0
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if strings.Contains(header, "[sync.Mutex.Lock") && strings.Contains(g, frame) {
				got++
			}
		}
		return got == n, fmt.Sprintf("%d waiting", got)
	})
}

// TestGetSharesATry: while the first try is held, 20 callers queue behind
// it; the first try's answer, or the second's if the first failed, is what
// they get, and a Get after them all reuses what opened or tries again.
func TestGetSharesATry(t *testing.T) {
	const n = 20
	noAnswer := result{err: errNoAnswer.Error()}
	for _, tc := range []struct {
		name       string
		outcomes   []outcome
		first      result         // the held try's caller
		waiters    map[result]int // what the callers that queued behind it got, how many each
		tries      int            // once they are answered
		after      result         // a Get after them all
		afterTries int
	}{
		{name: "opens: everyone shares it", outcomes: []outcome{opens},
			first: result{v: 1}, waiters: map[result]int{{v: 1}: n}, tries: 1, after: result{v: 1}, afterTries: 1},
		{name: "fails then opens: one waiter tries for all", outcomes: []outcome{fails, opens},
			first: result{err: "try 1"}, waiters: map[result]int{{v: 2}: n}, tries: 2, after: result{v: 2}, afterTries: 2},
		{name: "fails twice: the waiters share the second failure, the next caller tries again", outcomes: []outcome{fails, fails, opens},
			first: result{err: "try 1"}, waiters: map[result]int{{err: "try 2"}: n}, tries: 2, after: result{v: 3}, afterTries: 3},
		{name: "fails with no waiter: the next caller tries again", outcomes: []outcome{fails, opens},
			first: result{err: "try 1"}, waiters: map[result]int{}, tries: 1, after: result{v: 2}, afterTries: 2},
		{name: "panics: the panic is its caller's, a waiter tries again", outcomes: []outcome{panics, fails, opens},
			first: result{err: "panic: try 1"}, waiters: map[result]int{{err: "try 2"}: n}, tries: 2, after: result{v: 3}, afterTries: 3},
		{name: "a waiter's try panics: the others are told, not given a zero value", outcomes: []outcome{fails, panics, opens},
			first: result{err: "try 1"}, waiters: map[result]int{{err: "panic: try 2"}: 1, noAnswer: n - 1}, tries: 2, after: result{v: 3}, afterTries: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Value[int]
			o := newOpener(tc.outcomes...)
			first := make(chan result, 1)
			go func() { first <- get(&l, o) }()
			<-o.entered
			queued := 0
			for _, c := range tc.waiters {
				queued += c
			}
			waiters := make(chan result, queued)
			for range queued {
				go func() { waiters <- get(&l, o) }()
			}
			awaitParked(t, queued, "Get")
			close(o.hold)
			if got := <-first; got != tc.first {
				t.Errorf("the held try's caller got %+v, want %+v", got, tc.first)
			}
			got := map[result]int{}
			for range queued {
				got[<-waiters]++
			}
			if !maps.Equal(got, tc.waiters) {
				t.Errorf("the waiters got %v, want %v", got, tc.waiters)
			}
			if got := o.count(); got != tc.tries {
				t.Errorf("%d tries for %d callers, want %d", got, queued+1, tc.tries)
			}
			if got := get(&l, o); got != tc.after {
				t.Errorf("a Get after them all got %+v, want %+v", got, tc.after)
			}
			if got := o.count(); got != tc.afterTries {
				t.Errorf("%d tries after one more Get, want %d", got, tc.afterTries)
			}
		})
	}
}

// TestClose: Close closes what was opened, once, waiting for a try in
// flight, and no Get opens anything after it.
func TestClose(t *testing.T) {
	errClose := errors.New("close failed")
	for _, tc := range []struct {
		name     string
		outcomes []outcome
		inFlight bool  // Close is called while the first try is held
		gets     int   // Gets, each answered, before Close
		closeErr error // closeFn's answer
		closed   []int // what closeFn was given
	}{
		{name: "never opened: nothing to close", outcomes: []outcome{opens}},
		{name: "opened: closed once", outcomes: []outcome{opens}, gets: 2, closed: []int{1}},
		{name: "close error returned", outcomes: []outcome{opens}, gets: 1, closeErr: errClose, closed: []int{1}},
		{name: "last try failed: nothing to close", outcomes: []outcome{fails}, gets: 1},
		{name: "try in flight: closed after it opens", outcomes: []outcome{opens}, inFlight: true, closed: []int{1}},
		{name: "try in flight fails: nothing to close", outcomes: []outcome{fails}, inFlight: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Value[int]
			o := newOpener(tc.outcomes...)
			var mu sync.Mutex
			var closed []int
			closeFn := func(v int) error {
				mu.Lock()
				defer mu.Unlock()
				closed = append(closed, v)
				return tc.closeErr
			}
			var first chan result
			if tc.inFlight {
				first = make(chan result, 1)
				go func() { first <- get(&l, o) }()
				<-o.entered
			} else {
				close(o.hold)
			}
			for range tc.gets {
				get(&l, o)
			}
			closeDone := make(chan error, 1)
			go func() { closeDone <- l.Close(closeFn) }()
			if tc.inFlight {
				awaitParked(t, 1, "Close")
				close(o.hold)
				<-first
			}
			if err := <-closeDone; !errors.Is(err, tc.closeErr) || (err == nil) != (tc.closeErr == nil) {
				t.Errorf("Close = %v, want %v", err, tc.closeErr)
			}
			tries := o.count()
			if _, err := l.Get(o.open); !errors.Is(err, ErrClosed) {
				t.Errorf("Get after Close = %v, want ErrClosed", err)
			}
			if err := l.Close(closeFn); err != nil {
				t.Errorf("a second Close = %v, want nil", err)
			}
			if got := o.count(); got != tries {
				t.Errorf("Get after Close tried to open (%d tries, was %d)", got, tries)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(closed) != fmt.Sprint(tc.closed) {
				t.Errorf("closeFn given %v, want %v", closed, tc.closed)
			}
		})
	}
}
