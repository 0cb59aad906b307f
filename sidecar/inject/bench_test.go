package inject

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
)

// BenchmarkInject measures what the API server waits for: one review of a
// runner pod over a kept-alive HTTPS connection on loopback, decode to
// patch to encode. It reports the p99 of single requests as p99_ms, the
// figure bench/sidecar.sh prints as inject.p99_ms.
func BenchmarkInject(b *testing.B) {
	dir := b.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	cert := writeSelfSigned(b, certFile, keyFile, 1)
	url := startServer(b, certFile, keyFile)
	client := trustingClient(cert)
	client.Transport.(*http.Transport).DisableKeepAlives = false
	body := reviewFor(b, mustJSON(b, runnerPod()), admissionv1.Create, podKind)

	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		resp, err := client.Post(url+PathInjectPod, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || n == 0 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	p99 := lat[min(len(lat)-1, len(lat)*99/100)]
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
}
