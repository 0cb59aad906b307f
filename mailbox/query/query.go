// Package query serves mailboxes over gRPC (prism.mailbox.v1.MailboxQuery,
// mailbox named by x-mailbox-id metadata, or by its namespace in
// x-prism-namespace) and HTTP/JSON (/v1/mailboxes/{id}/… and
// /v1/namespaces/{namespace}/…).
//
// The runner is the authority on what it serves: the gateways route every
// query for a mailbox id ending in @P to proxy P's runner, whatever the
// lease says, so these servers ask Mailboxes on every request and answer
// only for a mailbox it holds right now (a runner's lease-driven mailboxes
// are there only while their lease is, see mailbox/control). Anything else
// is NotFound (HTTP 404) naming the mailbox or namespace asked for. Every
// answer from a mailbox, success or refusal, carries x-prism-mailbox and
// x-prism-epoch (the lease epoch it is served under), as gRPC header
// metadata or HTTP headers; a refusal for a mailbox not served here carries
// neither, so a client cannot take it for a holder's word.
package query

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Source is a mailbox's read side; *store.Store is one.
type Source interface {
	Query(ctx context.Context, f *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error)
	Get(ctx context.Context, messageID string) (*mailboxv1.MailboxItem, error)
	Stats(ctx context.Context) (*mailboxv1.MailboxStats, error)
}

// Mailboxes finds the mailboxes a runner serves right now.
type Mailboxes interface {
	// Mailbox returns the mailbox's read side and the lease epoch it is served
	// under (0 without a lease), or ok=false if it is not served here.
	Mailbox(id string) (src Source, epoch uint64, ok bool)
	// IDs lists the mailboxes served here.
	IDs() []string
}

// ErrClosed is what a Source returns for a mailbox closed while a request was
// on its way; it is answered Unavailable / 503 so the client retries, by then
// routed to the mailbox's new holder.
var ErrClosed = errors.New("mailbox closed")

// MaxResponseBytes bounds one answer of the query API (its protobuf size;
// the JSON form is somewhat larger). A page of MaxQueryLimit large events
// could otherwise be hundreds of MiB, built in memory and sent to a client
// that would refuse it: grpc-go receives at most 4 MiB unless told
// otherwise. A larger page is refused, naming how to ask for less.
const MaxResponseBytes = 16 << 20

// bounded refuses a page over MaxResponseBytes: OutOfRange (HTTP 400, not a
// 429 a client would retry as it is) saying to ask for fewer events.
func bounded(resp *mailboxv1.QueryEventsResponse) error {
	if n := proto.Size(resp); n > MaxResponseBytes {
		return status.Errorf(codes.OutOfRange, "the answer would be %d bytes, over the bound of %d: ask for fewer events than %d (limit) or narrow the filter",
			n, MaxResponseBytes, len(resp.GetItems()))
	}
	return nil
}

// code maps a store error to the gRPC code both servers report (HTTP maps the
// code to a status).
func code(err error) codes.Code {
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, ErrClosed):
		return codes.Unavailable
	case errors.Is(err, store.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, store.ErrInvalidFilter):
		return codes.InvalidArgument
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Internal
}

// Metrics are the query figures of every mailbox on one registry.
type Metrics struct {
	latency *prometheus.HistogramVec
	served  *prometheus.CounterVec

	// perMailbox is served summed over its other labels, kept beside it so
	// the runner's control API reads a count rather than gathering the
	// registry and matching metric names.
	mu         sync.Mutex
	perMailbox map[string]int64

	// observer, when set, learns the latency of every answer from a hosted mailbox.
	observer LatencyObserver
}

// LatencyObserver learns how long answers take: the runner's ingest governor,
// which holds ingest back while they are slow.
type LatencyObserver interface{ Observe(time.Duration) }

// ReportTo makes m tell o the latency of every answer from a hosted mailbox.
// It is set before the servers start.
func (m *Metrics) ReportTo(o LatencyObserver) { m.observer = o }

// NewMetrics registers the query metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prism_mailbox_query_seconds",
			Help:    "Query latency by API (grpc, http) and method.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"api", "method"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_queries_total",
			Help: "Queries answered for a hosted mailbox, by API, method and gRPC code.",
		}, []string{"mailbox", "api", "method", "code"}),
	}
	m.perMailbox = map[string]int64{}
	reg.MustRegister(m.latency, m.served)
	return m
}

// observe records one request; mailbox is "" when the request named no hosted
// mailbox, which keeps made-up ids out of the label set.
func (m *Metrics) observe(api, method, mailbox string, start time.Time, c codes.Code) {
	d := time.Since(start)
	m.latency.WithLabelValues(api, method).Observe(d.Seconds())
	if mailbox != "" {
		if m.observer != nil {
			m.observer.Observe(d)
		}
		m.served.WithLabelValues(mailbox, api, method, c.String()).Inc()
		m.mu.Lock()
		m.perMailbox[mailbox]++
		m.mu.Unlock()
	}
}

// Served is the number of queries answered for mailbox since it was opened
// (or last forgotten), over every API, method and code: the sum of its
// prism_mailbox_queries_total series.
func (m *Metrics) Served(mailbox string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.perMailbox[mailbox]
}

// Forget drops a closed mailbox's series.
func (m *Metrics) Forget(mailbox string) {
	m.served.DeletePartialMatch(prometheus.Labels{"mailbox": mailbox})
	m.mu.Lock()
	delete(m.perMailbox, mailbox)
	m.mu.Unlock()
}
