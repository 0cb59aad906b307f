package server

import (
	"bytes"
	"strconv"
	"testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/xds/xdstest"
)

const clusterType = "type.googleapis.com/envoy.config.cluster.v3.Cluster"

// The node serves its routes over ADS: a lease grant puts the runner's
// cluster into the next snapshot (versioned by the routes index), a release
// takes it out.
func TestXDSFollowsLeases(t *testing.T) {
	t.Parallel()
	n, cp, adm, _ := startSingle(t)
	c := ctx(t)
	placeOn(t, c, cp, "p1", "runner-a", "audit")
	acq, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: "audit@p1", RunnerId: "runner-a", RunnerAddress: "127.0.0.1:9001"})
	if err != nil || !acq.GetGranted() {
		t.Fatalf("acquire: %v, %v", acq, err)
	}
	ads, err := xdstest.DialSotW(c, n.GRPCAddr(), "gateway-test")
	if err != nil {
		t.Fatal(err)
	}
	defer ads.Close()
	hasRunner := func(version string) bool {
		t.Helper()
		for {
			resp, err := ads.Next()
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetTypeUrl() != clusterType || (version != "" && resp.GetVersionInfo() != version) {
				continue
			}
			for _, r := range resp.GetResources() {
				if bytes.Contains(r.GetValue(), []byte("runner-a")) {
					return true
				}
			}
			return false
		}
	}
	routes, err := adm.ListRoutes(c, &adminv1.ListRoutesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasRunner(strconv.FormatUint(routes.GetIndex(), 10)) {
		t.Fatal("runner-a has no cluster after its grant")
	}
	if _, err := cp.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: "audit@p1", RunnerId: "runner-a"}); err != nil {
		t.Fatal(err)
	}
	if hasRunner("") {
		t.Fatal("runner-a still has a cluster after the release")
	}
}
