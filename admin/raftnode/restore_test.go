package raftnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRestoreRefuses(t *testing.T) {
	t.Parallel()
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "wal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	peers := []Peer{{ID: "a1", Addr: "127.0.0.1:1"}}
	cases := []struct {
		name, dir, id string
		seed          Seed
		want          string
	}{
		{"a non-empty dir", full, "a1", Seed{Index: 5, Term: 2, Peers: peers, FSM: strings.NewReader("x")}, "not empty"},
		{"a node outside the peers", "", "a2", Seed{Index: 5, Term: 2, Peers: peers, FSM: strings.NewReader("x")}, "do not include"},
		{"index zero", "", "a1", Seed{Term: 2, Peers: peers, FSM: strings.NewReader("x")}, "above zero"},
		{"term zero", "", "a1", Seed{Index: 5, Peers: peers, FSM: strings.NewReader("x")}, "above zero"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := c.dir
			if dir == "" {
				dir = filepath.Join(t.TempDir(), "new")
			}
			err := Restore(dir, c.id, c.seed)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
}
