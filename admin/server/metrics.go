package server

import (
	"context"
	"net/http"
	"path"
	"time"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Metrics holds the node's collectors. Create it before the raft node so the
// node can report commit and apply latency into it (RaftHooks).
type Metrics struct {
	gatherer    prometheus.Gatherer
	commit      prometheus.Histogram
	fsmApply    prometheus.Histogram
	expirations prometheus.Counter
	expiryScans prometheus.Counter
	// leaderUnconfirmed counts renewals refused because this node, though
	// raft said it led, could not prove it to a quorum.
	leaderUnconfirmed prometheus.Counter
	// shed counts writes refused for load, by method; renewalWait is how
	// long renewals waited between arrival and the lessor.
	shed        *prometheus.CounterVec
	renewalWait prometheus.Histogram
	forwards    *prometheus.CounterVec
	forwardTime prometheus.Histogram
	rpcs        *prometheus.CounterVec
	rpcTime     *prometheus.HistogramVec
	moves       moveMetrics
	sessions    sessionMetrics
}

var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// NewMetrics creates the collectors; Server.New registers them.
func NewMetrics() *Metrics {
	return &Metrics{
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prism_admin_raft_commit_seconds", Buckets: latencyBuckets,
			Help: "Time from proposing an entry on the leader to its FSM having applied it (replication, fsync, apply).",
		}),
		fsmApply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prism_admin_fsm_apply_seconds", Buckets: latencyBuckets,
			Help: "Time the FSM spends applying one entry or one batch.",
		}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_admin_lease_expirations_total",
			Help: "Leases removed by expire commands this node committed as leader.",
		}),
		leaderUnconfirmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_admin_renewals_unconfirmed_total",
			Help: "Heartbeats this node did not renew because a quorum did not confirm its leadership (a deposed or paused leader).",
		}),
		expiryScans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_admin_lease_expiry_scans_total",
			Help: "Times the leader asked the lessor for leases past expires + grace.",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_shed_total",
			Help: "New work the leader refused RESOURCE_EXHAUSTED for load (too many writes in flight, or renewals waiting too long), by method.",
		}, []string{"method"}),
		renewalWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prism_admin_renewal_wait_seconds", Buckets: latencyBuckets,
			Help: "Time a renewal (heartbeat or keepalive) waited on the leader between its arrival, from which it counts, and the lessor.",
		}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_forwards_total",
			Help: "Calls this follower re-issued on the leader, by method and gRPC code.",
		}, []string{"method", "code"}),
		forwardTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prism_admin_forward_seconds", Buckets: latencyBuckets,
			Help: "Round trip of a forwarded call to the leader.",
		}),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_grpc_requests_total",
			Help: "gRPC calls served, by method and code.",
		}, []string{"method", "code"}),
		rpcTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "prism_admin_grpc_request_seconds", Buckets: latencyBuckets,
			Help: "gRPC unary call latency by method.",
		}, []string{"method"}),
		moves:    newMoveMetrics(),
		sessions: newSessionMetrics(),
	}
}

// RaftHooks feeds raft commit and FSM apply latency into the histograms.
func (m *Metrics) RaftHooks() raftnode.Metrics {
	return raftnode.Metrics{
		Commit:   func(d time.Duration) { m.commit.Observe(d.Seconds()) },
		FSMApply: func(d time.Duration) { m.fsmApply.Observe(d.Seconds()) },
	}
}

func (m *Metrics) register(reg prometheus.Registerer, s *Server) error {
	stat := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{
		m.commit, m.fsmApply, m.expirations, m.expiryScans, m.leaderUnconfirmed, m.shed, m.renewalWait, m.forwards, m.forwardTime, m.rpcs, m.rpcTime,
		stat("prism_admin_writes_in_flight", "Raft writes this node, as leader, has proposed for clients and not yet seen applied.", func() float64 {
			return float64(s.admission.inFlight.Load())
		}),
		stat("prism_admin_renewals_waiting", "Renewals waiting at the leader's renewal gate for their turn (counted from their arrival meanwhile).", func() float64 {
			_, n := s.admission.renewals.oldestWait(s.cfg.Clock.Now())
			return float64(n)
		}),
		stat("prism_admin_renewal_queue_age_seconds", "How long the oldest renewal waiting at the leader's renewal gate has waited; past --shed-after-renewal-wait new work is shed.", func() float64 {
			d, _ := s.admission.renewals.oldestWait(s.cfg.Clock.Now())
			return d.Seconds()
		}),
		stat("prism_admin_raft_term", "Current raft term.", func() float64 { return float64(s.node.Stats().Term) }),
		stat("prism_admin_raft_commit_index", "Raft commit index.", func() float64 { return float64(s.node.Stats().CommitIndex) }),
		stat("prism_admin_raft_applied_index", "Index the FSM applied.", func() float64 { return float64(s.node.Stats().AppliedIndex) }),
		s.node.LogCollector(),
		s.node.ContactGaps(),
		stat("prism_admin_raft_leader", "1 while this node is the established leader.", func() float64 {
			if l, _ := s.node.Leadership(); l.IsLeader {
				return 1
			}
			return 0
		}),
		newStateCollector(s),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	cs = append(cs, m.moves.collectors(s)...)
	cs = append(cs, m.sessions.collectors(s)...)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		m.gatherer = g
	} else {
		m.gatherer = prometheus.DefaultGatherer
	}
	return nil
}

// stateCollector reports raft state and table sizes at scrape time.
type stateCollector struct {
	s                           *Server
	state, leases, proxies, nss *prometheus.Desc
}

func newStateCollector(s *Server) *stateCollector {
	return &stateCollector{
		s:       s,
		state:   prometheus.NewDesc("prism_admin_raft_state", "1 for the node's current raft state.", []string{"state"}, nil),
		leases:  prometheus.NewDesc("prism_admin_leases", "Leases in the FSM by status (live: held; tracked: in the leader's lessor).", []string{"status"}, nil),
		proxies: prometheus.NewDesc("prism_admin_proxies", "Registered proxies by status.", []string{"status"}, nil),
		nss:     prometheus.NewDesc("prism_admin_namespaces", "Namespaces.", nil, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.state
	ch <- c.leases
	ch <- c.proxies
	ch <- c.nss
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.s.node.Stats().State
	for _, st := range []string{"Follower", "Candidate", "Leader", "Shutdown"} {
		v := 0.0
		if st == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, st)
	}
	n := c.s.fsm.Counts()
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(n.Leases), "live")
	if c.s.lessor.Primary() {
		ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(c.s.lessor.Len()), "tracked")
	}
	ch <- prometheus.MustNewConstMetric(c.proxies, prometheus.GaugeValue, float64(n.LiveProxies), "live")
	ch <- prometheus.MustNewConstMetric(c.proxies, prometheus.GaugeValue, float64(n.Proxies-n.LiveProxies), "stale")
	ch <- prometheus.MustNewConstMetric(c.nss, prometheus.GaugeValue, float64(n.Namespaces))
}

func (m *Metrics) observeForward(method string, err error, d time.Duration) {
	m.forwards.WithLabelValues(method, status.Code(err).String()).Inc()
	m.forwardTime.Observe(d.Seconds())
}

func (m *Metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	method := path.Base(info.FullMethod)
	m.rpcs.WithLabelValues(method, status.Code(err).String()).Inc()
	m.rpcTime.WithLabelValues(method).Observe(time.Since(start).Seconds())
	return resp, err
}

func (m *Metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := h(srv, ss)
	m.rpcs.WithLabelValues(path.Base(info.FullMethod), status.Code(err).String()).Inc()
	return err
}

// HTTPHandler serves /metrics, /healthz (the process is up) and /readyz
// (a leader is known, so writes can be served or forwarded, and this node
// is a voter: a joining one is not ready until it is made one).
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := s.notReady(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		l, _ := s.node.Leadership()
		_, _ = w.Write([]byte("ok: leader " + l.LeaderID + "\n"))
	})
	return mux
}
