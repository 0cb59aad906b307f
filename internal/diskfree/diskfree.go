// Package diskfree keeps a data directory's filesystem above a free-space
// watermark. A writer that fills the directory (a mailbox's ingest, the
// admin's Raft log) asks a Guard before it writes and holds back while the
// filesystem is short, instead of writing until it is full: there Badger's
// memory-mapped files fault (SIGBUS kills the process) and raft-wal fails
// mid-append. The guard says the filesystem is short below the watermark and
// has space again only at the watermark plus a margin, so a writer that
// resumes does not flap at the line.
//
// A Guard reads the filesystem on demand (statfs, a few microseconds), never
// in the background: every Check, Err and scrape is current.
package diskfree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Usage is a filesystem's size and the bytes an unprivileged writer may
// still use on it (statfs f_bavail, not f_bfree: the root reserve is not
// ours to fill), and its free and total inodes (f_ffree, f_files; both 0 on
// a filesystem without a fixed inode table, such as btrfs).
type Usage struct{ Free, Total, FreeInodes, Inodes uint64 }

// Statfs is the usage of the filesystem holding dir.
func Statfs(dir string) (Usage, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return Usage{}, &fs.PathError{Op: "statfs", Path: dir, Err: err}
	}
	bs := uint64(st.Bsize)
	return Usage{Free: st.Bavail * bs, Total: st.Blocks * bs, FreeInodes: st.Ffree, Inodes: st.Files}, nil
}

// Watermark is how much of its filesystem a data directory keeps free: at
// least MinBytes and at least MinPercent of the filesystem's size, and at
// least MinInodes inodes (a filesystem out of inodes refuses new files with
// ENOSPC however many bytes it has: Badger's next table or value log, the
// next raft-wal segment). They are the --min-free-bytes, --min-free-percent
// and --min-free-inodes flags of prism runner and prism admin, which the
// errors name. Zero in all three turns the guard off.
type Watermark struct {
	MinBytes   uint64
	MinPercent float64
	MinInodes  uint64
}

// Validate refuses a percentage outside [0, 100).
func (w Watermark) Validate() error {
	if w.MinPercent < 0 || w.MinPercent >= 100 {
		return fmt.Errorf("--min-free-percent %v: must be at least 0 and below 100", w.MinPercent)
	}
	return nil
}

func (w Watermark) enabled() bool { return w.MinBytes > 0 || w.MinPercent > 0 || w.MinInodes > 0 }

// inodesShort reports free inodes below MinInodes, or, resuming, below
// MinInodes plus its margin; never on a filesystem that counts none.
func (w Watermark) inodesShort(u Usage, resuming bool) bool {
	if w.MinInodes == 0 || u.Inodes == 0 {
		return false
	}
	if resuming {
		return u.FreeInodes < w.MinInodes+margin(w.MinInodes)
	}
	return u.FreeInodes < w.MinInodes
}

// need is the free bytes the watermark asks for on a filesystem of total
// bytes, and the flag that sets it.
func (w Watermark) need(total uint64) (uint64, string) {
	pct := uint64(float64(total) * w.MinPercent / 100)
	if pct > w.MinBytes {
		return pct, "--min-free-percent " + strconv.FormatFloat(w.MinPercent, 'g', -1, 64) + "%"
	}
	return w.MinBytes, "--min-free-bytes"
}

// margin is how far above the watermark free space must climb before a short
// filesystem counts as having space again: a tenth of the watermark, so a
// writer resumes with room for more than the batch that put it under.
func margin(need uint64) uint64 { return need / 10 }

// ShortError says a data directory's filesystem is below its watermark.
type ShortError struct {
	Name string // what the directory is, e.g. "admin data dir"
	Dir  string
	Free uint64
	Need uint64
	Flag string // the flag that sets Need
	// FreeInodes and NeedInodes are set when inodes are short (Need and
	// Flag then say nothing).
	FreeInodes, NeedInodes uint64
	Cause                  error // a write that failed for want of space, when that is how the guard learned
}

func (e *ShortError) Error() string {
	msg := fmt.Sprintf("%s %s has %d bytes free (%s), below %s (%d bytes, %s)", e.Name, e.Dir, e.Free,
		humanize.IBytes(e.Free), e.Flag, e.Need, humanize.IBytes(e.Need))
	if e.NeedInodes > 0 {
		msg = fmt.Sprintf("%s %s has %d inodes free, below --min-free-inodes (%d)", e.Name, e.Dir, e.FreeInodes, e.NeedInodes)
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

func (e *ShortError) Unwrap() error { return e.Cause }

// Config of a Guard.
type Config struct {
	Name string // what the directory is, for errors and logs, e.g. "runner data dir"
	Dir  string // need not exist yet: the nearest existing parent is measured
	Watermark
	// Interval is how often Wait looks again while the filesystem is short,
	// and how long a write's ENOSPC (Full) holds the guard short at least.
	// Default 1s.
	Interval time.Duration
	Clock    clock.Clock                     // nil = the real clock
	Stat     func(dir string) (Usage, error) // nil = Statfs
	Logger   *slog.Logger                    // nil = slog.Default()
}

// Guard watches one data directory. A nil Guard is no watermark: never short.
type Guard struct {
	cfg Config

	mu    sync.Mutex
	short *ShortError // nil while there is space
	held  time.Time   // Full keeps the guard short until then whatever statfs says
	last  Status
}

// Status is what the last look at the filesystem found.
type Status struct {
	Usage
	Need  uint64 // free bytes the watermark asks for
	Short bool
	Err   error // the filesystem could not be measured; Short is then the previous answer
}

// New makes the guard of cfg.Dir, or nil when cfg's watermark is zero.
func New(cfg Config) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.enabled() {
		return nil, nil
	}
	if cfg.Dir == "" {
		return nil, errors.New("diskfree: no directory")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Stat == nil {
		cfg.Stat = Statfs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("dir", cfg.Dir)
	return &Guard{cfg: cfg}, nil
}

// Dir is the guarded directory.
func (g *Guard) Dir() string { return g.cfg.Dir }

// stat measures the filesystem of Dir, or of its nearest existing parent
// while Dir is not made yet (a runner's stores are created on first open).
func (g *Guard) stat() (Usage, error) {
	dir := g.cfg.Dir
	for {
		u, err := g.cfg.Stat(dir)
		if !errors.Is(err, fs.ErrNotExist) {
			return u, err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return u, err
		}
		dir = parent
	}
}

// Check measures the filesystem now and updates the guard: short below the
// watermark, not short again until free space reaches the watermark plus
// its margin.
func (g *Guard) Check() Status {
	if g == nil {
		return Status{}
	}
	u, err := g.stat()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.last.Err = err
		return g.last
	}
	need, flag := g.cfg.need(u.Total)
	switch {
	case u.Free < need:
		if g.short == nil {
			g.cfg.Logger.Warn(g.cfg.Name+" short of space: holding writes back", "free_bytes", u.Free,
				"min_free_bytes", need, "watermark", flag, "resume_at_bytes", need+margin(need))
		}
		g.short = &ShortError{Name: g.cfg.Name, Dir: g.cfg.Dir, Free: u.Free, Need: need, Flag: flag}
	case g.cfg.inodesShort(u, g.short != nil):
		if g.short == nil {
			g.cfg.Logger.Warn(g.cfg.Name+" short of inodes: holding writes back", "free_inodes", u.FreeInodes,
				"min_free_inodes", g.cfg.MinInodes, "resume_at_inodes", g.cfg.MinInodes+margin(g.cfg.MinInodes))
		}
		g.short = &ShortError{Name: g.cfg.Name, Dir: g.cfg.Dir, Free: u.Free, Need: need, Flag: flag,
			FreeInodes: u.FreeInodes, NeedInodes: g.cfg.MinInodes}
	case g.short == nil:
	case u.Free >= need+margin(need) && !g.cfg.Clock.Now().Before(g.held):
		g.cfg.Logger.Info(g.cfg.Name+" has space again: writes resume", "free_bytes", u.Free, "min_free_bytes", need)
		g.short = nil
	default:
		// Between the watermark and its margin, or held by Full: still short, with today's figures.
		g.short = &ShortError{Name: g.cfg.Name, Dir: g.cfg.Dir, Free: u.Free, Need: need, Flag: flag, Cause: g.short.Cause}
	}
	g.last = Status{Usage: u, Need: need, Short: g.short != nil}
	return g.last
}

// Err checks the filesystem and returns a *ShortError while it is short.
func (g *Guard) Err() error {
	if g == nil {
		return nil
	}
	g.Check()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.short == nil {
		return nil
	}
	return g.short
}

// Wait returns nil once the filesystem has space, looking again every
// Interval, or ctx's error if it ends first.
func (g *Guard) Wait(ctx context.Context) error {
	for g.Err() != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g.cfg.Clock.After(g.cfg.Interval):
		}
	}
	return nil
}

// Full reports a write that failed for want of space although the guard
// found enough: the filesystem is counted short for at least one Interval,
// and then until it is above the watermark plus margin, so the writer waits
// instead of retrying the write in a loop.
func (g *Guard) Full(cause error) {
	if g == nil {
		return
	}
	u, _ := g.stat()
	g.mu.Lock()
	defer g.mu.Unlock()
	need, flag := g.cfg.need(u.Total)
	g.cfg.Logger.Warn(g.cfg.Name+" out of space on write: holding writes back", "free_bytes", u.Free,
		"min_free_bytes", need, "err", cause)
	g.short = &ShortError{Name: g.cfg.Name, Dir: g.cfg.Dir, Free: u.Free, Need: need, Flag: flag, Cause: cause}
	g.held = g.cfg.Clock.Now().Add(g.cfg.Interval)
	g.last = Status{Usage: u, Need: need, Short: true}
}

// IsNoSpace reports an error of a filesystem out of space (ENOSPC, or EDQUOT
// for a quota), whatever wraps it.
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Collector exports the guard at scrape time, each series labelled dir:
// <prefix>_disk_pressure (1 while short), <prefix>_disk_free_bytes,
// <prefix>_disk_min_free_bytes (the watermark) and <prefix>_disk_free_inodes.
func (g *Guard) Collector(prefix string) prometheus.Collector {
	return &collector{
		g: g,
		pressure: prometheus.NewDesc(prefix+"_disk_pressure",
			"1 while the data directory's filesystem is below its free-space watermark and writes are held back.", []string{"dir"}, nil),
		free: prometheus.NewDesc(prefix+"_disk_free_bytes",
			"Bytes free for the data directory (statfs f_bavail).", []string{"dir"}, nil),
		need: prometheus.NewDesc(prefix+"_disk_min_free_bytes",
			"The free-space watermark of the data directory: --min-free-bytes or --min-free-percent of the filesystem, the larger.", []string{"dir"}, nil),
		inodes: prometheus.NewDesc(prefix+"_disk_free_inodes",
			"Inodes free on the data directory's filesystem (statfs f_ffree; 0 where it counts none).", []string{"dir"}, nil),
	}
}

type collector struct {
	g                            *Guard
	pressure, free, need, inodes *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pressure
	ch <- c.free
	ch <- c.need
	ch <- c.inodes
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.g.Check()
	pressure := 0.0
	if st.Short {
		pressure = 1
	}
	dir := c.g.cfg.Dir
	ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue, pressure, dir)
	ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(st.Free), dir)
	ch <- prometheus.MustNewConstMetric(c.need, prometheus.GaugeValue, float64(st.Need), dir)
	ch <- prometheus.MustNewConstMetric(c.inodes, prometheus.GaugeValue, float64(st.FreeInodes), dir)
}
