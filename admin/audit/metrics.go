package audit

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	backlog   prometheus.Gauge
	published prometheus.Gauge
	events    prometheus.Counter
	dropped   prometheus.Counter
	errors    prometheus.Counter
	lag       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "prism_admin_audit_backlog",
			Help: "Committed changes this node holds that the topic may not have yet (a follower trims it from the topic's tail)."}),
		published: prometheus.NewGauge(prometheus.GaugeOpts{Name: "prism_admin_audit_published_index",
			Help: "Highest raft index this node knows the audit topic holds."}),
		events: prometheus.NewCounter(prometheus.CounterOpts{Name: "prism_admin_audit_events_total",
			Help: "Audit events this node published."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "prism_admin_audit_dropped_total",
			Help: "Changes dropped from a full backlog; on the leader, or on a follower that then leads, they are missing from the trail."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "prism_admin_audit_publish_errors_total",
			Help: "Failed produces of audit events (retried)."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "prism_admin_audit_publish_lag_seconds",
			Help:    "Time from the leader's stamp on a change to Kafka acknowledging its event.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
	}
	if reg != nil {
		reg.MustRegister(m.backlog, m.published, m.events, m.dropped, m.errors, m.lag)
	}
	return m
}
