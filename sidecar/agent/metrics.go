package agent

import "github.com/prometheus/client_golang/prometheus"

// metrics are the sidecar's figures. Every lease loss is counted with its
// reason: a lease is never lost silently (docs/architecture.md#client-side-stop).
type metrics struct {
	losses     *prometheus.CounterVec
	acquires   *prometheus.CounterVec
	heartbeats *prometheus.CounterVec
	releases   *prometheus.CounterVec
	held       prometheus.Gauge
	hbLatency  prometheus.Histogram
	acqLatency prometheus.Histogram
	watchConns prometheus.Counter

	sessionsOpened prometheus.Counter
	keepalives     *prometheus.CounterVec
	kaLatency      prometheus.Histogram
	batches        prometheus.Counter
	runnerReady    prometheus.Gauge
	shed           *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		losses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_sidecar_lease_losses_total",
			Help: "Leases lost (runner fenced), by reason: ttl_elapsed, expired, not_holder, unknown_lease, stale_epoch, unknown_session, runner_unreachable.",
		}, []string{"reason"}),
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_sidecar_lease_acquires_total",
			Help: "Lease acquire attempts by result: granted, refused (held by another runner) or error.",
		}, []string{"result"}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_sidecar_heartbeats_total",
			Help: "Mailbox heartbeats (mailbox lease mode) by result: renewed, refused or error.",
		}, []string{"result"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_sidecar_lease_releases_total",
			Help: "Lease releases by cause (unassigned, shutdown, runner_unreachable) and result (released, absent, refused, error, or expiring: not released since the runner may still serve under it).",
		}, []string{"cause", "result"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prism_sidecar_leases_held",
			Help: "Leases held with the runner active on them.",
		}),
		hbLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prism_sidecar_heartbeat_seconds",
			Help:    "Mailbox heartbeat round trip, including failover across admin nodes.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		acqLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prism_sidecar_acquire_seconds",
			Help:    "Time from assignment to the runner serving under a granted lease.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		watchConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_sidecar_watch_connects_total",
			Help: "WatchAssignments streams opened (reconnects included).",
		}),
		sessionsOpened: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_sidecar_sessions_opened_total",
			Help: "Sessions opened (one at start, one after every lost session).",
		}),
		keepalives: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_sidecar_session_keepalives_total",
			Help: "Session keepalives sent, by result: renewed, refused (the session is lost) or error.",
		}, []string{"result"}),
		kaLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prism_sidecar_session_keepalive_seconds",
			Help:    "Session keepalive round trip, including failover across admin nodes.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_sidecar_acquire_batches_total",
			Help: "AcquireLeases calls made (each asks for every mailbox then waiting, up to 10,000).",
		}),
		runnerReady: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prism_sidecar_runner_ready",
			Help: "1 while the proxy reports its runner ready, 0 once the runner has failed the probe for the runner-dead bound (the admin then places the proxy's namespaces elsewhere).",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_sidecar_shed_total",
			Help: "Admin calls refused RESOURCE_EXHAUSTED with a retry delay (the leader shedding new work), by call; each is retried no sooner than that delay.",
		}, []string{"call"}),
	}
	m.runnerReady.Set(1)
	if reg != nil {
		reg.MustRegister(m.losses, m.acquires, m.heartbeats, m.releases, m.held, m.hbLatency, m.acqLatency, m.watchConns,
			m.sessionsOpened, m.keepalives, m.kaLatency, m.batches, m.runnerReady, m.shed)
	}
	return m
}
