package main

import (
	"testing"

	"github.com/prism-mesh/prism/internal/diskfree"
)

func TestDiskFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bytes   string
		percent float64
		inodes  uint64
		want    diskfree.Watermark
		wantErr bool
	}{
		{bytes: "256MiB", percent: 5, want: diskfree.Watermark{MinBytes: 256 << 20, MinPercent: 5}},
		{bytes: "1GB", want: diskfree.Watermark{MinBytes: 1e9}},
		{bytes: "1GB", inodes: 10000, want: diskfree.Watermark{MinBytes: 1e9, MinInodes: 10000}},
		{bytes: "0", percent: 0},
		{bytes: ""}, // a struct literal without the flags (prism dev): no watermark
		{bytes: "lots", wantErr: true},
		{bytes: "1GiB", percent: 100, wantErr: true},
		{bytes: "1GiB", percent: -1, wantErr: true},
	} {
		f := diskFlags{minFreeBytes: tc.bytes, minFreePercent: tc.percent, minFreeInodes: tc.inodes}
		got, err := f.watermark()
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("--min-free-bytes %q --min-free-percent %v: %+v, %v; want %+v, error %v", tc.bytes, tc.percent, got, err, tc.want, tc.wantErr)
		}
	}
}
