package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMemoryBudget(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2 := file("v2", "1073741824\n")
	v2max := file("v2max", "max\n")
	v1none := file("v1none", "9223372036854771712\n")
	bad := file("bad", "lots\n")
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name    string
		flag    string
		files   []string
		want    int64
		wantErr bool
	}{
		{"explicit", "1GiB", []string{v2}, 1 << 30, false},
		{"explicit none", "0", []string{v2}, 0, false},
		{"not a size", "much", nil, 0, true},
		{"cgroup v2 limit", "", []string{v2}, 966367638, false},
		{"cgroup v2 without limit", "", []string{v2max}, 0, false},
		{"cgroup v1 without limit", "", []string{missing, v1none}, 0, false},
		{"cgroup v1 limit", "", []string{missing, v2}, 966367638, false},
		{"no cgroup", "", []string{missing}, 0, false},
		{"unreadable limit", "", []string{bad}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := memoryFlags{budget: tc.flag, cgroupFiles: tc.files}
			got, err := f.bytes()
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("bytes() = %d, %v; want %d (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
