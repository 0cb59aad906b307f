package raftnode

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLogStatsSinceSnapshot: the entries since the last snapshot count every
// applied write, a snapshot brings them back to none and moves the snapshot
// index past them, the WAL's bytes are its segment files', and the
// collector exports them as gauges.
func TestLogStatsSinceSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A threshold no test run reaches: only the explicit Snapshot below
	// takes one.
	n, err := New(Config{ID: "s", DataDir: t.TempDir(), Listener: listen(t), Bootstrap: true, Timing: FastTiming(),
		SnapshotThreshold: 1 << 20, Logger: quietLogger()}, newKV())
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, n)
	waitLeader(t, n)
	before := n.LogStats()
	const writes = 50
	for i := range writes {
		if _, _, err := n.Apply(ctx, fmt.Appendf(nil, "k%d=v", i)); err != nil {
			t.Fatal(err)
		}
	}
	grown := n.LogStats()
	if grown.EntriesSinceSnapshot < before.EntriesSinceSnapshot+writes {
		t.Fatalf("entries since snapshot %d after %d writes, was %d", grown.EntriesSinceSnapshot, writes, before.EntriesSinceSnapshot)
	}
	if grown.WALBytes <= 0 {
		t.Fatalf("WAL bytes %d after %d writes on disk", grown.WALBytes, writes)
	}
	if grown.SnapshotThreshold != 1<<20 {
		t.Fatalf("snapshot threshold %d, want the configured %d", grown.SnapshotThreshold, 1<<20)
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(n.LogCollector())
	want := fmt.Sprintf(`
# HELP prism_admin_raft_snapshot_threshold Entries since the last snapshot at which raft takes the next one (checked every snapshot interval).
# TYPE prism_admin_raft_snapshot_threshold gauge
prism_admin_raft_snapshot_threshold %d
`, 1<<20)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "prism_admin_raft_snapshot_threshold"); err != nil {
		t.Fatal(err)
	}
	if got := gathered(t, reg, "prism_admin_raft_log_entries_since_snapshot"); got < writes {
		t.Fatalf("exported entries since snapshot %v, want at least %d", got, writes)
	}
	if got := gathered(t, reg, "prism_admin_raft_wal_bytes"); got <= 0 {
		t.Fatalf("exported WAL bytes %v", got)
	}

	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	after := n.LogStats()
	if after.EntriesSinceSnapshot != 0 {
		t.Fatalf("entries since snapshot %d right after a snapshot, want 0", after.EntriesSinceSnapshot)
	}
	if after.SnapshotIndex < before.SnapshotIndex+writes {
		t.Fatalf("snapshot index %d after a snapshot of %d more writes, was %d", after.SnapshotIndex, writes, before.SnapshotIndex)
	}
	if got := gathered(t, reg, "prism_admin_raft_snapshot_index"); got != float64(after.SnapshotIndex) {
		t.Fatalf("exported snapshot index %v, want %d", got, after.SnapshotIndex)
	}
}

// gathered is the value of the one gauge named name that reg gathers.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single gauge %s gathered", name)
	return 0
}
