package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-mesh/prism/admin/fsm"
)

// PeriodicConfig is prism admin's --backup-dir, --backup-interval and
// --backup-retain.
//
// Every node writes its own, from its own FSM, leader or not: the backup dir
// is normally the node's own volume, and a disaster that loses the leader's
// disk (the quorum loss backups exist for) must leave the survivors with a
// recent file. A follower's FSM is a prefix of the log like the leader's,
// behind by its replication lag; the file records its index and term.
type PeriodicConfig struct {
	Dir      string
	Interval time.Duration
	// Retain is how many files to keep; older ones are removed after each
	// successful write.
	Retain int
	FSM    *fsm.FSM
	Node   Node
	Logger *slog.Logger
	// Registry receives prism_admin_backup_failures_total and
	// prism_admin_backup_last_success_timestamp_seconds.
	Registry prometheus.Registerer
}

// Periodic writes snapshot files on a timer.
type Periodic struct {
	cfg         PeriodicConfig
	failures    prometheus.Counter
	lastSuccess prometheus.Gauge
}

// File names are prism-<node>-<UTC time>-<index>.snap; the fixed-width time
// sorts them oldest first.
const (
	filePrefix = "prism-"
	fileSuffix = ".snap"
	timeLayout = "20060102T150405.000Z"
)

// NewPeriodic checks the config, creates the dir and registers the metrics.
func NewPeriodic(cfg PeriodicConfig) (*Periodic, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("backup: a dir is required")
	case cfg.Interval <= 0:
		return nil, fmt.Errorf("backup: interval %s must be positive", cfg.Interval)
	case cfg.Retain < 1:
		return nil, fmt.Errorf("backup: retain %d must be at least 1", cfg.Retain)
	case cfg.FSM == nil || cfg.Node == nil:
		return nil, errors.New("backup: fsm and node are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("backup dir: %w", err)
	}
	p := &Periodic{
		cfg: cfg,
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_admin_backup_failures_total",
			Help: "Periodic snapshot files (--backup-dir) that could not be written.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prism_admin_backup_last_success_timestamp_seconds",
			Help: "Unix time of the last periodic snapshot file written (0: none since start).",
		}),
	}
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{p.failures, p.lastSuccess} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("backup metrics: %w", err)
			}
		}
	}
	return p, nil
}

// Run writes a file every interval until ctx ends. A failure is logged and
// counted, and the next tick tries again.
func (p *Periodic) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := p.Once(time.Now()); err != nil {
			p.failures.Inc()
			p.cfg.Logger.Error("periodic snapshot failed", "dir", p.cfg.Dir, "err", err)
		}
	}
}

// Once writes one snapshot file and prunes the old ones, returning the new
// file's path.
func (p *Periodic) Once(now time.Time) (string, error) {
	info, data, err := Capture(p.cfg.FSM, p.cfg.Node, now)
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("%s%s-%s-%d%s", filePrefix, p.cfg.Node.ID(), now.UTC().Format(timeLayout), info.GetIndex(), fileSuffix)
	path := filepath.Join(p.cfg.Dir, name)
	if err := WriteFile(path, info, bytes.NewReader(data)); err != nil {
		return "", err
	}
	p.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	p.cfg.Logger.Info("wrote periodic snapshot", "path", path, "index", info.GetIndex(), "term", info.GetTerm(), "bytes", info.GetSize())
	if err := p.prune(); err != nil {
		return path, fmt.Errorf("prune %s: %w", p.cfg.Dir, err)
	}
	return path, nil
}

// prune removes this node's oldest files beyond Retain.
func (p *Periodic) prune() error {
	entries, err := os.ReadDir(p.cfg.Dir)
	if err != nil {
		return err
	}
	prefix := filePrefix + p.cfg.Node.ID() + "-"
	var ours []string
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && strings.HasPrefix(n, prefix) && strings.HasSuffix(n, fileSuffix) {
			ours = append(ours, n)
		}
	}
	slices.Sort(ours)
	var errs []error
	for _, n := range ours[:max(0, len(ours)-p.cfg.Retain)] {
		if err := os.Remove(filepath.Join(p.cfg.Dir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
