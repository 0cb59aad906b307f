package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// MoveConfig times the leader's mover, which turns moves' progress into
// FSM commands (admin/fsm/move.go): the switch once the destination caught
// up, the end of the handoff tail, the abandon of a move gone wrong, and a
// Rebalance whenever planned moves wait and the limit has room.
type MoveConfig struct {
	// MaxLag is the most records the destination's mailbox may be behind
	// its topics' high watermarks, as its proxy reported, for the switch
	// (default 100); its stored positions must also have reached the
	// source's, or from proxies that report none, its lag the source's
	// (mover.caughtUp).
	MaxLag int64
	// HandoffTail is how long the source keeps serving after the switch
	// (default 12s: grpc-go gateways' cached lookup lives 10s, plus 2s for
	// queries in flight).
	HandoffTail time.Duration
	// Timeout abandons a move that has not switched this long after it
	// began (default 10m).
	Timeout time.Duration
	// MaxConcurrent bounds the moves in progress cluster-wide that
	// rebalancing starts (default 4).
	MaxConcurrent int
	// Interval is how often the mover looks (default 500ms).
	Interval time.Duration
}

func (c MoveConfig) withDefaults() MoveConfig {
	if c.MaxLag == 0 {
		c.MaxLag = 100
	}
	if c.HandoffTail == 0 {
		c.HandoffTail = 12 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 4
	}
	if c.Interval == 0 {
		c.Interval = 500 * time.Millisecond
	}
	return c
}

// lagReport is one proxy heartbeat's word on a namespace it hosts.
type lagReport struct {
	// index is the Raft index the heartbeat was committed at: a report
	// counts for a move only if it is newer than the move's start.
	index     uint64
	lag       int64
	lagKnown  bool
	available bool
	// positions are the mailbox's stored positions, the offset after its
	// last fsynced record per topic-partition; nil when the proxy or its
	// runner reports none.
	positions map[partitionKey]int64
}

type partitionKey struct {
	topic     string
	partition int32
}

// proxyReports is what one proxy's heartbeat reported.
type proxyReports struct {
	index      uint64
	namespaces map[string]lagReport
}

// proxyHistory is a proxy's last two heartbeats: the switch compares the
// destination's report with the source's last one before it (see
// mover.caughtUp), and with proxies heartbeating at the same interval the
// source's newest report is as often after the destination's as before.
type proxyHistory struct {
	cur, prev proxyReports
}

// lagReports keeps the lag proxies report in their heartbeats, in the
// leader's memory only. The heartbeats are Raft entries and the FSM keeps
// each proxy's last NamespaceHealth (lag included, at no extra entry), but
// what the mover needs is "reported after the move began", which the FSM
// record cannot say: it does not keep the index of the heartbeat that wrote
// it. The leader's heartbeat handler knows that index, and only the
// leader's mover reads the reports, so they live here, keyed by proxy, and
// are dropped when a term begins: a new leader waits for fresh reports
// rather than trusting ones it took as a follower.
type lagReports struct {
	mu sync.Mutex
	m  map[string]proxyHistory
}

func (r *lagReports) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m = map[string]proxyHistory{}
}

// note replaces proxy's reports with those of its heartbeat committed at
// index (a namespace it no longer reports is one it no longer hosts).
func (r *lagReports) note(proxy string, index uint64, health []*adminv1.NamespaceHealth) {
	reports := make(map[string]lagReport, len(health))
	for _, h := range health {
		r := lagReport{index: index, lag: h.GetLag(), lagKnown: h.GetLagKnown(), available: true}
		// A mailbox still being copied from a peer has ingested nothing
		// (docs/architecture.md#peer-recovery): whatever lag or positions it
		// reports, it has not caught up, so it is taken as one whose lag is
		// unknown, which caughtUp never switches to.
		if h.GetRecovery().GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPYING {
			r.lagKnown = false
		} else if ps := h.GetStoredPositions(); len(ps) > 0 {
			r.positions = make(map[partitionKey]int64, len(ps))
			for _, p := range ps {
				r.positions[partitionKey{p.GetTopic(), p.GetPartition()}] = p.GetNextOffset()
			}
		}
		reports[h.GetNamespace()] = r
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]proxyHistory{}
	}
	h := r.m[proxy]
	if h.cur.index > index {
		return // a later heartbeat's handler got here first
	}
	r.m[proxy] = proxyHistory{cur: proxyReports{index: index, namespaces: reports}, prev: h.cur}
}

// get is proxy's newest report on namespace.
func (r *lagReports) get(proxy, namespace string) lagReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[proxy].cur.namespaces[namespace]
}

// before is proxy's newest report on namespace from a heartbeat committed
// before index (not available if neither kept heartbeat was).
func (r *lagReports) before(proxy, namespace string, index uint64) lagReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.m[proxy]
	for _, p := range []proxyReports{h.cur, h.prev} {
		if p.index < index {
			return p.namespaces[namespace]
		}
	}
	return lagReport{}
}

// noteHeartbeat records a heartbeat this node committed as leader.
func (s *Server) noteHeartbeat(req *adminv1.ProxyHeartbeatRequest, resp *adminv1.ProxyHeartbeatResponse) {
	if !s.node.IsRaftLeader() {
		return
	}
	s.lag.note(req.GetProxyId(), resp.GetIndex(), req.GetNamespaceHealth())
}

// mover is one term's move driver; it remembers, per move, whether it saw
// the destination's lease, so a lease that goes away after it was acquired
// abandons the move (before the acquire, its absence is just catch-up not
// begun). A new leader starts without that memory; the timeout still bounds
// such a move.
type mover struct {
	s        *Server
	acquired map[moveKey]bool
}

type moveKey struct {
	namespace string
	index     uint64
}

func (s *Server) newMover() *mover {
	s.lag.reset()
	return &mover{s: s, acquired: map[moveKey]bool{}}
}

// tick looks at every move once and proposes what is due.
func (m *mover) tick(ctx context.Context) {
	defer m.s.moverTicks.Add(1)
	s, cfg := m.s, m.s.cfg.Moves
	now := s.cfg.Clock.Now()
	moves, _ := s.fsm.Moves()
	live := map[moveKey]bool{}
	for _, mv := range moves {
		n := mv.Namespace
		if mv.Role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF {
			if !now.Before(n.GetHandoffUntil().AsTime()) {
				m.propose(ctx, n.GetName(), &adminv1.Command{Body: &adminv1.Command_EndHandoff{EndHandoff: &adminv1.EndHandoffCommand{
					Namespace: n.GetName(), HandoffProxyId: mv.From, HandoffUntil: n.GetHandoffUntil(),
				}}})
			}
			continue
		}
		key := moveKey{n.GetName(), n.GetMoveIndex()}
		live[key] = true
		lease, _ := s.fsm.Lease(mesh.MailboxID{Namespace: n.GetName(), Proxy: mv.To}.String())
		switch {
		case now.Sub(n.GetMoveStartedAt().AsTime()) > cfg.Timeout:
			m.abandon(ctx, n, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_TIMEOUT)
		case lease == nil && m.acquired[key]:
			m.abandon(ctx, n, adminv1.MoveAbandonReason_MOVE_ABANDON_REASON_LEASE_LOST)
		case lease == nil:
		default:
			m.acquired[key] = true
			if m.caughtUp(n, mv.From, mv.To) {
				m.propose(ctx, n.GetName(), &adminv1.Command{Body: &adminv1.Command_SwitchMove{SwitchMove: &adminv1.SwitchMoveCommand{
					Namespace: n.GetName(), ToProxyId: mv.To, MoveIndex: n.GetMoveIndex(),
					HandoffUntil: timestamppb.New(now.Add(cfg.HandoffTail)),
				}}})
			}
		}
	}
	for k := range m.acquired {
		if !live[k] {
			delete(m.acquired, k)
		}
	}
	if pending, inProgress := s.fsm.PendingMoves(); pending > 0 && inProgress < cfg.MaxConcurrent {
		m.propose(ctx, "", &adminv1.Command{Body: &adminv1.Command_Rebalance{Rebalance: &adminv1.RebalanceCommand{
			MaxConcurrentMoves: uint32(cfg.MaxConcurrent),
		}}})
	}
}

// caughtUp says whether the move of n from the source to the destination
// may switch: the destination's history covers what the source serves.
// The destination's newest report, committed after the move began, must
// have a known lag within MaxLag. Unless the source holds no lease on its
// mailbox (then it serves nothing), the destination must also hold what
// the source held at its report, judged by stored positions when both
// proxies report them (caughtUpByPositions) and otherwise by lag
// (caughtUpByLag), for proxies or runners older than positions.
// docs/architecture.md, Moves, says what is left between the source's
// report and the switch.
func (m *mover) caughtUp(n *adminv1.Namespace, from, to string) bool {
	s, start := m.s, n.GetMoveIndex()
	dst := s.lag.get(to, n.GetName())
	if !dst.available || dst.index <= start || !dst.lagKnown || dst.lag > s.cfg.Moves.MaxLag {
		return false
	}
	if l, _ := s.fsm.Lease(mesh.MailboxID{Namespace: n.GetName(), Proxy: from}.String()); l == nil {
		return true
	}
	if src := s.lag.get(from, n.GetName()); dst.positions != nil && src.positions != nil {
		return m.caughtUpByPositions(n, src, from, to)
	}
	return m.caughtUpByLag(n, dst, from)
}

// caughtUpByPositions: the source's newest report, committed after the
// move began, against the destination's newest report no newer than it
// and also after the move began: for every partition the source reports,
// the destination's stored position is at least the source's. A stored
// position only grows, so the destination then holds every record the
// source had stored at its report, whenever either was measured; and the
// source's report being the newer one keeps what it stored after it to a
// heartbeat or less.
func (m *mover) caughtUpByPositions(n *adminv1.Namespace, src lagReport, from, to string) bool {
	start := n.GetMoveIndex()
	if src.index <= start {
		return false
	}
	dst := m.s.lag.before(to, n.GetName(), src.index+1)
	if !dst.available || dst.index <= start || dst.positions == nil {
		return false
	}
	for p, at := range src.positions {
		if got, ok := dst.positions[p]; !ok || got < at {
			return false
		}
	}
	return true
}

// caughtUpByLag: the source's last report committed after the move began
// and before the destination's newest must be known and at least the
// destination's lag. High watermarks only grow, so a destination as far
// behind them as the source was, measured later, holds at least as many
// records as the source held at its report; each lag is measured after its
// own runner's last stored batch, so the two can be a batch apart.
func (m *mover) caughtUpByLag(n *adminv1.Namespace, dst lagReport, from string) bool {
	src := m.s.lag.before(from, n.GetName(), dst.index)
	return src.available && src.index > n.GetMoveIndex() && src.lagKnown && dst.lag <= src.lag
}

func (m *mover) abandon(ctx context.Context, n *adminv1.Namespace, why adminv1.MoveAbandonReason) {
	m.propose(ctx, n.GetName(), &adminv1.Command{Body: &adminv1.Command_AbandonMove{AbandonMove: &adminv1.AbandonMoveCommand{
		Namespace: n.GetName(), Reason: why, MoveIndex: n.GetMoveIndex(),
	}}})
}

func (m *mover) propose(ctx context.Context, namespace string, cmd *adminv1.Command) {
	res, err := m.s.propose(ctx, cmd)
	if err != nil {
		m.s.log.Warn("commit move command", "command", fsm.CommandType(cmd), "namespace", namespace, "err", err)
		return
	}
	switch r := res.(type) {
	case *fsm.MoveResult:
		if r.Applied {
			m.s.log.Info("move", "command", fsm.CommandType(cmd), "namespace", namespace)
		} else {
			m.s.log.Debug("move command refused", "command", fsm.CommandType(cmd), "namespace", namespace, "reason", r.Refused)
		}
	case *fsm.RebalanceResult:
		if len(r.Started) > 0 {
			m.s.log.Info("rebalance started moves", "namespaces", r.Started)
		}
	}
}

// moveMetrics count moves' ends as this node applies them (every replica
// counts the same), by reason; moves in progress are read from the FSM at
// scrape time.
type moveMetrics struct {
	switched  *prometheus.CounterVec
	abandoned *prometheus.CounterVec
}

func newMoveMetrics() moveMetrics {
	return moveMetrics{
		switched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_moves_switched_total",
			Help: "Moves by handoff that switched to their destination, by why they began (operator, rebalance, drain).",
		}, []string{"reason"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_admin_moves_abandoned_total",
			Help: "Moves by handoff that ended without a switch, by reason; the source kept serving.",
		}, []string{"reason"}),
	}
}

var _ fsm.MoveObserver = (*Metrics)(nil)

// MoveSwitched counts a switch (fsm.MoveObserver).
func (m *Metrics) MoveSwitched(_ string, why adminv1.MoveReason) {
	m.moves.switched.WithLabelValues(reasonLabel(why.String(), "MOVE_REASON_")).Inc()
}

// MoveAbandoned counts an abandon (fsm.MoveObserver).
func (m *Metrics) MoveAbandoned(_ string, why adminv1.MoveAbandonReason) {
	m.moves.abandoned.WithLabelValues(reasonLabel(why.String(), "MOVE_ABANDON_REASON_")).Inc()
}

func reasonLabel(enum, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(enum, prefix))
}

// collectors are the counters and the in-progress gauge.
func (mm moveMetrics) collectors(s *Server) []prometheus.Collector {
	desc := prometheus.NewDesc("prism_admin_moves_in_progress", "Moves by handoff in this node's FSM, by state: catching_up (destination ingesting) or handing_off (switched, source in its tail).", []string{"state"}, nil)
	return []prometheus.Collector{mm.switched, mm.abandoned, movesGauge{desc: desc, s: s}}
}

type movesGauge struct {
	desc *prometheus.Desc
	s    *Server
}

func (g movesGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g movesGauge) Collect(ch chan<- prometheus.Metric) {
	moves, _ := g.s.fsm.Moves()
	var catching, handing float64
	for _, m := range moves {
		if m.Role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP {
			catching++
		} else {
			handing++
		}
	}
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, catching, "catching_up")
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, handing, "handing_off")
}
