package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"
)

// memoryFlags are the runner's memory budget.
type memoryFlags struct {
	budget string
	// cgroupFiles are where the container's memory limit is read: cgroup v2,
	// then v1. Tests point them elsewhere.
	cgroupFiles []string
}

func (f *memoryFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.budget, "memory-budget", "",
		"memory the runner may use, e.g. 1GiB: it sets GOMEMLIMIT (unless that variable is set) and gives half of it to the Badger memtables and caches of the runner's one store, which every mailbox shares; "+
			"over it the runner slows down (GC, smaller caches) rather than fail. Empty: 90% of the container's (cgroup's) memory limit if it has one, else no budget; 0: no budget")
}

// bytes is the budget in bytes, 0 for none.
func (f *memoryFlags) bytes() (int64, error) {
	if f.budget != "" {
		n, err := humanize.ParseBytes(f.budget)
		if err != nil {
			return 0, fmt.Errorf("--memory-budget: %w", err)
		}
		return int64(n), nil
	}
	files := f.cgroupFiles
	if files == nil {
		files = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("--memory-budget: read the cgroup's limit: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		limit, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("--memory-budget: cgroup limit %s: %q: %w", name, s, err)
		}
		// cgroup v1 says "no limit" with a page-rounded maximum.
		if limit >= 1<<60 {
			return 0, nil
		}
		return limit / 10 * 9, nil
	}
	return 0, nil
}

// apply makes the Go runtime's soft memory limit the budget, unless
// GOMEMLIMIT says otherwise.
func (f *memoryFlags) apply(log *slog.Logger, budget int64) {
	if budget <= 0 {
		return
	}
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory budget set; GOMEMLIMIT kept as the environment sets it", "memory_budget", budget, "GOMEMLIMIT", v)
		return
	}
	debug.SetMemoryLimit(budget)
	log.Info("memory budget set, and GOMEMLIMIT to it", "memory_budget", budget)
}
