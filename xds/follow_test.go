package xds

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	routes                 []*adminv1.Route
	proxies                []*adminv1.ProxyInfo
	changed                chan struct{}
	routeReads, proxyReads atomic.Int64
}

func newFakeSource() *fakeSource { return &fakeSource{changed: make(chan struct{})} }

func (s *fakeSource) Changed() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index, s.changed
}

func (s *fakeSource) RoutesIndex() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.routesIndex
}

func (s *fakeSource) Routes() ([]*adminv1.Route, []*adminv1.NamespaceRoute, uint64) {
	s.routeReads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.routes), nil, s.routesIndex
}

func (s *fakeSource) Proxies() ([]*adminv1.ProxyInfo, uint64) {
	s.proxyReads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.proxies), s.index
}

// apply changes the state as one FSM entry and wakes Follow.
func (s *fakeSource) apply(change func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index++
	if change != nil {
		change()
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// Follow serves an empty FSM under version 1, copies the routes only when
// the routes index moved, and serves stale proxies and re-resolved
// not-found targets under the unchanged routes index.
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
		if got := src.routeReads.Load(); got != want {
			t.Fatalf("%d route copies, want %d", got, want)
		}
	}

	await("the empty FSM to be served", func() bool { return cp.Version() == "1" })
	reads(1)

	// A heartbeat: Follow looks again but copies no routes.
	rounds := src.proxyReads.Load()
	src.apply(nil)
	await("Follow to look at the heartbeat", func() bool { return src.proxyReads.Load() > rounds })
	reads(1)

	src.apply(func() {
		src.proxies = []*adminv1.ProxyInfo{{Proxy: &adminv1.Proxy{
			Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:7000"},
		}}}
		src.routes = []*adminv1.Route{{MailboxId: "audit@p1", Namespace: "audit", ProxyId: "p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:9001", Epoch: 1}}
		src.routesIndex = src.index
	})
	await("the grant to be served", func() bool { return cp.Version() == "2" })
	reads(2)

	before := snapshot()
	src.apply(func() { src.proxies[0].Proxy.Status = adminv1.ProxyStatus_PROXY_STATUS_STALE })
	await("the stale proxy to be served", func() bool { return snapshot() != before })
	reads(2)
	if got := cp.Version(); got != "2" {
		t.Fatalf("serving version %s after the proxy went stale, want the routes index 2", got)
	}

	before = snapshot()
	adminIP.Store("10.0.0.2")
	src.apply(nil)
	await("the re-resolved not-found target to be served", func() bool { return snapshot() != before })
	reads(2)
	if got := cp.Version(); got != "2" {
		t.Fatalf("serving version %s after the not-found target moved, want the routes index 2", got)
	}
}
