// Package lazy holds Value, a resource opened by its first use and shared by
// every later one, whose opening may fail and be tried again: the runner's
// store, which every mailbox's open needs, and the Kafka client its
// mailboxes' ingests share.
package lazy

import (
	"errors"
	"sync"
	"sync/atomic"
)

// ErrClosed is what Get returns once Close was called.
var ErrClosed = errors.New("closed")

// errNoAnswer is what the callers that waited on a try get when it ended
// without one: its open panicked.
var errNoAnswer = errors.New("the try to open panicked")

// Value is a T opened by the first Get and shared by every later one until
// Close. The zero value is ready; a Value must not be copied.
//
// While opening fails, the rule is one try at a time, its answer shared: a
// Get that finds a try was begun since it was called (it waited for the
// lock meanwhile) returns that try's answer, its error if it failed, rather
// than starting a try of its own. So the callers that arrive
// while a try runs queue behind it; if it fails, the first of them tries
// once more and the others take that try's answer: a thousand callers cost
// two tries, not a thousand in a row (each reading a damaged store again,
// or waiting out a broker's timeout). A Get called after a failed try ended
// tries again.
//
// Close waits for a try in flight, closes what was opened, and makes every
// later Get fail with ErrClosed, so nothing is opened again behind it.
type Value[T any] struct {
	// tries counts the tries begun. A Get reads it before waiting for mu:
	// if it moved meanwhile, a try ran while this Get waited.
	tries atomic.Uint64

	mu     sync.Mutex // guards the rest; held while opening
	v      T
	ok     bool  // v is open
	err    error // the last try's error, until one succeeds
	closed bool
}

// Get returns the value, opening it with open unless a Get did already; see
// Value for what it returns while opening fails. open runs under the
// Value's lock (tries never overlap), so it must not call Get or Close on
// the same Value, and it may keep state of its own without a lock.
func (l *Value[T]) Get(open func() (T, error)) (T, error) {
	seen := l.tries.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	var zero T
	switch {
	case l.closed:
		return zero, ErrClosed
	case l.ok:
		return l.v, nil
	case l.tries.Load() != seen:
		return zero, l.err
	}
	l.tries.Add(1)
	l.err = errNoAnswer
	v, err := open()
	if err != nil {
		l.err = err
		return zero, err
	}
	l.v, l.ok, l.err = v, true, nil
	return v, nil
}

// Close closes the value with closeFn if a Get opened it, after any try in
// flight, and returns closeFn's error; every Get after it fails with
// ErrClosed. A second Close closes nothing.
func (l *Value[T]) Close(closeFn func(T) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if !l.ok {
		return nil
	}
	v := l.v
	var zero T
	l.v, l.ok = zero, false
	return closeFn(v)
}
