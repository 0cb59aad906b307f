package raftnode

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// LogStats is how far the Raft log has grown since the last snapshot, the
// point up to which raft may truncate it.
type LogStats struct {
	// EntriesSinceSnapshot is the last log index minus the last snapshot's.
	// Raft snapshots once it passes SnapshotThreshold (checked every
	// SnapshotInterval), so it stays below about the threshold; a value far
	// above means snapshots fail or never start, and the log, the WAL on
	// disk and a restart's replay grow without bound.
	EntriesSinceSnapshot uint64
	// SnapshotIndex is the last snapshot's index: it moves with every
	// snapshot, so a value unchanged for long while EntriesSinceSnapshot is
	// past the threshold is raft failing to snapshot.
	SnapshotIndex uint64
	// SnapshotThreshold is the node's configured threshold, for comparing.
	SnapshotThreshold uint64
	// WALBytes is the size of the WAL's segment files (0 for an in-memory
	// node).
	WALBytes int64
}

// LogStats reads the log's growth: raft's indexes, and the WAL directory's
// segment files at the moment of the call.
func (n *Node) LogStats() LogStats {
	st := n.raft.Stats()
	last, _ := strconv.ParseUint(st["last_log_index"], 10, 64)
	snap, _ := strconv.ParseUint(st["last_snapshot_index"], 10, 64)
	out := LogStats{SnapshotIndex: snap, SnapshotThreshold: n.cfg.SnapshotThreshold}
	if last > snap {
		out.EntriesSinceSnapshot = last - snap
	}
	if n.cfg.DataDir != "" {
		out.WALBytes = walBytes(filepath.Join(n.cfg.DataDir, "wal"))
	}
	return out
}

// walBytes sums raft-wal's segment files; a file removed between listing
// and stat (a truncation) is simply not counted.
func walBytes(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".wal") {
			continue
		}
		if info, err := e.Info(); err == nil {
			total += info.Size()
		}
	}
	return total
}

// LogCollector exports LogStats at scrape time for the log-growth alert
// (helm/prism/files/prometheus-rules.yaml, PrismAdminLogGrowth).
func (n *Node) LogCollector() prometheus.Collector {
	return &logCollector{
		n: n,
		entries: prometheus.NewDesc("prism_admin_raft_log_entries_since_snapshot",
			"Raft log entries after the last snapshot's index (raft snapshots past prism_admin_raft_snapshot_threshold).", nil, nil),
		index: prometheus.NewDesc("prism_admin_raft_snapshot_index",
			"Raft index of the node's last snapshot (it moves with every snapshot).", nil, nil),
		threshold: prometheus.NewDesc("prism_admin_raft_snapshot_threshold",
			"Entries since the last snapshot at which raft takes the next one (checked every snapshot interval).", nil, nil),
		bytes: prometheus.NewDesc("prism_admin_raft_wal_bytes",
			"Bytes of the Raft WAL's segment files on disk.", nil, nil),
	}
}

type logCollector struct {
	n                                *Node
	entries, index, threshold, bytes *prometheus.Desc
}

func (c *logCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.index
	ch <- c.threshold
	ch <- c.bytes
}

func (c *logCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.n.LogStats()
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(s.EntriesSinceSnapshot))
	ch <- prometheus.MustNewConstMetric(c.index, prometheus.GaugeValue, float64(s.SnapshotIndex))
	ch <- prometheus.MustNewConstMetric(c.threshold, prometheus.GaugeValue, float64(s.SnapshotThreshold))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(s.WALBytes))
}
