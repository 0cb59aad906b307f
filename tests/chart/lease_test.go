package chart

import (
	"strconv"
	"testing"
	"time"
)

// TestSidecarLeasesAtTheRenderedRunnerAddr runs the chart with sidecar.runnerAddr off the default: the
// runner listens for its control API where the injected sidecar dials it, so once a namespace is created
// the sidecar of the proxy it is placed on opens its mailbox there and leases it, routed to the runner's
// query port.
func TestSidecarLeasesAtTheRenderedRunnerAddr(t *testing.T) {
	files := []string{"testdata/defaults.yaml", "testdata/runner-addr.yaml"}
	c, _ := runChart(t, files, "")
	began := time.Now()
	c.awaitLease("audit-logs", str2port(t, value(t, "runner.ports.grpc", files...)))
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
