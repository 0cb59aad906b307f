package backup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPeriodicWritesFilesAndKeepsTheNewest(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 1, 5)
	dir := t.TempDir()
	other := filepath.Join(dir, "prism-a2-20260101T000000.000Z-1.snap") // another node's: not ours to prune
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := NewPeriodic(PeriodicConfig{Dir: dir, Interval: time.Hour, Retain: 2, FSM: f, Node: fakeNode{"a1", 1}, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for i := range 4 {
		path, err := p.Once(t0.Add(time.Duration(i) * time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{filepath.Base(paths[2]), filepath.Base(paths[3]), filepath.Base(other)} // ReadDir sorts by name
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("dir holds %v, want %v", names, want)
	}
	if _, _, err := ReadFile(paths[3]); err != nil {
		t.Fatalf("the newest file does not verify: %v", err)
	}
	if got := testutil.ToFloat64(p.lastSuccess); got != float64(t0.Add(3*time.Minute).Unix()) {
		t.Fatalf("last success = %v", got)
	}
}

func TestPeriodicCountsFailures(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 1, 2)
	dir := filepath.Join(t.TempDir(), "backups")
	p, err := NewPeriodic(PeriodicConfig{Dir: dir, Interval: 5 * time.Millisecond, Retain: 1, FSM: f, Node: fakeNode{"a1", 1}})
	if err != nil {
		t.Fatal(err)
	}
	// The dir becomes a file: every write fails.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(p.failures) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("failures were not counted")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := testutil.ToFloat64(p.lastSuccess); got != 0 {
		t.Fatalf("last success = %v after only failures", got)
	}
}

func TestNewPeriodicRefusesBadSettings(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 1, 1)
	base := PeriodicConfig{Dir: t.TempDir(), Interval: time.Minute, Retain: 3, FSM: f, Node: fakeNode{"a1", 1}}
	for name, mod := range map[string]func(*PeriodicConfig){
		"no dir":         func(c *PeriodicConfig) { c.Dir = "" },
		"zero interval":  func(c *PeriodicConfig) { c.Interval = 0 },
		"retain nothing": func(c *PeriodicConfig) { c.Retain = 0 },
	} {
		c := base
		mod(&c)
		if _, err := NewPeriodic(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
