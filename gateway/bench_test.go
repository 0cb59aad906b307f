package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// benchRequests bounds each measured loop.
const benchRequests = 2000

// BenchmarkGateway measures what the gateway adds to a query: the same
// stats request straight to the runner's HTTP API, through the gateway's
// HTTP API and through its gRPC front door, sequentially on loopback.
func BenchmarkGateway(b *testing.B) {
	m := startMesh(b)
	m.publish(1)
	m.run(b)
	cc, err := grpc.NewClient(m.gwGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	qc := mailboxv1.NewMailboxQueryClient(cc)
	client := &http.Client{Timeout: 10 * time.Second}
	httpGet := func(url string) func() error {
		return func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
			}
			return nil
		}
	}
	path := "/v1/mailboxes/audit@proxy-a/stats"
	ctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, "audit@proxy-a")
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"runner_http", httpGet("http://" + m.a.httpAddr + path)},
		{"http", httpGet(m.url + path)},
		{"grpc", func() error { _, err := qc.GetStats(ctx, &mailboxv1.GetStatsRequest{}); return err }},
	} {
		for range 100 { // warm connections and caches
			if err := tc.do(); err != nil {
				b.Fatal(err)
			}
		}
		lat := make([]time.Duration, 0, benchRequests)
		for range benchRequests {
			start := time.Now()
			if err := tc.do(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
		fmt.Printf("BENCH gateway.%s_stats_p50_us %d us\n", tc.name, p50.Microseconds())
		fmt.Printf("BENCH gateway.%s_stats_p99_us %d us\n", tc.name, p99.Microseconds())
	}
	for b.Loop() {
		if err := httpGet(m.url + path)(); err != nil {
			b.Fatal(err)
		}
	}
}
