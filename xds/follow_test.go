package xds

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds/ir"
)

func TestNotFoundIPs(t *testing.T) {
	t.Parallel()
	notFound := []string{"admin-1.admin.prism.svc:8981", "10.0.0.2:8981", "0.0.0.0:8981", "[::]:8981", "gone.svc:8981", "no-port"}
	resolve := func(_ context.Context, host string) ([]string, error) {
		if host == "admin-1.admin.prism.svc" {
			return []string{"10.0.0.9", "10.0.0.1"}, nil
		}
		return nil, errors.New("no such host")
	}
	got := notFoundIPs(context.Background(), notFound, resolve)
	want := []string{"10.0.0.1:8981", "10.0.0.2:8981"}
	if !slices.Equal(got, want) {
		t.Fatalf("notFoundIPs = %v, want %v", got, want)
	}
}

// fakeSource is an FSM's routing state that counts Follow's reads.
type fakeSource struct {
	mu                     sync.Mutex
	index, routesIndex     uint64
	proxies                []*adminv1.ProxyInfo
	changed                chan struct{}
	indexReads, proxyReads atomic.Int64
}

func newFakeSource() *fakeSource { return &fakeSource{changed: make(chan struct{})} }

func (s *fakeSource) Changed() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index, s.changed
}

func (s *fakeSource) ProxyRoutesIndex() uint64 {
	s.indexReads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.routesIndex
}

func (s *fakeSource) Proxies() ([]*adminv1.ProxyInfo, uint64) {
	s.proxyReads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*adminv1.ProxyInfo, len(s.proxies))
	for i, p := range s.proxies {
		out[i] = proto.Clone(p).(*adminv1.ProxyInfo)
	}
	return out, s.index
}

// apply changes the state as one FSM entry and wakes Follow; routes says
// whether the entry changed what the IR takes from the proxies.
func (s *fakeSource) apply(routes bool, change func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index++
	if change != nil {
		change()
	}
	if routes {
		s.routesIndex = s.index
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// Follow serves an empty FSM under version 1, reads the proxies only when
// the proxy routes index moved or the admin addresses did, serves under
// the proxy routes index, and serves re-resolved admin addresses under the
// unchanged index.
func TestFollowFakeSource(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp := New(ctx, Config{Debounce: time.Millisecond})
	go func() { _ = cp.Run(ctx) }()
	src := newFakeSource()
	var adminIP atomic.Value
	adminIP.Store("10.0.0.1")
	cfg := FollowConfig{
		Gateway:  ir.Gateway{Address: "127.0.0.1:8080"},
		NotFound: []string{"admin-0.admin.svc:8981"},
		Lookup:   "dns:///admin.svc:8981",
		Resolve: func(context.Context, string) ([]string, error) {
			return []string{adminIP.Load().(string)}, nil
		},
	}
	done := make(chan error, 1)
	go func() { done <- cp.Follow(ctx, src, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Follow: %v", err)
		}
	}()

	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	snapshot := func() any {
		s, err := cp.cache.Snapshot()
		if err != nil {
			return nil
		}
		return s
	}
	reads := func(want int64) {
		t.Helper()
		if got := src.proxyReads.Load(); got != want {
			t.Fatalf("%d proxy reads, want %d", got, want)
		}
	}
	// looked waits for Follow to take a round after an entry that changes
	// nothing it serves.
	looked := func(change func()) {
		t.Helper()
		rounds := src.indexReads.Load()
		src.apply(false, change)
		await("Follow to look at the entry", func() bool { return src.indexReads.Load() > rounds })
	}

	await("the empty FSM to be served", func() bool { return cp.Version() == "1" })
	reads(1)

	// A heartbeat, a lease granted: Follow looks but reads nothing.
	looked(nil)
	looked(nil)
	reads(1)

	src.apply(true, func() {
		src.proxies = []*adminv1.ProxyInfo{{Proxy: &adminv1.Proxy{
			Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:7000"},
			Status:       adminv1.ProxyStatus_PROXY_STATUS_LIVE,
		}}}
	})
	await("the registration to be served", func() bool { return cp.Version() == "3" })
	reads(2)

	src.apply(true, func() { src.proxies[0].Proxy.Status = adminv1.ProxyStatus_PROXY_STATUS_STALE })
	await("the stale proxy to be served", func() bool { return cp.Version() == "4" })
	reads(3)

	before := snapshot()
	adminIP.Store("10.0.0.2")
	src.apply(false, nil)
	await("the re-resolved admin address to be served", func() bool { return snapshot() != before })
	reads(4)
	if got := cp.Version(); got != "4" {
		t.Fatalf("serving version %s after the admin address moved, want the proxy routes index 4", got)
	}
}
