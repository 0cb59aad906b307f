package runner

import (
	"github.com/prometheus/client_golang/prometheus"
)

// storeCollector reports every open mailbox's store usage and retention at scrape time, from counters the store
// keeps in memory, so a scrape never reads a store.
type storeCollector struct{ r *Runner }

var (
	descStoredEvents = prometheus.NewDesc("prism_mailbox_stored_events",
		"Events stored in the mailbox, as GetStats counts them.", []string{"mailbox"}, nil)
	descStoredBytes = prometheus.NewDesc("prism_mailbox_stored_bytes",
		"Envelope bytes stored in the mailbox, as GetStats counts them.", []string{"mailbox"}, nil)
	descFloor = prometheus.NewDesc("prism_mailbox_retention_floor_timestamp_seconds",
		"Event time below which retention has deleted the mailbox's events; absent until it deletes any.", []string{"mailbox"}, nil)
	descDeleted = prometheus.NewDesc("prism_mailbox_retention_deleted_events_total",
		"Events deleted by retention since the mailbox was opened.", []string{"mailbox"}, nil)
	descDeletedBytes = prometheus.NewDesc("prism_mailbox_retention_deleted_bytes_total",
		"Envelope bytes deleted by retention since the mailbox was opened.", []string{"mailbox"}, nil)
	descSwept = prometheus.NewDesc("prism_mailbox_retention_swept_events_total",
		"Deleted events whose keys the retention sweep has removed since the mailbox was opened; "+
			"deleted minus swept is the sweep's backlog.", []string{"mailbox"}, nil)
	descOpenFailed = prometheus.NewDesc("prism_mailbox_open_failed",
		"1 for a mailbox whose last store open failed (see /readyz for why); absent once one succeeds.", []string{"mailbox"}, nil)
)

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStoredEvents, descStoredBytes, descFloor, descDeleted, descDeletedBytes, descSwept, descOpenFailed} {
		ch <- d
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.mu.RLock()
	defer c.r.mu.RUnlock()
	for id := range c.r.failed {
		ch <- prometheus.MustNewConstMetric(descOpenFailed, prometheus.GaugeValue, 1, id)
	}
	for id, mb := range c.r.mailboxes {
		u := mb.store.Load().Usage()
		ch <- prometheus.MustNewConstMetric(descStoredEvents, prometheus.GaugeValue, float64(u.Events), id)
		ch <- prometheus.MustNewConstMetric(descStoredBytes, prometheus.GaugeValue, float64(u.Bytes), id)
		if !u.Floor.IsZero() {
			ch <- prometheus.MustNewConstMetric(descFloor, prometheus.GaugeValue, float64(u.Floor.UnixMilli())/1000, id)
		}
		ch <- prometheus.MustNewConstMetric(descDeleted, prometheus.CounterValue, float64(u.Deleted), id)
		ch <- prometheus.MustNewConstMetric(descDeletedBytes, prometheus.CounterValue, float64(u.DeletedBytes), id)
		ch <- prometheus.MustNewConstMetric(descSwept, prometheus.CounterValue, float64(u.Swept), id)
	}
}
