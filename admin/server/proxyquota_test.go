package server

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/prism-mesh/prism/admin/placement"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// namespaceOn is the first namespace "{prefix}-{n}" placement puts on proxy
// when live are the live proxies.
func namespaceOn(prefix, proxy string, live ...string) string {
	tab := placement.Compute(live)
	for n := 0; ; n++ {
		if name := fmt.Sprintf("%s-%d", prefix, n); tab.Owner(placement.Partition(name)) == proxy {
			return name
		}
	}
}

// A proxy holding LeasesPerProxy leases is refused one more new lease
// ResourceExhausted, and nothing is granted; its re-grants and renewals
// still pass, another proxy is not affected, and a release makes room.
func TestLeasesPerProxyQuota(t *testing.T) {
	t.Parallel()
	n, cc := startLimited(t, NodeConfig{Quotas: Quotas{LeasesPerProxy: 1}})
	cp := adminv1.NewControlPlaneClient(cc)
	c := ctx(t)
	for _, p := range []string{"p1", "p2"} {
		if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: p, Address: "127.0.0.1:9000", RunnerId: "r-" + p}}); err != nil {
			t.Fatal(err)
		}
	}
	a1, a2, b1 := namespaceOn("a", "p1", "p1", "p2"), namespaceOn("b", "p1", "p1", "p2"), namespaceOn("c", "p2", "p1", "p2")
	for _, ns := range []string{a1, a2, b1} {
		if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
			t.Fatal(err)
		}
	}
	acquire := func(ns, proxy string) (*adminv1.AcquireLeaseResponse, error) {
		return cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: ns + "@" + proxy, RunnerId: "r-" + proxy, RunnerAddress: "127.0.0.1:9001"})
	}
	first, err := acquire(a1, "p1")
	if err != nil || !first.GetGranted() {
		t.Fatalf("p1's first lease: %v, %v", first, err)
	}
	cases := []struct {
		name      string
		call      func() error
		code      codes.Code
		p1Leases  int
		allLeases int
	}{
		{"a second lease of p1", func() error { _, err := acquire(a2, "p1"); return err }, codes.ResourceExhausted, 1, 1},
		{"the first again (a re-grant)", func() error { _, err := acquire(a1, "p1"); return err }, codes.OK, 1, 1},
		{"a lease of p2", func() error { _, err := acquire(b1, "p2"); return err }, codes.OK, 1, 2},
		{"a renewal of p1's lease", func() error {
			l, _ := n.FSM.Lease(a1 + "@p1")
			hb, err := cp.MailboxHeartbeat(c, &adminv1.MailboxHeartbeatRequest{MailboxId: a1 + "@p1", RunnerId: "r-p1", Epoch: l.GetEpoch()})
			if err == nil && !hb.GetRenewed() {
				return fmt.Errorf("not renewed: %v", hb.GetRefusal())
			}
			return err
		}, codes.OK, 1, 2},
		{"release p1's lease", func() error {
			_, err := cp.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: a1 + "@p1", RunnerId: "r-p1"})
			return err
		}, codes.OK, 0, 1},
		{"then p1's second lease", func() error { _, err := acquire(a2, "p1"); return err }, codes.OK, 1, 2},
	}
	for _, tc := range cases {
		wantCode(t, tc.name, tc.call(), tc.code)
		if got, all := n.FSM.ProxyLeases("p1"), n.FSM.Counts().Leases; got != tc.p1Leases || all != tc.allLeases {
			t.Fatalf("after %s: p1 holds %d of %d leases, want %d of %d", tc.name, got, all, tc.p1Leases, tc.allLeases)
		}
	}
}
