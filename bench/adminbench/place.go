package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The admin grants mailbox "{ns}@{proxy}" only if namespace ns exists, is
// placed on that proxy, and the caller is the runner the proxy registered
// (admin/fsm/acquire.go). A mailbox is one namespace on one proxy, so every
// lease the bench acquires needs a namespace of its own. The bench registers
// its proxies, creates the namespaces and reads back where each was placed
// before any timed phase.

// listPageSize is the admin's page cap: the fewest calls to list the
// bench's 200k namespaces or sessions, each page still within 2 MiB.
const listPageSize = 10000

// placed is a mailbox the admin will grant, and the runner that may hold it.
type placed struct {
	proxy, mailbox, runner string
}

var benchNamespaceConfig = &adminv1.NamespaceConfig{Topics: []string{"bench"}}

// registerProxies registers each proxy, as itself, through node with
// runnerOf[proxy] as its runner.
func registerProxies(ctx context.Context, c *prismCluster, node int, runnerOf map[string]string) error {
	for proxy, runner := range runnerOf {
		cp := adminv1.NewControlPlaneClient(c.conns.proxy(node, proxy))
		reg := &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:9000", RunnerId: runner}
		if err := retryUnavailable(ctx, func() error {
			_, err := cp.RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: reg})
			return err
		}); err != nil {
			return fmt.Errorf("register proxy %s (runner %s): %w", proxy, runner, err)
		}
	}
	return nil
}

// owningProxies returns n proxy ids "{prefix}{i}" that, registered together,
// each own at least one partition, so every one can be given namespaces. An
// id that would own none is replaced by the next unused one.
func owningProxies(prefix string, n int) []string {
	ids := make([]string, n)
	next := 0
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, next)
		next++
	}
	for {
		tab := placement.Compute(ids)
		owned := tab.Counts()
		replaced := false
		for i, id := range ids {
			if owned[id] == 0 {
				ids[i] = fmt.Sprintf("%s%d", prefix, next)
				next++
				replaced = true
			}
		}
		if !replaced {
			return ids
		}
	}
}

// namesPerProxy picks, for each proxy, per namespace names "{prefix}{n}" that
// placement puts on it when exactly these proxies are live. The admin's own
// placement is what counts: place reads it back.
func namesPerProxy(proxies []string, prefix string, per int) []string {
	tab := placement.Compute(proxies)
	left := make(map[string]int, len(proxies))
	for _, p := range proxies {
		left[p] = per
	}
	var names []string
	for n, want := 0, per*len(proxies); len(names) < want; n++ {
		name := fmt.Sprintf("%s%d", prefix, n)
		if owner := tab.Owner(placement.Partition(name)); left[owner] > 0 {
			left[owner]--
			names = append(names, name)
		}
	}
	return names
}

// place creates the namespaces through node as the bench's operator
// (concurrently, so the batch rides Raft's group commit) and returns, for
// each, the mailbox on the proxy the admin placed it on and that proxy's
// runner, in the order of names.
func place(ctx context.Context, c *prismCluster, node int, names []string, runnerOf map[string]string) ([]placed, error) {
	return placeWith(ctx, c, node, names, runnerOf, benchNamespaceConfig)
}

// placeWith is place creating the namespaces with cfg.
func placeWith(ctx context.Context, c *prismCluster, node int, names []string, runnerOf map[string]string, cfg *adminv1.NamespaceConfig) ([]placed, error) {
	cc := c.conns.operator(node)
	cp := adminv1.NewControlPlaneClient(cc)
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				if err := retryUnavailable(ctx, func() error {
					_, err := cp.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: names[i], Config: cfg})
					return err
				}); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("create namespace %s: %w", names[i], err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	// Read the placement back after the whole batch: a namespace created
	// early may have been placed before the last registration was applied.
	// From the leader as it is now (on a loaded machine leadership may have
	// moved), saving a forward per page; every page, as many as it takes.
	if l, err := c.leader(ctx, -1); err == nil {
		cc = c.conns.operator(l)
	}
	where := make(map[string]string, len(names))
	if err := mesh.AllPages(func(token string) (*adminv1.ListNamespacesResponse, error) {
		return adminv1.NewAdminClient(cc).ListNamespaces(ctx, &adminv1.ListNamespacesRequest{
			Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE, PageSize: listPageSize, PageToken: token,
		})
	}, func(r *adminv1.ListNamespacesResponse) {
		for _, ns := range r.GetNamespaces() {
			where[ns.GetName()] = ns.GetAssignedProxyId()
		}
	}); err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	out := make([]placed, len(names))
	for i, name := range names {
		proxy := where[name]
		runner, ok := runnerOf[proxy]
		if !ok {
			return nil, fmt.Errorf("namespace %s is placed on %q, not on a bench proxy", name, proxy)
		}
		out[i] = placed{proxy: proxy, mailbox: name + "@" + proxy, runner: runner}
	}
	return out, nil
}

// byProxy groups placed mailboxes by proxy.
func byProxy(ps []placed) map[string][]placed {
	m := make(map[string][]placed)
	for _, p := range ps {
		m[p.proxy] = append(m[p.proxy], p)
	}
	return m
}

// retryUnavailable retries f while the cluster has no leader to answer, as a
// sidecar does.
func retryUnavailable(ctx context.Context, f func() error) error {
	var err error
	for try := 0; try < 50; try++ {
		if err = f(); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
	return err
}
