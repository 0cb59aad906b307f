package raftnode

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// fakeClock fires the functions given to afterFunc when Advance passes
// their deadline.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	timers []*fakeTimer
	added  chan struct{}
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Duration
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

func (c *fakeClock) afterFunc(d time.Duration, f func()) interface{ Stop() bool } {
	c.mu.Lock()
	t := &fakeTimer{c: c, at: c.now + d, f: f}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.added <- struct{}{}
	return t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now += d
	var due []func()
	for _, t := range c.timers {
		if !t.stopped && t.at <= c.now {
			t.stopped = true
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// blockingStore's writes wait for release.
type blockingStore struct {
	*raft.InmemStore
	release chan struct{}
}

func (s blockingStore) StoreLogs(ls []*raft.Log) error {
	<-s.release
	return s.InmemStore.StoreLogs(ls)
}

func (s blockingStore) SetUint64(k []byte, v uint64) error {
	<-s.release
	return s.InmemStore.SetUint64(k, v)
}

func TestStallWatch(t *testing.T) {
	t.Parallel()
	const timeout = 10 * time.Second
	for _, tc := range []struct {
		name   string
		write  func(logs raft.LogStore, stable raft.StableStore) error
		block  bool
		wantOp string
	}{
		{"StoreLogs blocked", func(l raft.LogStore, _ raft.StableStore) error {
			return l.StoreLogs([]*raft.Log{{Index: 1, Term: 1}})
		}, true, "StoreLogs"},
		{"SetUint64 blocked", func(_ raft.LogStore, s raft.StableStore) error {
			return s.SetUint64([]byte("CurrentTerm"), 2)
		}, true, "SetUint64"},
		{"StoreLogs in time", func(l raft.LogStore, _ raft.StableStore) error {
			return l.StoreLogs([]*raft.Log{{Index: 1, Term: 1}})
		}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			var mu sync.Mutex
			var exits []int
			clock := &fakeClock{added: make(chan struct{}, 8)}
			w := newStallWatch(timeout, "/data/wal", slog.New(slog.NewTextHandler(&syncWriter{w: &buf, mu: &mu}, nil)))
			w.afterFunc = clock.afterFunc
			w.exit = func(code int) {
				mu.Lock()
				defer mu.Unlock()
				exits = append(exits, code)
			}
			store := blockingStore{InmemStore: raft.NewInmemStore(), release: make(chan struct{})}
			if !tc.block {
				close(store.release)
			}
			done := make(chan error, 1)
			go func() { done <- tc.write(stallLogStore{store, w}, stallStableStore{store, w}) }()
			<-clock.added
			if !tc.block {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(timeout - time.Millisecond)
			mu.Lock()
			if len(exits) != 0 {
				t.Fatalf("exited %v before the timeout", exits)
			}
			mu.Unlock()
			clock.Advance(time.Millisecond)
			clock.Advance(timeout)
			mu.Lock()
			defer mu.Unlock()
			if !tc.block {
				if len(exits) != 0 || buf.Len() != 0 {
					t.Fatalf("a write that completed in time exited %v, logged %q", exits, buf.String())
				}
				return
			}
			if len(exits) != 1 || exits[0] != ExitDiskStall {
				t.Fatalf("exits %v, want exactly one with %d", exits, ExitDiskStall)
			}
			for _, want := range []string{"level=ERROR", "op=" + tc.wantOp, "path=/data/wal", "blocked=10s"} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("log %q lacks %q", buf.String(), want)
				}
			}
			close(store.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStallWatchOnce: several writes blocked together exit once.
func TestStallWatchOnce(t *testing.T) {
	t.Parallel()
	var exits int
	clock := &fakeClock{added: make(chan struct{}, 8)}
	w := newStallWatch(time.Second, "wal", slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	w.afterFunc, w.exit = clock.afterFunc, func(int) { exits++ }
	store := blockingStore{InmemStore: raft.NewInmemStore(), release: make(chan struct{})}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = stallLogStore{store, w}.StoreLogs([]*raft.Log{{Index: 1, Term: 1}})
		}()
		<-clock.added
	}
	clock.Advance(time.Second)
	if exits != 1 {
		t.Fatalf("%d exits for three stalled writes, want 1", exits)
	}
	close(store.release)
	wg.Wait()
}

// TestStallLogStoreMonotonic: raft must still see raft-wal as monotonic.
func TestStallLogStoreMonotonic(t *testing.T) {
	t.Parallel()
	if !(stallLogStore{LogStore: monotonic{raft.NewInmemStore()}}).IsMonotonic() {
		t.Fatal("the wrapper hides a monotonic store")
	}
	if (stallLogStore{LogStore: raft.NewInmemStore()}).IsMonotonic() {
		t.Fatal("the wrapper claims a plain store is monotonic")
	}
}

type monotonic struct{ *raft.InmemStore }

func (monotonic) IsMonotonic() bool { return true }

type syncWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
