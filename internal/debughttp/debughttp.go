// Package debughttp serves what an operator needs to see where a Prism
// process's time goes: Go's runtime profiles (net/http/pprof) and every
// runtime/metrics sample. `prism admin` and `prism runner` mount it on their
// plaintext HTTP port only with --enable-pprof, as etcd does: that port is
// unauthenticated, and a profile names the code and holds a core for its
// duration.
package debughttp

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime/metrics"
)

// With serves the profiles under /debug/pprof/ and the runtime metrics under
// /debug/runtime-metrics beside h, which keeps every other path.
func With(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/runtime-metrics", serveRuntimeMetrics)
	mux.Handle("/", h)
	return mux
}

// serveRuntimeMetrics writes every runtime/metrics sample as text, one
// "name value" line each; a histogram is its total count, then one
// "name le=<upper bound> <count>" line per non-empty bucket, so two
// snapshots taken around a phase can be subtracted to get that phase's
// distribution (the /metrics Go collector exports few of them, and none
// of the scheduler's latencies).
func serveRuntimeMetrics(w http.ResponseWriter, _ *http.Request) {
	descs := metrics.All()
	samples := make([]metrics.Sample, len(descs))
	for i, d := range descs {
		samples[i].Name = d.Name
	}
	metrics.Read(samples)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	for _, s := range samples {
		switch s.Value.Kind() {
		case metrics.KindUint64:
			fmt.Fprintf(w, "%s %d\n", s.Name, s.Value.Uint64())
		case metrics.KindFloat64:
			fmt.Fprintf(w, "%s %g\n", s.Name, s.Value.Float64())
		case metrics.KindFloat64Histogram:
			hist := s.Value.Float64Histogram()
			var total uint64
			for _, c := range hist.Counts {
				total += c
			}
			fmt.Fprintf(w, "%s count=%d\n", s.Name, total)
			for i, c := range hist.Counts {
				if c > 0 {
					fmt.Fprintf(w, "%s le=%g %d\n", s.Name, hist.Buckets[i+1], c)
				}
			}
		}
	}
}
