package admincluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
)

// registerRunner registers proxy with runner as the runner its mailboxes may
// be granted to, through any node.
func registerRunner(ctx context.Context, t *testing.T, c *e2e.AdminCluster, proxy, runner string) {
	t.Helper()
	reg := &adminv1.ProxyRegistration{ProxyId: proxy, Address: "127.0.0.1:9000", RunnerId: runner}
	if _, err := anyNode(ctx, c, 0, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.RegisterProxyResponse, error) {
		return n.ControlAs(proxy).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: reg})
	}); err != nil {
		t.Fatalf("register %s (runner %s): %v", proxy, runner, err)
	}
}

// placedMailbox creates a namespace "{prefix}-{n}" that placement puts on
// the registered proxy, so the mailbox it returns is one the proxy's runner
// may acquire. Register every proxy of a test first: a proxy registered
// later may win the namespace's partition. The name is chosen from the live
// proxies the cluster lists and checked against the created namespace's
// placement (the live set may change in between: then the next name is
// tried).
func placedMailbox(ctx context.Context, t *testing.T, c *e2e.AdminCluster, proxy, prefix string, cfg *adminv1.NamespaceConfig) string {
	t.Helper()
	for n := 0; ctx.Err() == nil; n++ {
		list, err := anyNode(ctx, c, 0, func(ctx context.Context, node *e2e.AdminNode) (*adminv1.ListProxiesResponse, error) {
			return node.Admin().ListProxies(ctx, &adminv1.ListProxiesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
		})
		if err != nil {
			t.Fatalf("list proxies: %v", err)
		}
		var live []string
		for _, p := range list.GetProxies() {
			if p.GetProxy().GetStatus() == adminv1.ProxyStatus_PROXY_STATUS_LIVE {
				live = append(live, p.GetProxy().GetRegistration().GetProxyId())
			}
		}
		if !slices.Contains(live, proxy) {
			t.Fatalf("proxy %s is not live: %v", proxy, live)
		}
		tab := placement.Compute(live)
		for tab.Owner(placement.Partition(fmt.Sprintf("%s-%d", prefix, n))) != proxy {
			n++
		}
		name := fmt.Sprintf("%s-%d", prefix, n)
		res, err := anyNode(ctx, c, 0, func(ctx context.Context, node *e2e.AdminNode) (*adminv1.CreateNamespaceResponse, error) {
			return node.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: name, Config: cfg})
		})
		if err != nil {
			t.Fatalf("create namespace %s: %v", name, err)
		}
		if res.GetNamespace().GetAssignedProxyId() == proxy {
			return name + "@" + proxy
		}
	}
	t.Fatalf("no namespace placed on %s: %v", proxy, ctx.Err())
	return ""
}

// proxyOf is the proxy a mailbox id names: the sidecar identity that may hold its lease.
func proxyOf(mailbox string) string { return mailbox[strings.LastIndex(mailbox, "@")+1:] }
