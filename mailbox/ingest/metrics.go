package ingest

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ingest figures of every mailbox on one registry, labelled by
// mailbox id. A runner makes one Metrics and passes it to each Ingester.
type Metrics struct {
	consumed     *prometheus.CounterVec
	stored       *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	expired      *prometheus.CounterVec
	retries      *prometheus.CounterVec
	stalls       *prometheus.CounterVec
	stalled      *prometheus.GaugeVec
	paused       *prometheus.GaugeVec
	lag          *prometheus.GaugeVec
	batchWrite   *prometheus.HistogramVec
}

// NewMetrics registers the ingest metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_events_consumed_total",
			Help: "Kafka records taken from the mailbox's topics.",
		}, []string{"mailbox"}),
		stored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_events_stored_total",
			Help: "Items durably written to the mailbox store (duplicates excluded).",
		}, []string{"mailbox"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_events_dead_lettered_total",
			Help: "Records produced to <topic>.dlq, by rejection reason.",
		}, []string{"mailbox", "reason"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_duplicates_dropped_total",
			Help: "Records whose message_id was already stored (redeliveries and duplicates).",
		}, []string{"mailbox"}),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_events_expired_total",
			Help: "Records older than the mailbox's retention floor on arrival, so not stored.",
		}, []string{"mailbox"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_ingest_retries_total",
			Help: "Failed store writes or DLQ produces that were retried, by target.",
		}, []string{"mailbox", "target"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prism_mailbox_ingest_stalls_total",
			Help: "Store writes or DLQ produces that failed Config.StallAfter times in a row, stalling their partition.",
		}, []string{"mailbox", "target"}),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prism_mailbox_ingest_stalled",
			Help: "1 while a write of the partition has failed Config.StallAfter times and is still being retried.",
		}, []string{"mailbox", "topic", "partition", "target"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prism_mailbox_ingest_paused",
			Help: "1 while the partition's next store write is held back because the store's disk is short of space.",
		}, []string{"mailbox", "topic", "partition"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prism_mailbox_consumer_lag",
			Help: "Records between the partition's high watermark and the last processed record.",
		}, []string{"mailbox", "topic", "partition"}),
		batchWrite: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prism_mailbox_batch_write_seconds",
			Help:    "Latency of one durable store write of a batch.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"mailbox"}),
	}
	reg.MustRegister(m.consumed, m.stored, m.deadLettered, m.duplicates, m.expired, m.retries, m.stalls, m.stalled, m.paused, m.lag, m.batchWrite)
	return m
}

// forget drops the per-mailbox series of a closed mailbox.
func (m *Metrics) forget(mailbox string) {
	l := prometheus.Labels{"mailbox": mailbox}
	m.consumed.DeletePartialMatch(l)
	m.stored.DeletePartialMatch(l)
	m.deadLettered.DeletePartialMatch(l)
	m.duplicates.DeletePartialMatch(l)
	m.expired.DeletePartialMatch(l)
	m.retries.DeletePartialMatch(l)
	m.stalls.DeletePartialMatch(l)
	m.stalled.DeletePartialMatch(l)
	m.paused.DeletePartialMatch(l)
	m.lag.DeletePartialMatch(l)
	m.batchWrite.DeletePartialMatch(l)
}

func (m *Metrics) setLag(mailbox, topic string, partition int32, lag int64) {
	m.lag.WithLabelValues(mailbox, topic, strconv.Itoa(int(partition))).Set(float64(lag))
}
