package main

import (
	"bytes"
	"runtime/trace"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A lock held while its holder computes and then sits in a system call shows as one hold, its two waiters
// woken by one unlock, with the holder's time split into running and the syscall.
func TestReadHolds(t *testing.T) { // not parallel: it traces the whole process
	const spin, sys = 10 * time.Millisecond, 8 * time.Millisecond
	var (
		mu      sync.RWMutex
		locked  = make(chan struct{})
		release = make(chan struct{})
		readers sync.WaitGroup
	)
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); holdWhileBusy(&mu, locked, release, spin, sys) }()
	<-locked
	for range 2 {
		readers.Add(1)
		go func() { defer readers.Done(); readerWaits(&mu) }()
	}
	time.Sleep(2 * time.Millisecond) // the readers block on the lock
	close(release)
	<-done
	readers.Wait()
	trace.Stop()

	holds, err := readHolds(&buf, time.Millisecond, []string{".readerWaits"})
	if err != nil {
		t.Fatal(err)
	}
	if len(holds) != 1 {
		t.Fatalf("%d holds; want 1: %+v", len(holds), holds)
	}
	h := holds[0]
	if h.waiters != 2 || !strings.Contains(h.site, "readerWaits") || !strings.Contains(strings.Join(h.unlock, " "), "holdWhileBusy") {
		t.Errorf("hold: %d waiters in %q, unlocked in %q; want 2 in readerWaits, unlocked in holdWhileBusy", h.waiters, h.site, h.unlock)
	}
	if h.running < spin/2 || h.syscall < sys/2 || h.to.Sub(h.from) < spin+sys {
		t.Errorf("hold of %v: holder running %v, in syscalls %v; want at least %v, %v and %v", h.to.Sub(h.from), h.running, h.syscall, spin+sys, spin/2, sys/2)
	}
	var out bytes.Buffer
	printHolds(&out, holds, 1)
	if got := out.String(); !strings.Contains(got, "1 holds") || !strings.Contains(got, "syscalls: ") {
		t.Errorf("printHolds wrote %q; want the one hold and its syscall", got)
	}
}

// holdWhileBusy takes mu for writing, says so on locked, and once release closes computes for spin, then sleeps
// sys in a nanosleep system call, before it lets go.
func holdWhileBusy(mu *sync.RWMutex, locked, release chan struct{}, spin, sys time.Duration) {
	mu.Lock()
	defer mu.Unlock()
	close(locked)
	<-release
	for start := time.Now(); time.Since(start) < spin; {
	}
	ts := syscall.NsecToTimespec(sys.Nanoseconds())
	_ = syscall.Nanosleep(&ts, nil)
}

func readerWaits(mu *sync.RWMutex) {
	mu.RLock()
	defer mu.RUnlock()
}
