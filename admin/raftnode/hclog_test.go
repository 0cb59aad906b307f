package raftnode

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestHclogAdapter(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", "a1")
	term := uint64(0)
	h := newHclog(base, hclog.Info, func() uint64 { return term }).Named("raft").With("k", "v")

	h.Debug("hidden below the level")
	h.Info("before any term", "servers", hclog.Fmt("%d voters", 3))
	term = 7
	h.Warn("stamped", "node", "Node at a1 [Leader]")
	h.Info("raft's own term wins", "term", 6)

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines:\n%s", len(lines), buf.String())
	}
	for i, want := range [][]string{
		{"node=a1", "component=raft", "k=v", `servers="3 voters"`},
		{"level=WARN", "raft_node=\"Node at a1 [Leader]\"", "term=7"},
		{"term=6"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
	if strings.Contains(lines[0], "term=") || strings.Count(lines[2], "term=") != 1 {
		t.Errorf("term stamping wrong:\n%s", buf.String())
	}
}
