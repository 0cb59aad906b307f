package query

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
)

// Served must agree with prism_mailbox_queries_total summed per mailbox:
// the runner's control API reports one and dashboards the other.
func TestServedMatchesTheCounter(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	start := time.Now()
	for _, o := range []struct {
		api, method, mailbox string
		code                 codes.Code
	}{
		{"http", "QueryEvents", "a@p", codes.OK},
		{"http", "QueryEvents", "a@p", codes.OK},
		{"grpc", "GetEvent", "a@p", codes.NotFound},
		{"grpc", "GetEvent", "b@p", codes.OK},
		{"http", "GetStats", "", codes.NotFound},
	} {
		m.observe(o.api, o.method, o.mailbox, start, o.code)
	}
	tests := []struct {
		mailbox string
		want    int64
	}{{"a@p", 3}, {"b@p", 1}, {"", 0}, {"nope@p", 0}}
	for _, tc := range tests {
		if got := m.Served(tc.mailbox); got != tc.want {
			t.Errorf("Served(%q) = %d, want %d", tc.mailbox, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(m.served.WithLabelValues("a@p", "http", "QueryEvents", "OK")); got != 2 {
		t.Fatalf("prism_mailbox_queries_total{a@p,http,QueryEvents,OK} = %v, want 2: the metric itself is unchanged", got)
	}
	m.Forget("a@p")
	if got := m.Served("a@p"); got != 0 {
		t.Fatalf("Served after Forget = %d, want 0 like the forgotten series", got)
	}
	if got := m.Served("b@p"); got != 1 {
		t.Fatalf("Forget(a@p) changed b@p: %d", got)
	}
	if n := testutil.CollectAndCount(m.served); n != 1 {
		t.Fatalf("%d series left after Forget(a@p), want b@p's one", n)
	}
}

type latencies []time.Duration

func (l *latencies) Observe(d time.Duration) { *l = append(*l, d) }

// The governor behind ReportTo hears of every answer from a hosted mailbox,
// refusals included (they took a core too), with the latency the histogram
// records, and of nothing asked of a mailbox not served here.
func TestReportToHearsHostedAnswers(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry())
	var got latencies
	m.ReportTo(&got)
	start := time.Now().Add(-20 * time.Millisecond)
	m.observe("http", "QueryEvents", "a@p", start, codes.OK)
	m.observe("grpc", "GetEvent", "a@p", start, codes.NotFound)
	m.observe("http", "GetStats", "", start, codes.NotFound)
	if len(got) != 2 {
		t.Fatalf("observer heard %d answers, want 2 (the hosted mailbox's)", len(got))
	}
	for _, d := range got {
		if d < 20*time.Millisecond {
			t.Fatalf("observer heard %v, want at least the 20ms since start", d)
		}
	}
}
