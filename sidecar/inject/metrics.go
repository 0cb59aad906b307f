package inject

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	denials  *prometheus.CounterVec
	latency  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_inject_requests_total",
			Help: "Admission reviews answered, by outcome (injected, skipped, ignored, denied, bad_request, error).",
		}, []string{"outcome"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_inject_denials_total",
			Help: "Pods denied for an invalid annotation, by annotation key.",
		}, []string{"annotation"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prism_inject_duration_seconds",
			Help: "Time to answer one admission review.",
			// The API server's default webhook timeout is 10 s; anything
			// past a few ms is already a problem worth seeing.
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9),
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.denials, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register inject metrics: %w", err)
		}
	}
	return m, nil
}
