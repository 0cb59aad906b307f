package gateway

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

type metrics struct {
	httpRequests *prometheus.CounterVec
	grpcRequests *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	retries      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_gateway_http_requests_total",
			Help: "HTTP requests answered, by MailboxQuery method (none for unknown paths) and HTTP status.",
		}, []string{"method", "code"}),
		grpcRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_gateway_grpc_requests_total",
			Help: "gRPC MailboxQuery calls answered, by method and gRPC code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prism_gateway_request_seconds",
			Help:    "Request latency through the gateway, upstream call included, by API (http, grpc) and method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"api", "method"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_gateway_upstream_retries_total",
			Help: "Upstream calls tried again, by reason (unavailable, namespace not served).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.httpRequests, m.grpcRequests, m.latency, m.retries)
	return m
}

func (m *metrics) http(method string, status int, start time.Time) {
	m.httpRequests.WithLabelValues(method, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues("http", method).Observe(time.Since(start).Seconds())
}

func (m *metrics) grpc(method string, c codes.Code, start time.Time) {
	m.grpcRequests.WithLabelValues(method, c.String()).Inc()
	m.latency.WithLabelValues("grpc", method).Observe(time.Since(start).Seconds())
}

func (m *metrics) retry(reason string) { m.retries.WithLabelValues(reason).Inc() }
