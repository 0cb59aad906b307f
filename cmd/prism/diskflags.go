package main

import (
	"fmt"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/internal/diskfree"
)

// diskFlags are the free-space watermark of a data directory, the same on
// prism runner and prism admin.
type diskFlags struct {
	minFreeBytes   string
	minFreePercent float64
	minFreeInodes  uint64
}

func (f *diskFlags) register(fs *pflag.FlagSet, writes string) {
	fs.StringVar(&f.minFreeBytes, "min-free-bytes", "256MiB",
		"keep at least this much free on --data-dir's filesystem, e.g. 1GiB: below it (or below --min-free-percent, the larger) "+writes+
			", until free space is a tenth above the watermark again (0 with --min-free-percent 0: no watermark)")
	fs.Float64Var(&f.minFreePercent, "min-free-percent", 5, "keep at least this percentage of --data-dir's filesystem free (see --min-free-bytes)")
	fs.Uint64Var(&f.minFreeInodes, "min-free-inodes", 10000, "keep at least this many inodes free on --data-dir's filesystem, as --min-free-bytes keeps bytes (0: not watched; never on filesystems that count no inodes)")
}

func (f *diskFlags) watermark() (diskfree.Watermark, error) {
	var n uint64
	if f.minFreeBytes != "" {
		var err error
		if n, err = humanize.ParseBytes(f.minFreeBytes); err != nil {
			return diskfree.Watermark{}, fmt.Errorf("--min-free-bytes: %w", err)
		}
	}
	w := diskfree.Watermark{MinBytes: n, MinPercent: f.minFreePercent, MinInodes: f.minFreeInodes}
	return w, w.Validate()
}
