package diskfree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeFS is a filesystem whose free space the test sets.
type fakeFS struct {
	mu    sync.Mutex
	u     Usage
	err   error
	asked []string
}

func (f *fakeFS) set(free uint64) {
	f.mu.Lock()
	f.u.Free = free
	f.mu.Unlock()
}

func (f *fakeFS) stat(dir string) (Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, dir)
	return f.u, f.err
}

func newGuard(t *testing.T, w Watermark, f *fakeFS, clk *clocktesting.FakeClock) *Guard {
	t.Helper()
	g, err := New(Config{Name: "test dir", Dir: "/data", Watermark: w, Interval: time.Second, Clock: clk, Stat: f.stat})
	if err != nil || g == nil {
		t.Fatalf("New = %v, %v", g, err)
	}
	return g
}

func TestCheckHysteresis(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	// 100 MiB watermark, resume at 110 MiB.
	steps := []struct {
		free  uint64
		short bool
	}{
		{200 * mib, false},
		{100 * mib, false}, // at the watermark is enough
		{100*mib - 1, true},
		{105 * mib, true}, // above the watermark, below its margin
		{110*mib - 1, true},
		{110 * mib, false},
		{101 * mib, false}, // falling again, still above
		{10 * mib, true},
	}
	f := &fakeFS{u: Usage{Total: 1 << 40}}
	g := newGuard(t, Watermark{MinBytes: 100 * mib}, f, clocktesting.NewFakeClock(time.Now()))
	for i, s := range steps {
		f.set(s.free)
		st := g.Check()
		if st.Short != s.short || st.Free != s.free || st.Need != 100*mib {
			t.Fatalf("step %d: free %d: Check = %+v, want short %v", i, s.free, st, s.short)
		}
		if err := g.Err(); (err != nil) != s.short {
			t.Fatalf("step %d: Err = %v, want short %v", i, err, s.short)
		}
	}
}

func TestWatermarkLargerOfBytesAndPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		w        Watermark
		total    uint64
		want     uint64
		wantFlag string
	}{
		{"bytes larger", Watermark{MinBytes: 1000, MinPercent: 5}, 10_000, 1000, "--min-free-bytes"},
		{"percent larger", Watermark{MinBytes: 1000, MinPercent: 5}, 100_000, 5000, "--min-free-percent 5%"},
		{"percent only", Watermark{MinPercent: 2.5}, 1000, 25, "--min-free-percent 2.5%"},
		{"bytes only", Watermark{MinBytes: 7}, 1000, 7, "--min-free-bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeFS{u: Usage{Total: tc.total, Free: tc.want - 1}}
			g := newGuard(t, tc.w, f, clocktesting.NewFakeClock(time.Now()))
			var short *ShortError
			if err := g.Err(); !errors.As(err, &short) || short.Need != tc.want || short.Flag != tc.wantFlag {
				t.Fatalf("Err = %v, want need %d by %s", err, tc.want, tc.wantFlag)
			}
			want := fmt.Sprintf("test dir /data has %d bytes free", tc.want-1)
			if msg := short.Error(); !strings.HasPrefix(msg, want) || !strings.Contains(msg, "below "+tc.wantFlag) {
				t.Fatalf("message %q, want it to start %q and name %s", msg, want, tc.wantFlag)
			}
			f.set(tc.want + margin(tc.want))
			if err := g.Err(); err != nil {
				t.Fatalf("at the watermark plus margin: %v", err)
			}
		})
	}
}

func TestNewOffAndInvalid(t *testing.T) {
	t.Parallel()
	g, err := New(Config{Dir: "/data"})
	if err != nil || g != nil {
		t.Fatalf("zero watermark: New = %v, %v; want no guard", g, err)
	}
	// A nil guard is never short.
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.Full(syscall.ENOSPC)
	for _, p := range []float64{-1, 100, 250} {
		if _, err := New(Config{Dir: "/data", Watermark: Watermark{MinPercent: p}}); err == nil {
			t.Errorf("--min-free-percent %v accepted", p)
		}
	}
}

func TestWaitUntilSpaceReturns(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Now())
	f := &fakeFS{u: Usage{Total: 1000, Free: 10}}
	g := newGuard(t, Watermark{MinBytes: 100}, f, clk)
	done := make(chan error, 1)
	go func() { done <- g.Wait(context.Background()) }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	f.set(200)
	clk.Step(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	f.set(10)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- g.Wait(ctx) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v", err)
	}
}

// A write's ENOSPC holds the guard short for an Interval even when statfs
// sees room (a quota, a race with another writer), so the writer waits
// instead of retrying at once.
func TestFullHoldsForAnInterval(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Now())
	f := &fakeFS{u: Usage{Total: 1000, Free: 500}}
	g := newGuard(t, Watermark{MinBytes: 100}, f, clk)
	cause := &fs.PathError{Op: "write", Path: "/data/000001.vlog", Err: syscall.ENOSPC}
	g.Full(fmt.Errorf("commit: %w", cause))
	err := g.Err()
	if !IsNoSpace(err) {
		t.Fatalf("Err after Full = %v, want one wrapping ENOSPC", err)
	}
	clk.Step(999 * time.Millisecond)
	if g.Err() == nil {
		t.Fatal("not short within the interval after Full")
	}
	clk.Step(time.Millisecond)
	if err := g.Err(); err != nil {
		t.Fatalf("still short an interval after Full with room: %v", err)
	}
}

func TestStatsNearestExistingParent(t *testing.T) {
	t.Parallel()
	f := &fakeFS{u: Usage{Total: 1000, Free: 500}}
	stat := func(dir string) (Usage, error) {
		u, _ := f.stat(dir)
		if dir != "/" {
			return Usage{}, &fs.PathError{Op: "statfs", Path: dir, Err: syscall.ENOENT}
		}
		return u, nil
	}
	g, err := New(Config{Name: "d", Dir: "/a/b", Watermark: Watermark{MinBytes: 100}, Stat: stat})
	if err != nil {
		t.Fatal(err)
	}
	if st := g.Check(); st.Err != nil || st.Free != 500 {
		t.Fatalf("Check = %+v", st)
	}
	if got := strings.Join(f.asked, " "); got != "/a/b /a /" {
		t.Fatalf("measured %s, want /a/b /a /", got)
	}
}

func TestStatError(t *testing.T) {
	t.Parallel()
	f := &fakeFS{u: Usage{Total: 1000, Free: 10}}
	g := newGuard(t, Watermark{MinBytes: 100}, f, clocktesting.NewFakeClock(time.Now()))
	if !g.Check().Short {
		t.Fatal("not short")
	}
	f.err = syscall.EIO
	// Unmeasurable: the last answer stands rather than writes resuming blind.
	if st := g.Check(); !st.Short || !errors.Is(st.Err, syscall.EIO) {
		t.Fatalf("Check = %+v", st)
	}
}

func TestCollector(t *testing.T) {
	t.Parallel()
	f := &fakeFS{u: Usage{Total: 1000, Free: 10}}
	g := newGuard(t, Watermark{MinBytes: 100}, f, clocktesting.NewFakeClock(time.Now()))
	reg := prometheus.NewRegistry()
	reg.MustRegister(g.Collector("prism_test"))
	want := `
# HELP prism_test_disk_pressure 1 while the data directory's filesystem is below its free-space watermark and writes are held back.
# TYPE prism_test_disk_pressure gauge
prism_test_disk_pressure{dir="/data"} 1
# HELP prism_test_disk_free_bytes Bytes free for the data directory (statfs f_bavail).
# TYPE prism_test_disk_free_bytes gauge
prism_test_disk_free_bytes{dir="/data"} 10
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "prism_test_disk_pressure", "prism_test_disk_free_bytes"); err != nil {
		t.Fatal(err)
	}
	f.set(500)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(strings.NewReplacer(
		`pressure{dir="/data"} 1`, `pressure{dir="/data"} 0`, `bytes{dir="/data"} 10`, `bytes{dir="/data"} 500`).Replace(want)),
		"prism_test_disk_pressure", "prism_test_disk_free_bytes"); err != nil {
		t.Fatal(err)
	}
}

func TestStatfs(t *testing.T) {
	t.Parallel()
	u, err := Statfs(t.TempDir())
	if err != nil || u.Total == 0 || u.Free > u.Total {
		t.Fatalf("Statfs = %+v, %v", u, err)
	}
	if _, err := Statfs(t.TempDir() + "/missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Statfs of a missing dir = %v, want not exist", err)
	}
}

// TestInodeWatermark: free inodes below MinInodes hold writes back however
// many bytes are free, saying so, until a tenth above it again; a
// filesystem that counts no inodes is never short of them.
func TestInodeWatermark(t *testing.T) {
	t.Parallel()
	steps := []struct {
		inodes, free uint64 // Inodes 0: a filesystem that counts none
		short        bool
	}{
		{inodes: 1_000_000, free: 5000},
		{inodes: 1_000_000, free: 1000},
		{inodes: 1_000_000, free: 999, short: true},
		{inodes: 1_000_000, free: 1099, short: true}, // above the watermark, below its margin
		{inodes: 1_000_000, free: 1100},
		{inodes: 1_000_000, free: 10, short: true},
		{inodes: 0, free: 0},
	}
	f := &fakeFS{u: Usage{Total: 1 << 40, Free: 1 << 39}}
	g := newGuard(t, Watermark{MinInodes: 1000}, f, clocktesting.NewFakeClock(time.Now()))
	for i, s := range steps {
		f.mu.Lock()
		f.u.Inodes, f.u.FreeInodes = s.inodes, s.free
		f.mu.Unlock()
		err := g.Err()
		if (err != nil) != s.short {
			t.Fatalf("step %d: %d of %d inodes free: Err = %v, want short %v", i, s.free, s.inodes, err, s.short)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("has %d inodes free, below --min-free-inodes (1000)", s.free)) {
			t.Fatalf("step %d: Err = %q, want it to name the inodes and the flag", i, err)
		}
	}
	if u, err := Statfs(t.TempDir()); err != nil || u.FreeInodes > u.Inodes {
		t.Fatalf("Statfs = %+v, %v", u, err)
	}
}
