// Package sidecare2e runs the lease sidecar against real processes on
// loopback, started by testkit/e2e: `prism admin` (raft-wal on temp dirs,
// real TCP transport), `prism runner` consuming an in-process kfake broker
// over TCP, and `prism sidecar` between them, with testkit/faultproxy where
// the network must fail.
package sidecare2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
)

const (
	topic     = "audit.events"
	namespace = "audit"
	proxyID   = "proxy-1"
	mailboxID = namespace + "@" + proxyID
)

// Lease timing of the tests: short enough to observe expiry, long enough for
// a loaded 2-core machine.
var (
	ttl      = 3 * time.Second
	grace    = 2 * time.Second
	interval = 500 * time.Millisecond
	lease    = e2e.Lease{TTL: ttl, Grace: grace, Heartbeat: interval}
)

var web = e2e.NewHTTP(2 * time.Second)

// envelopes are n valid envelopes, ids prefix-0000 on.
func envelopes(prefix string, n int) []*envelopev1.PrismEnvelope {
	out := make([]*envelopev1.PrismEnvelope, n)
	for i := range out {
		id := fmt.Sprintf("%s-%04d", prefix, i)
		out[i] = &envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata:        &envelopev1.PrismMetadata{MessageId: id, Topic: topic, PublishedAt: timestamppb.Now(), CorrelationId: "c"},
			Security:        &envelopev1.SecurityContext{PublisherId: "user-1"},
			Observability:   &envelopev1.ObservabilityContext{TraceId: "trace-" + id},
		}
	}
	return out
}

// leaseOf returns the mailbox's lease as n sees it (linearizable), or nil.
func leaseOf(n *e2e.AdminNode) (*adminv1.Lease, error) { return leaseOfMailbox(n, mailboxID) }

// leaseOfMailbox returns mailbox id's lease as n sees it (linearizable), or
// nil.
func leaseOfMailbox(n *e2e.AdminNode, id string) (*adminv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.Admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		return nil, err
	}
	for _, l := range resp.GetLeases() {
		if l.GetMailboxId() == id {
			return l, nil
		}
	}
	return nil, nil
}

func route(n *e2e.AdminNode) (*adminv1.Route, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.Admin().ListRoutes(ctx, &adminv1.ListRoutesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		return nil, err
	}
	for _, r := range resp.GetRoutes() {
		if r.GetMailboxId() == mailboxID {
			return r, nil
		}
	}
	return nil, nil
}

// renewals is how many renewals the sidecar at base had acknowledged: its
// mailbox heartbeats (mailbox lease mode) plus its session keepalives, so
// that with one mailbox a renewal is one either way.
func renewals(base string) (float64, error) {
	var sum float64
	for _, name := range []string{"prism_sidecar_heartbeats_total", "prism_sidecar_session_keepalives_total"} {
		v, err := web.Metric(base, name, `result="renewed"`)
		if err != nil && !errors.Is(err, e2e.ErrNoSeries) {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// startRunner starts a runner for a sidecar.
func startRunner(t testing.TB, name string, brokers []string) *e2e.Runner {
	t.Helper()
	return e2e.StartRunner(t, e2e.RunnerOptions{Name: name, Brokers: brokers, Args: []string{"--batch-wait", "20ms", "--log-format", "json"}})
}

// startSidecar starts a sidecar holding r's leases.
func startSidecar(t testing.TB, name, runnerID string, r *e2e.Runner, admins ...string) *e2e.Sidecar {
	t.Helper()
	return e2e.StartSidecar(t, e2e.SidecarOptions{Name: name, ProxyID: proxyID, RunnerID: runnerID, Runner: r, Admins: admins, Lease: lease})
}

// mailboxStats is the runner's HTTP stats for the mailbox: status code, the
// epoch it serves under and the events it stored.
func mailboxStats(r *e2e.Runner) (int, uint64, int64, error) { return mailboxStatsOf(r, mailboxID) }

// mailboxStatsOf is mailboxStats of mailbox id.
func mailboxStatsOf(r *e2e.Runner, id string) (int, uint64, int64, error) {
	code, body, _, err := web.Get(r.QueryURL() + "/v1/mailboxes/" + id + "/stats")
	if err != nil || code != 200 {
		return code, 0, 0, err
	}
	var st struct {
		TotalEvents int64  `json:"total_events"`
		Epoch       uint64 `json:"epoch"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return code, 0, 0, fmt.Errorf("stats %q: %w", body, err)
	}
	return code, st.Epoch, st.TotalEvents, nil
}

// timeline records what happened when, printed with the test's output so
// the figures behind each assertion are visible.
type timeline struct {
	mu    sync.Mutex
	start time.Time
	rows  []string
}

func newTimeline() *timeline { return &timeline{start: time.Now()} }

func (tl *timeline) mark(format string, args ...any) time.Time {
	now := time.Now()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.rows = append(tl.rows, fmt.Sprintf("%8.3fs  %s", now.Sub(tl.start).Seconds(), fmt.Sprintf(format, args...)))
	return now
}

func (tl *timeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.rows, "\n")
}
