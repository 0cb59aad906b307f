package server

import (
	"errors"

	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sessionMetrics count sessions' keepalives and ends
// (docs/architecture.md#sessions). A keepalive
// or close is counted on the node the caller reached (a forward is counted
// there, not again on the leader); an expiry on the leader that committed
// it. The open sessions and their leases are read from the FSM at scrape.
type sessionMetrics struct {
	keepalives *prometheus.CounterVec
	ended      *prometheus.CounterVec
	leasesEnd  *prometheus.CounterVec
}

func newSessionMetrics() sessionMetrics {
	return sessionMetrics{
		keepalives: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_session_keepalives_total",
			Help: "Session keepalives answered, by result: renewed, or refused as expired, unknown_session, permission_denied, invalid, not_leader (no leader reachable or confirmed) or error.",
		}, []string{"result"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_sessions_ended_total",
			Help: "Sessions ended, by reason: expired (silent past ttl + grace, committed by this node as leader) or closed (by their sidecar, through this node).",
		}, []string{"reason"}),
		leasesEnd: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_session_leases_ended_total",
			Help: "Mailbox leases ended with their session, by the session's end: expired or closed.",
		}, []string{"reason"}),
	}
}

// sessionLeaseBuckets reach MaxBulkLeases: a proxy's whole share.
var sessionLeaseBuckets = []float64{0, 1, 10, 100, 1000, 10000}

// collectors are the counters and the scrape-time view of open sessions.
func (sm sessionMetrics) collectors(s *Server) []prometheus.Collector {
	return []prometheus.Collector{sm.keepalives, sm.ended, sm.leasesEnd, &sessionCollector{
		s:    s,
		open: prometheus.NewDesc("prism_admin_sessions", "Sessions open in the FSM.", nil, nil),
		leases: prometheus.NewDesc("prism_admin_session_leases",
			"Mailbox leases per open session (the sum is every lease held in a session).", nil, nil),
	}}
}

// keepAlive counts one keepalive's answer.
func (sm sessionMetrics) keepAlive(resp *adminv1.KeepAliveSessionResponse, err error) {
	result := "renewed"
	switch {
	case err == nil && resp.GetRenewed():
	case err == nil:
		result = reasonLabel(resp.GetRefusal().GetReason().String(), "LEASE_REFUSAL_REASON_")
	case errors.Is(err, raftnode.ErrNotLeader), status.Code(err) == codes.Unavailable:
		result = "not_leader"
	case status.Code(err) == codes.PermissionDenied:
		result = "permission_denied"
	case status.Code(err) == codes.InvalidArgument:
		result = "invalid"
	default:
		result = "error"
	}
	sm.keepalives.WithLabelValues(result).Inc()
}

// sessionEnded counts a session ended for reason with its leases.
func (sm sessionMetrics) sessionEnded(reason string, leases int) {
	sm.ended.WithLabelValues(reason).Inc()
	sm.leasesEnd.WithLabelValues(reason).Add(float64(leases))
}

type sessionCollector struct {
	s            *Server
	open, leases *prometheus.Desc
}

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.open
	ch <- c.leases
}

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	sessions, _ := c.s.fsm.Sessions()
	buckets := make(map[float64]uint64, len(sessionLeaseBuckets))
	var sum float64
	for _, sess := range sessions {
		n := float64(sess.GetLeaseCount())
		sum += n
		for _, b := range sessionLeaseBuckets {
			if n <= b {
				buckets[b]++
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(len(sessions)))
	ch <- prometheus.MustNewConstHistogram(c.leases, uint64(len(sessions)), sum, buckets)
}
