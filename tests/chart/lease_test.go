package chart

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// TestSidecarLeasesAtTheRenderedRunnerAddr runs the chart with sidecar.runnerAddr off the default: the
// runner listens for its control API where the injected sidecar dials it, so once a namespace is created
// the sidecar of the proxy it is placed on opens its mailbox there and leases it, routed to the runner's
// query port.
func TestSidecarLeasesAtTheRenderedRunnerAddr(t *testing.T) {
	files := []string{"testdata/defaults.yaml", "testdata/runner-addr.yaml"}
	c, _ := runChart(t, files, "")
	began := time.Now()
	cc := c.operator(c.podNamed(adminName + "-0"))
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := adminv1.NewControlPlaneClient(cc).CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{
		Namespace: "audit-logs", Config: &adminv1.NamespaceConfig{Topics: []string{"audit.events"}},
	}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	runner := c.podNamed(releaseName + "-runner-0")
	wantAddr := net.JoinHostPort(runner.net.IP.String(), strconv.Itoa(str2port(t, value(t, "runner.ports.grpc", files...))))
	admin := adminv1.NewAdminClient(cc)
	c.await("the sidecar leases audit-logs@"+runner.name, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := admin.ListLeases(ctx, &adminv1.ListLeasesRequest{Namespace: "audit-logs"})
		if err != nil {
			return err
		}
		for _, l := range resp.GetLeases() {
			if l.GetMailboxId() == "audit-logs@"+runner.name && l.GetRunnerAddress() == wantAddr {
				return nil
			}
		}
		return fmt.Errorf("leases %v, want audit-logs@%s at %s", resp.GetLeases(), runner.name, wantAddr)
	})
	t.Logf("leased %v after the namespace was created", time.Since(began).Round(time.Millisecond))
}

func str2port(t *testing.T, v any) int {
	t.Helper()
	n, err := strconv.Atoi(str(v))
	if err != nil {
		t.Fatalf("port %v: %v", v, err)
	}
	return n
}
