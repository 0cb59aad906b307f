package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/trace"
	"strings"
	"sync"
	"testing"
	"time"
)

// A request whose handler waits for a lock shows as the slowest cycle, blocked for the time the lock was held,
// woken by the goroutine that let it go; the others are fast.
func TestReadCycles(t *testing.T) { // not parallel: it traces the whole process
	const held = 20 * time.Millisecond
	var mu sync.Mutex
	arrived := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(arrived)
			mu.Lock()
			defer mu.Unlock()
		}
	}))
	defer srv.Close()
	// One connection for every request: a connection's first cycle is not counted, and a request that raced the
	// previous one's return to the idle pool would dial its own.
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	get := func(path string) {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		get("/fast")
	}
	mu.Lock()
	done := make(chan struct{})
	go func() { defer close(done); get("/slow") }()
	<-arrived
	time.Sleep(held) // the wait the trace must show
	mu.Unlock()
	<-done
	trace.Stop()

	cycles, atOnce, err := readCycles(&buf)
	if err != nil {
		t.Fatal(err)
	}
	// A request that reaches the server before its connection goroutine waits for the network again shares the
	// previous one's cycle (on a busy machine all five fast ones may), so only the slow one is sure to be there.
	if len(cycles) == 0 {
		t.Fatal("no cycle; want the slow request's at least")
	}
	slow := cycles[len(cycles)-1]
	if slow.blocked < held || slow.took < slow.blocked {
		t.Errorf("slowest cycle took %v, blocked %v; want blocked at least the %v the lock was held", slow.took, slow.blocked, held)
	}
	if w := strings.Join(slow.waits, "; "); !strings.Contains(w, "blocked") || !strings.Contains(w, "(sync)") || !strings.Contains(w, "woken by") {
		t.Errorf("slowest cycle's waits %q; want a blocked wait on sync, with who woke it", w)
	}
	if len(cycles) > 1 {
		if fast := cycles[len(cycles)-2]; fast.took >= held {
			t.Errorf("second slowest cycle took %v; want the fast ones under %v", fast.took, held)
		}
	}
	if len(atOnce) == 0 {
		t.Error("no time counted by goroutines running at once")
	}
	var out bytes.Buffer
	printCycles(&out, cycles, atOnce, 1)
	if got := out.String(); !strings.Contains(got, "HTTP request cycles") || strings.Count(got, "\n") != 3 {
		t.Errorf("printCycles wrote %q; want the summary, the Ps busy and the one slowest cycle", got)
	}
}
